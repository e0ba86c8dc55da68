"""The carrier contract: the whole interface between the replication core and a transport.

A transport (TCP, Redis pub/sub, an in-memory pipe in tests) does framing,
handshakes, keepalives and reconnection, and nothing about streams or
positions. It talks to the core through two small types:

* the transport implements :class:`Connection` for every live link and
  calls ``send``-side code never; the core calls ``conn.send(cmd)`` /
  ``conn.send_many(cmds)`` (non-blocking, in order) and ``conn.close(reason)``;
* the core implements :class:`CommandSink` (``ReplicationHub`` does) and the
  transport calls ``connection_made(conn)`` once a link is usable (after its
  own handshake), ``command_received(conn, cmd)`` for every command that is
  not transport business (SERVER, NAME and PING stay in the transport; so do
  ERROR replies to bad lines), and ``connection_lost(conn, reason)`` exactly
  once per ``connection_made``. A transport may hand a run of consecutive
  RDATA to ``rdata_received(conn, cmds)`` instead, when the sink has it (the
  hub does): the same as ``command_received`` for each, in one call.

``Connection.broadcast`` is False for point-to-point links (TCP: the writer
streams RDATA to a connection only after it asked REPLICATE) and True for
shared buses (Redis: every RDATA is published for whoever listens).
``Connection.may_send`` names the commands this end may send (None: any); the
hub respects it, so REPLICATE and USER_SYNC never go out of a TCP server end.
``Connection.send_queue`` is an optional shortcut around ``send_many`` (see there).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Protocol

from ..commands import Command

__all__ = ["Connection", "CommandSink"]


class Connection(ABC):
    """One live link to one peer (or to a bus); created and owned by a transport."""

    #: True for a shared bus where RDATA goes out without a REPLICATE first.
    broadcast: bool = False
    #: Human-readable description for logs and metrics ("tcp 127.0.0.1:9092").
    description: str = "connection"
    #: The peer's name once known (TCP: SERVER or NAME), else None.
    peer_name: str | None = None
    #: Command names this end may send (TCP: the server or the client list), None for any.
    #: The hub never hands a connection a command outside this set.
    may_send: frozenset[str] | None = None
    #: While not None, the list that ``send_many(cmds)`` would only extend right now (TCP: the
    #: commands of this loop turn, open, not paused, their write already scheduled), so a caller
    #: sending many small batches (the relay's ``Broadcast``) may extend it itself and skip the
    #: call; the connection replaces it with None before anything else would happen to a send.
    send_queue: list[Command] | None = None

    @abstractmethod
    def send(self, cmd: Command) -> None:
        """Queue ``cmd`` for the peer; never blocks. May close the link if the peer fell behind."""

    def send_many(self, cmds: Iterable[Command]) -> None:
        """Queue several commands in order (transports override this to write once)."""
        for cmd in cmds:
            self.send(cmd)

    @abstractmethod
    def close(self, reason: str | None = None) -> None:
        """Close the link (sending ``ERROR reason`` first when given); idempotent."""

    @property
    @abstractmethod
    def connected(self) -> bool:
        """False once the link is closing or closed."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"


class CommandSink(Protocol):
    """What a transport drives; implemented by :class:`factstream.replication.ReplicationHub`."""

    def connection_made(self, conn: Connection) -> None:
        """``conn`` finished its handshake and can carry commands."""

    def command_received(self, conn: Connection, cmd: Command) -> None:
        """A valid command arrived on ``conn``."""

    def connection_lost(self, conn: Connection, reason: str) -> None:
        """``conn`` is gone (called once per ``connection_made``)."""
