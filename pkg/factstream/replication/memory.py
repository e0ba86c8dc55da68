"""An in-process carrier: two sinks joined by a pipe (tests, single-process use).

It is the reference implementation of the carrier contract in
:mod:`.carrier`, in forty lines: commands are delivered on the next loop
iteration, in order, optionally through the wire codec (``through_wire``) to
prove they survive encoding.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from .. import wire
from ..commands import Command
from .carrier import CommandSink, Connection

__all__ = ["MemoryPipe", "MemoryConnection"]


class MemoryConnection(Connection):
    """One end of a :class:`MemoryPipe`."""

    def __init__(self, pipe: MemoryPipe, peer_sink: CommandSink, description: str) -> None:
        self._pipe = pipe
        self._peer_sink = peer_sink
        self.description = description
        self.peer: MemoryConnection | None = None
        self._open = True
        self.sent: list[Command] = []

    def send(self, cmd: Command) -> None:
        self.send_many((cmd,))

    def send_many(self, cmds: Iterable[Command]) -> None:
        if not self._open:
            return
        cmds = list(cmds)
        self.sent.extend(cmds) if self._pipe.record else None
        if self._pipe.through_wire:
            cmds = wire.LineDecoder().feed(wire.encode_lines(cmds))
        asyncio.get_running_loop().call_soon(self._deliver, cmds)

    def _deliver(self, cmds: list[Command]) -> None:
        peer = self.peer
        for cmd in cmds:
            if not self._open or peer is None:
                return
            self._peer_sink.command_received(peer, cmd)

    def close(self, reason: str | None = None) -> None:
        self._pipe.close(reason or "closed")

    @property
    def connected(self) -> bool:
        return self._open


class MemoryPipe:
    """Connect ``server`` and ``client`` sinks; ``close()`` cuts both ends like a dropped socket."""

    def __init__(self, server: CommandSink, client: CommandSink, *, through_wire: bool = False, record: bool = False) -> None:
        self.server = server
        self.client = client
        self.through_wire = through_wire
        self.record = record
        # server_end is the server's connection object (talks to the client), and vice versa.
        self.server_end = MemoryConnection(self, client, "memory server->client")
        self.client_end = MemoryConnection(self, server, "memory client->server")
        self.server_end.peer = self.client_end
        self.client_end.peer = self.server_end
        self.open = False

    def connect(self) -> MemoryPipe:
        """Announce the connection to both sinks (server first, like a listener accepting)."""
        self.open = True
        self.server.connection_made(self.server_end)
        self.client.connection_made(self.client_end)
        return self

    def close(self, reason: str = "closed") -> None:
        """Cut the pipe; undelivered commands are lost, as on a dropped socket."""
        if not self.open:
            return
        self.open = False
        self.server_end._open = self.client_end._open = False
        self.server.connection_lost(self.server_end, reason)
        self.client.connection_lost(self.client_end, reason)
