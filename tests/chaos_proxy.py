"""A TCP proxy for chaos tests: forwards in random slices and cuts every link on demand.

Shared by the TCP and the Redis chaos checks; the transports under test see
lines split at arbitrary byte boundaries and connections dying mid-command.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

SLICES = (1, 5, 7, 64, 100, 4096, 65536)


class ChaosProxy:
    """Listens on 127.0.0.1 (``.port``) and forwards to ``upstream_port``."""

    def __init__(self, upstream_port: int, rng: random.Random) -> None:
        self.upstream_port = upstream_port
        self.rng = rng
        self.links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.cuts = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        # Tracked with the pipes: stop() cancels a link still connecting upstream, which then closes its client
        # side (left waiting, it was never resumed once the loop closed, and its socket was collected unclosed).
        accepting = asyncio.current_task()
        assert accepting is not None
        self._tasks.add(accepting)
        try:
            await self._link(cr, cw)
        finally:
            self._tasks.discard(accepting)

    async def _link(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cw.transport.abort()
            return
        except asyncio.CancelledError:
            cw.transport.abort()
            raise
        if self._stopping:  # connected upstream while stopping: drop it
            cw.transport.abort()
            uw.transport.abort()
            return
        self.links.append((cw, uw))
        pipes = {asyncio.create_task(self._pipe(cr, uw)), asyncio.create_task(self._pipe(ur, cw))}
        self._tasks |= pipes
        await asyncio.gather(*pipes, return_exceptions=True)
        self._tasks -= pipes

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(self.rng.choice(SLICES)):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.transport.abort()

    def cut(self) -> None:
        """Abort every live link (both sides); counts as one cut if there was any."""
        for a, b in self.links:
            a.transport.abort()
            b.transport.abort()
        if self.links:
            self.cuts += 1
        self.links.clear()

    async def stop(self) -> None:
        self._stopping = True
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
