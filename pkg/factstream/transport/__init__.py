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
import signal
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
    """Run ``main()`` on a fresh loop (uvloop by default); Ctrl-C cancels it, then raises KeyboardInterrupt.

    The cancellation comes from inside the loop (a loop signal handler), once
    the callback running at that moment has returned. ``asyncio.run`` cancels
    from a Python signal handler, between any two bytecodes: landing inside
    asyncio's copy of a thread's result into the future a task awaits, it
    made asyncio log an InvalidStateError traceback on a plain Ctrl-C. A
    process that ignores SIGINT (SIG_IGN), or a handler ``main`` installs
    itself, is left alone.
    """
    interrupted = False

    async def cancellable() -> T:
        nonlocal interrupted
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            task.cancel()

        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return await main()  # SIGINT ignored or handled by the caller
        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here, or not the main thread
            return await main()
        try:
            return await main()
        except asyncio.CancelledError:
            if not interrupted:
                raise
            return None  # type: ignore[return-value]  # KeyboardInterrupt below, once the loop is closed
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    with asyncio.Runner(loop_factory=lambda: new_event_loop(use_uvloop)) as runner:
        result = runner.run(cancellable())
    if interrupted:
        raise KeyboardInterrupt
    return result
