"""How a long-running command (``serve``, ``record``, ``tail``) is asked to stop."""

from __future__ import annotations

import asyncio
import signal

__all__ = ["stop_on_signals"]


def stop_on_signals(stop: asyncio.Event) -> list[int]:
    """Set ``stop`` on SIGTERM or SIGINT; returns the list the signals received are appended to, in order.

    The command winds down through its own code (flushing, closing its files
    and links) instead of being cancelled mid-write, and the list lets it tell
    Ctrl-C (exit 130, as shells expect) from a service manager's SIGTERM (a
    clean stop). Call it from the running loop.
    """
    received: list[int] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: int) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return received
