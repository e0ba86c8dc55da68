"""The hub: one per process, between the transports and the application.

It implements :class:`~factstream.replication.carrier.CommandSink`, so any
transport can drive it, and routes what arrives:

* REPLICATE -> the :class:`Publisher` answers POSITION for every stream it
  writes, and the connection starts receiving RDATA;
* RDATA / POSITION -> the :class:`Follower`;
* USER_SYNC / CLEAR_USER_SYNC -> the set of syncing users per connection and
  instance (dropped when that connection closes, reported to CLEAR_USER_SYNC
  handlers as if the instance had cleared them), then handlers;
* FEDERATION_ACK, USER_IP, REMOTE_SERVER_UP, LOCK_RELEASED, NEW_ACTIVE_TASK,
  CANCEL_TASK -> handlers registered with :meth:`on`, called as
  ``handler(cmd, conn)`` with the typed command; a forwarding hub (a TCP
  writer, by default) also passes REMOTE_SERVER_UP and LOCK_RELEASED on to
  its other point-to-point connections, as Synapse's master does.

A connection only ever gets commands in its ``may_send`` set (a TCP server
end never sends REPLICATE or USER_SYNC, even from a hub that also follows).

Outgoing application commands go through :meth:`send`: to every connection,
or, while there is none, into a bounded outbox flushed on the next
connection (:class:`OutboxFull` when it overflows, never a silent drop).
On every new connection a reader-side hub sends REPLICATE and re-sends
USER_SYNC for the users it has marked as syncing.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import metrics
from . import _relay
from ..commands import (
    ClearUserSyncsCommand,
    Command,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    UserSyncCommand,
)
from ..errors import FactstreamError
from .carrier import Connection
from .follower import Follower
from .publisher import Publisher

__all__ = ["ReplicationHub", "OutboxFull", "CommandHandler"]

log = logging.getLogger(__name__)

#: Shared commands a forwarding hub passes on to its other connections.
_FORWARDED = frozenset({"REMOTE_SERVER_UP", "LOCK_RELEASED"})

#: ``handler(cmd, conn)``; ``conn`` is None for commands synthesised by the hub.
CommandHandler = Callable[[Command, Connection | None], Any]


class OutboxFull(FactstreamError):
    """Too many commands queued while disconnected; the application should slow down or wait for a connection."""


class ReplicationHub:
    """Routes commands between transports, the publisher, the follower and the application."""

    def __init__(
        self,
        instance_name: str,
        *,
        publisher: Publisher | None = None,
        follower: Follower | None = None,
        max_outbox: int = 10_000,
        replicate_on_connect: bool | None = None,
        forward: bool | None = None,
        relay: bool | None = None,
    ) -> None:
        self.instance_name = instance_name
        self.publisher = publisher
        self.follower = follower
        self.max_outbox = max_outbox
        #: Send REPLICATE on each new connection (default: when following).
        self.replicate_on_connect = follower is not None if replicate_on_connect is None else replicate_on_connect
        #: Pass REMOTE_SERVER_UP / LOCK_RELEASED from one point-to-point connection to the
        #: others (a TCP writer is the hub of a star, as Synapse's master is). Default: when publishing.
        if relay is not None:
            warnings.warn("ReplicationHub(relay=...) is now forward=...", DeprecationWarning, stacklevel=2)
            forward = relay if forward is None else forward
        self.forward = publisher is not None if forward is None else forward
        self._connections: list[Connection] = []
        self._replicating: list[Connection] = []
        self._outbox: deque[Command] = deque()
        self._handlers: dict[str, list[CommandHandler]] = {}
        #: Server side: conn -> instance_id -> {(user_id, device_id)}.
        self._remote_syncs: dict[Connection, dict[str, set[tuple[str, str | None]]]] = {}
        #: Client side: (user_id, device_id) this instance reports as syncing.
        self._local_syncs: dict[tuple[str, str | None], int] = {}
        if publisher is not None:
            # The publisher's relay twin hands its commands to every replicating connection (no Python frame
            # of the hub's per row in a compiled build).
            publisher.add_sink(getattr(publisher, "relay", _relay).Broadcast(self._replicating))

    # ------------------------------------------------------------ application API

    def on(self, command_name: str, handler: CommandHandler) -> None:
        """Call ``handler(cmd, conn)`` for every received ``command_name`` command."""
        self._handlers.setdefault(command_name, []).append(handler)

    @property
    def connections(self) -> list[Connection]:
        """Live connections."""
        return list(self._connections)

    def send(self, cmd: Command) -> None:
        """Send ``cmd`` on every connection, or queue it (bounded) until one exists."""
        if self._connections:
            name = cmd.NAME
            for conn in self._connections:
                if conn.may_send is None or name in conn.may_send:
                    conn.send(cmd)
            return
        if len(self._outbox) >= self.max_outbox:
            raise OutboxFull(
                f"{len(self._outbox)} commands are already queued while disconnected; "
                "wait for the replication connection or raise max_outbox"
            )
        self._outbox.append(cmd)
        metrics.PENDING_OUT.inc()

    @property
    def outbox_size(self) -> int:
        """Commands waiting for a connection."""
        return len(self._outbox)

    def user_sync(self, user_id: str, device_id: str | None, is_syncing: bool, last_sync_ms: int | None = None) -> None:
        """Report that a user started/stopped syncing here (re-sent after every reconnect while syncing)."""
        now = int(time.time() * 1000) if last_sync_ms is None else last_sync_ms
        if is_syncing:
            self._local_syncs[(user_id, device_id)] = now
        else:
            self._local_syncs.pop((user_id, device_id), None)
        self.send(UserSyncCommand(self.instance_name, user_id, device_id, is_syncing, now))

    def clear_user_syncs(self) -> None:
        """Tell the server to forget every syncing user of this instance (e.g. at shutdown)."""
        self._local_syncs.clear()
        self.send(ClearUserSyncsCommand(self.instance_name))

    def syncing_users(self) -> dict[str, set[tuple[str, str | None]]]:
        """Server side: instance_id -> users syncing there, over all live connections."""
        out: dict[str, set[tuple[str, str | None]]] = {}
        for per_conn in self._remote_syncs.values():
            for inst, users in per_conn.items():
                out.setdefault(inst, set()).update(users)
        return out

    # ------------------------------------------------------------ CommandSink

    def connection_made(self, conn: Connection) -> None:
        """A transport link is ready: replicate, re-announce syncing users, flush the outbox."""
        self._connections.append(conn)
        if conn.broadcast and self.publisher is not None:
            self._replicating.append(conn)
        cmds: list[Command] = []
        if self.replicate_on_connect:
            cmds.append(ReplicateCommand())
        for (user_id, device_id), ts in self._local_syncs.items():
            cmds.append(UserSyncCommand(self.instance_name, user_id, device_id, True, ts))
        if self._outbox:
            metrics.PENDING_OUT.dec(len(self._outbox))
            cmds.extend(self._outbox)
            self._outbox.clear()
        allowed = conn.may_send
        if allowed is not None:
            cmds = [c for c in cmds if c.NAME in allowed]
        if cmds:
            conn.send_many(cmds)

    def connection_lost(self, conn: Connection, reason: str) -> None:
        """A link is gone: stop streaming to it, drop its partial batches and its syncing users."""
        if conn in self._connections:
            self._connections.remove(conn)
        if conn in self._replicating:
            self._replicating.remove(conn)
        if self.follower is not None:
            self.follower.connection_lost(conn)
        syncs = self._remote_syncs.pop(conn, None)
        if syncs:
            for inst in syncs:
                self._dispatch(ClearUserSyncsCommand(inst), None)

    def rdata_received(self, conn: Connection, cmds: list[RdataCommand]) -> None:
        """Route a run of RDATA (e.g. all one socket read held): the same as ``command_received`` for each."""
        if self.follower is not None:
            self.follower.on_rdata_many(cmds, conn)

    def command_received(self, conn: Connection, cmd: Command) -> None:
        """Route one command (see module doc)."""
        if type(cmd) is RdataCommand:
            if self.follower is not None:
                self.follower.on_rdata(cmd, conn)
            return
        if type(cmd) is PositionCommand:
            if self.follower is not None:
                self.follower.on_position(cmd, conn)
            return
        if type(cmd) is ReplicateCommand:
            if self.publisher is not None:
                if conn not in self._replicating:
                    self._replicating.append(conn)
                conn.send_many(self.publisher.position_commands())
            return
        if type(cmd) is UserSyncCommand:
            users = self._remote_syncs.setdefault(conn, {}).setdefault(cmd.instance_id, set())
            if cmd.is_syncing:
                users.add((cmd.user_id, cmd.device_id))
            else:
                users.discard((cmd.user_id, cmd.device_id))
        elif type(cmd) is ClearUserSyncsCommand:
            self._remote_syncs.get(conn, {}).pop(cmd.instance_id, None)
        elif self.forward and not conn.broadcast and cmd.NAME in _FORWARDED:
            for other in self._connections:
                if other is not conn and not other.broadcast and (other.may_send is None or cmd.NAME in other.may_send):
                    other.send(cmd)
        self._dispatch(cmd, conn)

    # ------------------------------------------------------------ internals

    def _dispatch(self, cmd: Command, conn: Connection | None) -> None:
        handlers = self._handlers.get(cmd.NAME)
        if not handlers:
            log.debug("no handler for %s", cmd.NAME)
            return
        for handler in handlers:
            try:
                handler(cmd, conn)
            except Exception:
                log.exception("handler %r failed on %r", handler, cmd)
