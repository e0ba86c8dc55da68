"""Replication over Redis: the hub's view of a subscription, and the glue that drives a hub.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ...commands import Command, PositionCommand, RdataCommand, ReplicateCommand
from ...redaction import redact_url as redacted_url
from ...replication.carrier import CommandSink, Connection
from .carrier import RedisCarrier, RedisCarrierStats

logger = logging.getLogger("factstream.transport.redis")


class RedisConnection(Connection):
    """The hub's view of one confirmed subscription (a shared bus: ``broadcast``).

    A new object is made for every (re)subscription, so the hub's
    ``connection_made`` / ``connection_lost`` pair brackets exactly the time
    during which this instance heard everything published.
    """

    broadcast = True

    def __init__(self, carrier: RedisCarrier, generation: int) -> None:
        self._carrier = carrier
        self._open = True
        self.generation = generation
        self.description = f"redis {redacted_url(carrier.url)} #{carrier.server_name} (subscription {generation})"
        self.peer_name = carrier.server_name

    def send(self, cmd: Command) -> None:
        """Publish ``cmd`` (queued, pipelined; refused and counted when the queue is full).

        Nothing is sent once the carrier is closing: ``connection_lost`` follows.
        """
        if self._open and not self._carrier.closed:
            self._carrier.send(cmd)

    def send_many(self, cmds: Iterable[Command]) -> None:
        """Publish several commands in order (nothing once the carrier is closing)."""
        if self._open and not self._carrier.closed:
            self._carrier.send_many(cmds)

    def close(self, reason: str | None = None) -> None:
        """Drop this subscription; the carrier subscribes again (a new connection)."""
        if self._open:
            self._carrier.kick_subscriber(reason or "closed by the replication core")

    @property
    def connected(self) -> bool:
        """True until the subscription is lost or the carrier starts closing."""
        return self._open and not self._carrier.closed


class RedisReplication:
    """Drives a :class:`~factstream.replication.ReplicationHub` over Redis pub/sub.

    The Redis counterpart of ``TcpServer`` + ``TcpClient``: every instance,
    writer or reader, runs one. On each confirmed subscription the hub gets a
    new :class:`RedisConnection` (it then publishes REPLICATE when it follows,
    and its syncing users and outbox), and a writer announces POSITION for
    every stream it publishes; after a publisher reconnect or a queue
    overflow it announces them again. Readers answer a POSITION ahead of them
    by catching up from the stream's update source, as over TCP.

    Pub/sub is a shared bus, so RDATA can arrive on a fresh subscription
    before the writer's POSITION does. Applying it could jump a reader over
    facts published while it was away, so, as Synapse does, RDATA of a
    (stream, writer) is ignored on each new subscription until a POSITION of
    that pair has been seen on it; the POSITION's catch-up covers the rows
    ignored. ``batch`` rows are held here until their closing row and handed
    over together; a POSITION of the same writer discards a held batch (its
    end was lost on the writer's side, which a reader's connection cannot
    see; Synapse also drops pending batches on POSITION), and the catch-up
    fetches the whole fact. Own RDATA/POSITION/LOCK_RELEASED echoes never
    reach the hub.

    Like its carrier it lives once: ``stop()`` (even before ``start()``) is
    final, and ``start()`` or ``wait_connected()`` afterwards raise
    RuntimeError; make a new one to connect again.
    """

    def __init__(
        self,
        hub: CommandSink,
        url: str,
        server_name: str,
        *,
        instance_name: str | None = None,
        subscribe_user_ip: bool = False,
        **carrier_options: Any,
    ) -> None:
        self.hub = hub
        name = instance_name or getattr(hub, "instance_name", None)
        if not name:
            raise ValueError("RedisReplication needs the instance name (hub.instance_name or instance_name=...)")
        self.instance_name: str = name
        self.carrier = RedisCarrier(
            url, server_name,
            instance_name=name,
            subscribe_user_ip=subscribe_user_ip,
            on_command=self._on_command,
            on_subscribed=self._on_subscribed,
            on_unsubscribed=self._on_unsubscribed,
            on_resync=self._on_resync,
            **carrier_options,
        )
        self._conn: RedisConnection | None = None
        self._generation = 0
        self._announced: set[tuple[str, str]] = set()
        self._batches: dict[tuple[str, str], list[Command]] = {}
        #: RDATA ignored on a fresh subscription before its POSITION (repaired by catch-up).
        self.gated_rdata = 0
        #: batches whose closing row never came (dropped at the writer's next POSITION).
        self.truncated_batches = 0

    @property
    def connection(self) -> RedisConnection | None:
        """The live connection (None while not subscribed)."""
        return self._conn

    @property
    def connections(self) -> list[RedisConnection]:
        """The live connection as a list (zero or one), like ``TcpServer.connections``."""
        return [] if self._conn is None else [self._conn]

    @property
    def stats(self) -> RedisCarrierStats:
        """The carrier's counters."""
        return self.carrier.stats

    async def start(self) -> RedisReplication:
        """Connect both Redis connections (in the background; see ``wait_connected``).

        Raises RuntimeError when already started or stopped (make a new one).
        """
        if self.carrier.closed:
            raise RuntimeError("RedisReplication is stopped: make a new one to connect again")
        await self.carrier.start()
        return self

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the subscription is confirmed and the hub has its connection.

        Raises TimeoutError after ``timeout``, RuntimeError once stopped (also while waiting).
        """
        if self.carrier.closed:
            raise RuntimeError("RedisReplication is stopped: it will not connect again; make a new one")
        await self.carrier.wait_subscribed(timeout)

    async def stop(self, flush_timeout: float = 1.0) -> None:
        """Publish what is queued (for up to ``flush_timeout`` s), then disconnect; final, safe to repeat."""
        await self.carrier.close(flush_timeout)
        self._on_unsubscribed("stopped")

    async def __aenter__(self) -> RedisReplication:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # carrier hooks

    def _publisher(self) -> Any:
        return getattr(self.hub, "publisher", None)

    def _on_subscribed(self) -> None:
        self._generation += 1
        self._announced = set()
        self._batches = {}
        conn = self._conn = RedisConnection(self.carrier, self._generation)
        self.hub.connection_made(conn)  # REPLICATE (when following), user syncs, outbox
        publisher = self._publisher()
        if publisher is not None:
            # Nobody asks a bus member for REPLICATE after *its* reconnect: tell everyone where we are.
            conn.send_many(publisher.position_commands())

    def _on_unsubscribed(self, reason: str) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn._open = False  # noqa: SLF001 - our own class
            self.hub.connection_lost(conn, reason)

    def _on_resync(self) -> None:
        # Our recent commands may not have reached anyone. A REPLICATE among
        # them would leave this reader's RDATA gated until each writer happens
        # to announce again, so ask again; writers re-announce their positions.
        conn = self._conn
        if conn is None:
            return  # the next subscription does both anyway
        if getattr(self.hub, "replicate_on_connect", False):
            conn.send(ReplicateCommand())
        publisher = self._publisher()
        if publisher is not None:
            conn.send_many(publisher.position_commands())

    def _on_command(self, cmd: Command) -> None:
        conn = self._conn
        if conn is None:
            return
        kind = type(cmd)
        if kind is RdataCommand:
            key = (cmd.stream_name, cmd.instance_name)  # type: ignore[attr-defined]
            if key not in self._announced:
                self.gated_rdata += 1
                return
            if cmd.token is None:  # type: ignore[attr-defined]
                self._batches.setdefault(key, []).append(cmd)
                return
            held = self._batches.pop(key, None)
            if held:
                for row_cmd in held:
                    self.hub.command_received(conn, row_cmd)
        elif kind is PositionCommand:
            key = (cmd.stream_name, cmd.instance_name)  # type: ignore[attr-defined]
            self._announced.add(key)
            if self._batches.pop(key, None):
                # A writer's batch is contiguous in what it publishes and its POSITION only ever
                # follows a complete batch, so this batch lost its end on the writer's side
                # (publisher connection or queue); the POSITION's catch-up fetches the whole fact.
                self.truncated_batches += 1
                logger.info("%s/%s: batch cut short by a lost publication; catch-up will fetch it", *key)
        self.hub.command_received(conn, cmd)
