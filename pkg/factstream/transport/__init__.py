"""Carriers: move replication commands between processes, nothing more.

* :mod:`.tcp`: Synapse's TCP protocol (``TcpServer`` / ``TcpClient``; one
  link is :mod:`.tcp_connection`, and :mod:`.fetch` is the side channel that
  serves missed facts of in-memory streams).
* :mod:`.redis`: Redis pub/sub, Synapse's layout.
* :mod:`.nats`: NATS JetStream, a stored log readers replay from.

Each drives a :class:`~factstream.replication.ReplicationHub` through the
carrier contract in :mod:`factstream.replication.carrier`.
:func:`new_event_loop` / :func:`run` pick uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["new_event_loop", "run", "loop_name"]

T = TypeVar("T")


def new_event_loop(use_uvloop: bool = True) -> asyncio.AbstractEventLoop:
    """A uvloop loop when available and wanted, else the stdlib one."""
    if use_uvloop:
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """"uvloop" or "asyncio", for logs and benchmark labels."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Callable[[], Coroutine[Any, Any, T]], *, use_uvloop: bool = True) -> T:
    """Run ``main()`` on a fresh loop (uvloop by default)."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(use_uvloop)) as runner:
        return runner.run(main())
