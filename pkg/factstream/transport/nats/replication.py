"""Replication over JetStream: the hub's view of the log, and the glue that drives a hub.

Over 600 lines on purpose: :class:`NatsReplication` is one object because its
writer half (publishing pages with acknowledgements, heartbeats, backfill) and
its reader half (resume by sequence, fallback to table catch-up) share one
connection, one set of per-(stream, writer) keys and one reconnect story;
split, that state would have to be passed between modules.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ... import wire
from ..._checks import seconds, whole
from ...backoff import backoff_delay
from ...commands import Command, PositionCommand, RdataCommand
from ...errors import ProtocolError
from ...redaction import redact_url
from ...replication import _relay
from ...replication.carrier import CommandSink, Connection
from .client import (
    StreamConfigError,
    _Api,
    _can_write_frames,
    _fast_subscribe,
    _parse_headers,
    _prev_of,
    _raw_headers,
    _servers,
    connect_nats,
)
from .consumer import _LogConsumer
from .inspect import behind_by_subject
from .layout import _NS, MSG_ID, JetStreamLayout, KeyStats, NatsStats, Retention, _RateLimitedLog
from .pages import Page, _page, build_pages, decode_page, fact_units, header_chain, page_end, page_id, page_top, parse_keys

logger = logging.getLogger("factstream.transport.nats")

class NatsConnection(Connection):
    """The hub's view of the JetStream log (a shared bus: ``broadcast``).

    It stays up across NATS reconnects: what the hub sends is queued and
    published (and retried) until JetStream acknowledges it.
    """

    broadcast = True

    def __init__(self, replication: NatsReplication) -> None:
        self._repl = replication
        self._open = True
        self.description = f"nats {redact_url(replication.url)} stream {replication.layout.stream}"
        self.peer_name = replication.layout.deployment

    def send(self, cmd: Command) -> None:
        """Publish ``cmd`` (facts to JetStream, other commands on the control subject)."""
        if self._open:
            self._repl._send((cmd,))  # noqa: SLF001 - our own pair of classes

    def send_many(self, cmds: Iterable[Command]) -> None:
        """Publish several commands in order."""
        if self._open:
            self._repl._send(cmds)  # noqa: SLF001

    def close(self, reason: str | None = None) -> None:
        """Ask for the reader's consumer to be recreated (the log itself cannot be closed)."""
        if self._open and self._repl._consumer is not None:  # noqa: SLF001
            self._repl._consumer.reset(reason or "closed by the replication core")  # noqa: SLF001

    @property
    def connected(self) -> bool:
        return self._open


# ---------------------------------------------------------------------- writer-side state


class _Out:
    """One message on its way to JetStream."""

    __slots__ = ("order", "part", "subject", "payload", "headers", "key", "end", "done", "sent_at", "first_sent",
                 "core", "rows")

    def __init__(self, order: int, subject: str, payload: bytes, headers: bytes | None,
                 key: tuple[str, str] | None, end: int | None, core: bool = False, rows: int = 1,
                 part: tuple[int, ...] = ()) -> None:
        self.order = order
        self.part = part  # place among the pieces of a message JetStream refused as too large (same order)
        self.subject = subject
        self.payload = payload
        self.headers = headers
        self.key = key
        self.end = end
        self.done = False
        self.sent_at = 0.0
        self.first_sent = 0.0  # when it was first sent (re-sends move sent_at, not this)
        self.core = core
        self.rows = rows  # wire lines in the message


@dataclass
class _WriterKey:
    stream: str
    writer: str
    subject: str
    prev: int | None = None  # last token handed to a page (open or queued)
    batch: list[RdataCommand] = field(default_factory=list)  # rows of a fact whose closing row has not come
    page: list[Command] = field(default_factory=list)  # whole facts and POSITIONs of the page being filled
    page_prev: int | None = None  # the token before the page being filled (its Fs-Prev)
    acked: int | None = None
    last_seq: int = 0
    outstanding: deque[_Out] = field(default_factory=deque)
    repairing: bool = True
    repair_target: int = 0
    held: list[Command] = field(default_factory=list)
    last_enqueued: float = 0.0
    fresh: tuple[int, str] | None = None  # (fact token, suffix of its pages' ids) after a cut batch


@dataclass
class _ReaderKey:
    stream: str
    writer: str
    last_token: int | None = None
    last_seq: int = 0
    batch: list[RdataCommand] = field(default_factory=list)
    batch_token: int | None = None
    broken: bool = False
    lag: float | None = None
    fallbacks: int = 0


_REPLICATIONS: weakref.WeakSet[NatsReplication] = weakref.WeakSet()


class NatsReplication:
    """Drives a :class:`~factstream.replication.ReplicationHub` over NATS JetStream (see module doc).

    The JetStream counterpart of ``RedisReplication``: every instance, writer
    or reader, runs one with the deployment's ``server_name``. A reader's
    follower should hold its own positions (``Follower(positions=...)``) when
    it restarts; it then resumes from the log with no database query.
    ``retention`` applies when this instance creates the stream.

    Options that cannot work (a timeout or heartbeat <= 0, ``page_limit`` < 1,
    ``backfill`` < 0, a fractional count) raise ValueError or TypeError here;
    a stream configuration JetStream refuses is logged as an error and raised
    by :meth:`wait_connected` (:class:`StreamConfigError`).
    """

    def __init__(
        self,
        hub: CommandSink,
        url: str,
        server_name: str,
        *,
        instance_name: str | None = None,
        retention: Retention | None = None,
        stream: str | None = None,
        subject_prefix: str | None = None,
        max_in_flight: int = 1000,
        max_pending: int = 200_000,
        ack_timeout: float = 5.0,
        heartbeat: float = 5.0,
        consumer_heartbeat: float = 1.0,
        connect_timeout: float = 5.0,
        api_timeout: float = 5.0,
        page_limit: int = 1000,
        backfill: int = 10_000,
        page_rows: int = 1000,
        page_bytes: int = 256 * 1024,
    ) -> None:
        # Options that cannot work are refused now, not met later as a spin, a hang or a retry loop.
        max_in_flight = whole("max_in_flight", max_in_flight)
        max_pending = whole("max_pending", max_pending)
        page_rows = whole("page_rows", page_rows)
        page_bytes = whole("page_bytes", page_bytes, 1024)
        page_limit = whole("page_limit", page_limit)
        backfill = whole("backfill", backfill, 0)
        ack_timeout = seconds("ack_timeout", ack_timeout)
        heartbeat = seconds("heartbeat", heartbeat)
        consumer_heartbeat = seconds("consumer_heartbeat", consumer_heartbeat)
        if consumer_heartbeat < 0.1:  # JetStream refuses a shorter idle heartbeat (err_code 10083)
            raise ValueError(f"consumer_heartbeat must be at least 0.1 seconds (JetStream's shortest idle "
                             f"heartbeat), got {consumer_heartbeat:g}")
        connect_timeout = seconds("connect_timeout", connect_timeout)
        api_timeout = seconds("api_timeout", api_timeout)
        if retention is not None and not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention, got {type(retention).__name__} {retention!r}")
        self.hub = hub
        name = instance_name or getattr(hub, "instance_name", None)
        if not name:
            raise ValueError("NatsReplication needs the instance name (hub.instance_name or instance_name=...)")
        self.instance_name: str = name
        _servers(url)  # validate now
        self.url = url
        self.layout = JetStreamLayout.for_server(server_name, stream=stream, prefix=subject_prefix)
        self.retention = retention or Retention()
        self.retention.stream_config(self.layout)  # validate now
        self.max_in_flight = max_in_flight
        self.max_pending = max_pending
        self.ack_timeout = ack_timeout
        self.heartbeat = heartbeat
        self.consumer_heartbeat = consumer_heartbeat
        self.connect_timeout = connect_timeout
        self.api_timeout = api_timeout
        self.page_limit = page_limit
        #: A message holds at most this many lines and bytes (and never more than the server's max payload).
        self.page_rows = page_rows
        self.page_bytes = page_bytes
        self._page_max = page_bytes
        self._stream_max_msg = -1  # the stream's max_msg_size (-1: none), read when the stream is found
        self._down_since: float | None = None  # monotonic time the NATS connection was lost (None: up)
        self._down_report = 0.0  # seconds of outage at which the next "still unreachable" warning is due
        self._last_error = ""  # nats-py's last error (password masked), said in those warnings
        #: A writer whose subject is empty publishes its history first when it has at most this many rows.
        self.backfill = backfill
        self.stats = NatsStats()
        self.nc: Any = None
        self._api: _Api | None = None
        self._conn: NatsConnection | None = None
        self._consumer: _LogConsumer | None = None
        self._wkeys: dict[tuple[str, str], _WriterKey] = {}
        self._rkeys: dict[tuple[str, str], _ReaderKey] = {}
        self._queue: deque[_Out] = deque()
        self._retry: list[_Out] = []
        self._in_flight: dict[int, _Out] = {}
        self._order = 0
        self._n = 0
        self._max_acked = 0
        self._last_ack = 0.0
        self._link = 0  # bumped on every disconnect: a flush in progress stops there
        self._frames = False  # write HPUB frames directly (nats-py's buffer) instead of nc.publish
        self._ack_prefix = ""
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._connected = asyncio.Event()
        self._ready = asyncio.Event()
        self._repairs: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False  # stop() was called: the object cannot start or connect again
        self._failure: StreamConfigError | None = None  # why it gave up (JetStream refused the stream)
        self._halted = asyncio.Event()  # set by stop() and by giving up: wakes wait_connected
        self._retry_delay = 0.0
        self._invalid_log = _RateLimitedLog()
        self._error_log = _RateLimitedLog()
        self._rdata_received = getattr(hub, "rdata_received", None)  # the hub's call taking a run of RDATA
        self._filling: dict[tuple[str, str], _WriterKey] = {}  # keys with a page being filled
        self._queued_rows = 0  # lines in self._queue (what max_pending bounds)
        self._behind: dict[tuple[str, str], int] = {}  # reader: pending per (stream, writer), last refresh
        self._behind_at = 0.0  # monotonic time of that refresh (0: never)
        self._refreshing: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        _REPLICATIONS.add(self)

    # ------------------------------------------------------------------ lifecycle

    @property
    def connection(self) -> NatsConnection | None:
        """The hub's connection (None before the first NATS connection and after ``stop``)."""
        return self._conn

    @property
    def connections(self) -> list[NatsConnection]:
        """The connection as a list (zero or one), like ``TcpServer.connections``."""
        return [] if self._conn is None else [self._conn]

    @property
    def connected(self) -> bool:
        """True while the NATS connection is up."""
        return self.nc is not None and bool(self.nc.is_connected)

    def _publisher(self) -> Any:
        return getattr(self.hub, "publisher", None)

    def _follower(self) -> Any:
        return getattr(self.hub, "follower", None)

    async def start(self) -> NatsReplication:
        """Connect (in the background; see ``wait_connected``); once only, and never after ``stop``."""
        if self._closing:
            raise RuntimeError("NatsReplication stopped: it cannot start again; make a new one")
        if self._tasks:
            raise RuntimeError("NatsReplication already started")
        logger.info("replicating over NATS JetStream %s as %s (stream %s)", redact_url(self.url),
                    self.instance_name, self.layout.stream)
        self._loop = asyncio.get_running_loop()
        self._tasks.append(self._loop.create_task(self._main(), name="factstream-nats"))
        return self

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the stream is there, the hub has its connection and (reader) the consumer runs.

        Raises instead of waiting for what will never come: RuntimeError once
        ``stop`` was called (before or during the wait), and
        :class:`StreamConfigError` when JetStream refused to create the
        stream; TimeoutError after ``timeout`` seconds.
        """
        self._raise_if_halted()
        async with asyncio.timeout(timeout):
            await self._unless_halted(self._ready.wait())
            consumer = self._consumer
            if consumer is not None:
                await self._unless_halted(consumer.wait_ready(None))

    def _raise_if_halted(self) -> None:
        if self._closing:
            raise RuntimeError("NatsReplication stopped: it will not connect again; make a new one")
        if self._failure is not None:
            raise self._failure

    async def _unless_halted(self, waiting: Any) -> None:
        """Await ``waiting`` unless ``stop`` or giving up comes first (then raise why)."""
        task = asyncio.ensure_future(waiting)
        halted = asyncio.ensure_future(self._halted.wait())
        try:
            await asyncio.wait((task, halted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            halted.cancel()
        self._raise_if_halted()
        task.result()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything handed over so far is acknowledged by JetStream."""
        async with asyncio.timeout(timeout):
            while True:
                if self._repairs:
                    await asyncio.gather(*self._repairs.values(), return_exceptions=True)
                    continue
                if not (self._queue or self._retry or self._in_flight or self._filling
                        or any(k.batch for k in self._wkeys.values())):
                    return
                self._idle.clear()
                self._wake.set()
                await self._idle.wait()

    async def stop(self, flush_timeout: float = 2.0) -> None:
        """Publish what is queued (for up to ``flush_timeout`` s), then disconnect."""
        if self._ready.is_set():
            try:
                await self.flush(flush_timeout)
            except TimeoutError:
                logger.warning("NATS: %d messages not acknowledged at shutdown (the next start re-publishes them)",
                               len(self._queue) + len(self._retry) + len(self._in_flight))
        self._closing = True
        self._halted.set()
        _REPLICATIONS.discard(self)
        for task in self._repairs.values():
            task.cancel()
        if self._consumer is not None:
            await self._consumer.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass
        if self.nc is not None:
            try:
                await self.nc.close()
            except Exception:  # noqa: BLE001
                pass
        conn, self._conn = self._conn, None
        if conn is not None:
            conn._open = False  # noqa: SLF001
            self.hub.connection_lost(conn, "stopped")

    async def __aenter__(self) -> NatsReplication:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _main(self) -> None:
        attempt = 0
        while self.nc is None:
            try:
                self.nc = await connect_nats(
                    self.url, name=f"factstream-{self.instance_name}", timeout=self.connect_timeout,
                    disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                    error_cb=self._on_error,
                )
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - retry forever, like the other carriers
                delay = backoff_delay(attempt, 0.1, 5.0)
                attempt += 1
                logger.warning("cannot connect to NATS at %s (%s); retrying in %.2fs", redact_url(self.url),
                               err or type(err).__name__, delay)
                await asyncio.sleep(delay)
        self.stats.connects += 1
        self._connected.set()
        self._api = _Api(self.nc, self.layout, self.api_timeout)
        attempt = 0
        while True:
            try:
                info = await self._api.ensure_stream(self.retention)
                self._stream_max_msg = int((info.get("config") or {}).get("max_msg_size", -1) or -1)
                break
            except asyncio.CancelledError:
                raise
            except StreamConfigError as err:
                if err.permanent:
                    # Asking again gets the same answer: say what is wrong and let wait_connected raise it.
                    logger.error("%s. NatsReplication %s gives up: nothing is published or read until it is made "
                                 "again with a configuration JetStream accepts", err, self.instance_name)
                    self._failure = err
                    self._halted.set()
                    return
                # The server's state is in the way (another stream, a limit): fixable there while we ask again.
                delay = min(10.0, 0.5 * 2 ** min(attempt, 5))
                attempt += 1
                logger.error("%s; asking again in %.1fs", err, delay)
                await asyncio.sleep(delay)
            except Exception as err:  # noqa: BLE001 - JetStream not ready yet (server down, cluster forming)
                delay = min(2.0, 0.05 * 2 ** min(attempt, 6))
                attempt += 1
                logger.warning("JetStream stream %s not available yet (%s); retrying in %.2fs",
                               self.layout.stream, err, delay)
                await asyncio.sleep(delay)
        self._ack_prefix = self.nc.new_inbox() + "."
        await _fast_subscribe(self.nc, self._ack_prefix + "*", self._on_ack_fast, self._on_ack)
        self._frames = _can_write_frames(self.nc)
        # Room for the headers (ids carry the stream and writer names) inside the server's max payload,
        # and inside the stream's own max_msg_size (an operator's setting: a page above it is refused).
        self._page_max = max(1024, min(self.page_bytes, int(self.nc.max_payload) - 4096))
        if self._stream_max_msg > 0:
            room = min(4096, self._stream_max_msg // 4)
            self._page_max = max(64, min(self._page_max, self._stream_max_msg - room))
        await self.nc.subscribe(self.layout.control_subject, cb=self._on_control)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._flusher(), name="factstream-nats-flusher"))
        self._tasks.append(loop.create_task(self._ticker(), name="factstream-nats-ticker"))
        publisher = self._publisher()
        if publisher is not None:
            for stream in publisher.streams:
                self._writer_key(stream, self.instance_name)  # starts its repair
        if self._follower() is not None:
            self._consumer = _LogConsumer(self._api, self._on_log, self.stats, heartbeat=self.consumer_heartbeat,
                                          start_seq=self._initial_start,
                                          description=f"factstream reader {self.instance_name}")
        conn = self._conn = NatsConnection(self)
        self.hub.connection_made(conn)
        if self._consumer is not None:
            self._consumer.start()
        self._ready.set()

    async def _on_error(self, err: Exception) -> None:
        """nats-py's errors (failed reconnect attempts among them): kept for the "still unreachable" warning."""
        self._last_error = redact_url(str(err) or type(err).__name__)
        logger.debug("NATS: %s", self._last_error)

    def _report_outage(self, now: float) -> None:
        """Say, at growing intervals (5 s, 10 s, 20 s, ... then every minute), that NATS is still unreachable.

        nats-py reconnects silently: without this a writer or reader riding
        out a long outage says one line when it starts and nothing after it.
        """
        since = self._down_since
        if since is None or self._closing or now - since < self._down_report:
            return
        self._down_report = min(2 * self._down_report, self._down_report + 60.0)
        logger.warning("NATS at %s still unreachable after %.0fs (reconnecting; last error: %s); %d lines queued, "
                       "%d messages awaiting acknowledgement%s", redact_url(self.url), now - since,
                       self._last_error or "none", self._queued_rows, len(self._in_flight) + len(self._retry),
                       "; this reader resumes from the log when it is back" if self._follower() is not None else "")

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._down_report = 5.0
        self._link += 1
        # nats-py would write its buffered publishes first thing on the next link, ahead of the
        # re-sends of older unacknowledged ones: that would store facts out of order. They are all
        # in flight here, and go out again in order after the reconnect.
        if isinstance(getattr(self.nc, "_pending", None), list) and hasattr(self.nc, "_pending_data_size"):
            self.nc._pending = []  # noqa: SLF001
            self.nc._pending_data_size = 0  # noqa: SLF001
        self.stats.disconnects += 1
        logger.warning("NATS connection to %s lost; reconnecting", redact_url(self.url))

    async def _on_reconnected(self) -> None:
        self.stats.connects += 1
        since, self._down_since = self._down_since, None
        if since is not None and time.monotonic() - since >= 5.0:
            logger.warning("NATS back after %.0fs unreachable", time.monotonic() - since)
        logger.info("NATS reconnected to %s", redact_url(self.nc.connected_url.geturl() if self.nc.connected_url
                                                          else self.url))
        # What was in flight may never have reached JetStream: send it again (same ids).
        self._requeue_in_flight()
        if self._consumer is not None:
            self._consumer.reset("NATS reconnected")

    # ------------------------------------------------------------------ writer side

    def acked_positions(self) -> dict[str, int | None]:
        """Stream -> the token up to which JetStream acknowledged this writer's facts."""
        return {k.stream: k.acked for k in self._wkeys.values() if k.writer == self.instance_name}

    def _writer_key(self, stream: str, writer: str) -> _WriterKey:
        key = (stream, writer)
        st = self._wkeys.get(key)
        if st is None:
            st = self._wkeys[key] = _WriterKey(stream, writer, self.layout.log_subject(stream, writer))
            self._start_repair(st)
        return st

    def _start_repair(self, st: _WriterKey) -> None:
        """Re-read what JetStream holds for ``st`` and re-publish what it misses, before anything new."""
        publisher = self._publisher()
        st.repairing = True
        st.batch = []
        positions = publisher.positions() if publisher is not None else {}
        st.repair_target = positions.get(st.stream, 0) if st.writer == self.instance_name else 0
        key = (st.stream, st.writer)
        if key not in self._repairs:
            self._repairs[key] = asyncio.get_running_loop().create_task(self._repair(st))

    async def _repair(self, st: _WriterKey) -> None:
        key = (st.stream, st.writer)
        delay = 0.05
        try:
            while True:
                try:
                    await self._repair_once(st)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - NATS or the source down: retry
                    logger.warning("%s/%s: cannot check JetStream against the source yet (%s); retrying in %.2fs",
                                   st.stream, st.writer, err, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            self._repairs.pop(key, None)
        held, st.held = st.held, []
        st.repairing = False
        target = st.repair_target
        self._encode(st, _after(held, target))
        self._wake.set()

    async def _repair_once(self, st: _WriterKey) -> None:
        while self._api is None or not self.nc.is_connected:
            await asyncio.sleep(0.05)
        self.stats.lookups += 1
        last, cmds = await self._api.last_page(st.subject)
        target = st.repair_target
        if last is None:
            js_last = None
        else:
            prev = _prev_of(last.headers)
            js_last = page_end(cmds, prev) if cmds else prev
            if js_last is None:
                js_last = 0
            st.last_seq = max(st.last_seq, last.seq)
            tail = cmds[-1] if cmds else None
            if type(tail) is RdataCommand and tail.token is None:
                # The log ends inside a fact: its rows are in JetStream's duplicate window, so the
                # re-published fact gets fresh ids (readers drop the cut rows when row 0 comes again).
                _, cut = parse_keys(last.headers.get(MSG_ID, "").encode())
                if cut is not None:
                    st.fresh = (cut[0], f"/r{last.seq}")
        publisher = self._publisher()
        emitter = getattr(publisher, "_streams", {}).get(st.stream) if publisher is not None else None
        if js_last is None:
            if emitter is not None and target > 0 and self.backfill > 0:
                # A young stream: put its whole history in the log, so that no reader needs the table.
                updates, upto, limited = await emitter.source.get_updates(st.writer, 0, target, self.backfill)
                if not limited and upto >= target:
                    st.prev = 0
                    self.stats.repaired_rows += len(updates)
                    repub = publisher.relay.StreamEmitter(st.stream, st.writer, emitter.source, 0, None, [],
                                                          self.page_limit)
                    self._encode(st, repub.commands(updates, target))
                    return
            # Nothing in the log: start it at the writer's position (readers behind it use the table).
            st.prev = target
            self._encode(st, (PositionCommand(st.stream, st.writer, target, target),))
            return
        st.prev = js_last
        st.acked = js_last
        if js_last > target:
            logger.warning("%s/%s: JetStream already holds facts up to %d, past this writer's position %d "
                           "(a restored database, or two writers with one name?)", st.stream, st.writer,
                           js_last, target)
            return
        if js_last == target:
            return
        if emitter is None:
            return
        self.stats.repairs += 1
        logger.info("%s/%s: JetStream holds facts up to %d, the writer is at %d; re-publishing the difference "
                    "from the source", st.stream, st.writer, js_last, target)
        repub = publisher.relay.StreamEmitter(st.stream, st.writer, emitter.source, js_last, None, [], self.page_limit)
        pos = js_last
        delay = 0.05
        while pos < target:
            updates, upto, limited = await emitter.source.get_updates(st.writer, pos, target, self.page_limit)
            if limited and (upto <= pos or not any(t > pos for t, _ in updates)):
                # A page "cut" with no fact after pos: publishing it would tell readers to jump to upto
                # over facts nobody sent them. A broken source: say so and ask again, as the follower does.
                logger.error("%s/%s: update source returned a limited page without progress after %d (%d rows, "
                             "up to %d); retrying in %.2fs", st.stream, st.writer, pos, len(updates), upto, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.05
            cmds = repub.commands(updates, upto)
            self.stats.repaired_rows += len(updates)
            self._encode(st, cmds)
            self._wake.set()
            if upto <= pos:
                break
            pos = upto
            while self._queued_rows > self.max_pending // 2:
                await asyncio.sleep(0.01)

    def _send(self, cmds: Iterable[Command]) -> None:
        inst = self.instance_name
        wkeys = self._wkeys
        for cmd in cmds:
            kind = type(cmd)
            if kind is RdataCommand or kind is PositionCommand:
                st = wkeys.get((cmd.stream_name, cmd.instance_name))  # type: ignore[attr-defined]
                if st is None:
                    st = self._writer_key(cmd.stream_name, cmd.instance_name)  # type: ignore[attr-defined]
                if st.repairing:
                    if st.writer != inst or _command_token(cmd) > st.repair_target or (
                            kind is RdataCommand and cmd.token is None):  # type: ignore[attr-defined]
                        st.held.append(cmd)
                    continue
                if kind is RdataCommand and not st.batch and cmd.token is not None and st.page:  # type: ignore[attr-defined]
                    # The common case: one more single-row fact on a page being filled.
                    st.page.append(cmd)
                    st.prev = cmd.token  # type: ignore[attr-defined]
                    if len(st.page) >= self.page_rows:
                        self._close_page(st)
                    continue
                self._encode(st, (cmd,))
            elif cmd.NAME == "REPLICATE":
                continue  # the log answers it: readers replay from JetStream
            else:
                self._close_pages()  # what the hub sent before it goes out before it
                self._order += 1
                self._queue.append(_Out(self._order, self.layout.control_subject, wire.encode(cmd), None, None, None,
                                        core=True))
                self._queued_rows += 1
        if self._queued_rows > self.max_pending:
            self._overflow()
        self._wake.set()

    def _encode(self, st: _WriterKey, cmds: Iterable[Command]) -> None:
        """Add commands of one (stream, writer) to its page being filled (whole facts only)."""
        for cmd in cmds:
            if type(cmd) is RdataCommand:
                if cmd.token is None:
                    st.batch.append(cmd)
                    continue
                if not st.page:
                    self._open_page(st)
                if st.batch:
                    st.page.extend(st.batch)
                    st.batch = []
                st.page.append(cmd)
                st.prev = cmd.token
            elif type(cmd) is PositionCommand:
                if not st.page:
                    self._open_page(st)
                st.page.append(cmd)
                st.prev = cmd.new_token if st.prev is None else max(st.prev, cmd.new_token)
            else:
                continue
            if len(st.page) >= self.page_rows:
                self._close_page(st)

    def _open_page(self, st: _WriterKey) -> None:
        st.page_prev = st.prev
        self._filling[(st.stream, st.writer)] = st

    def _close_page(self, st: _WriterKey) -> None:
        """Turn the page being filled into messages (ids, Fs-Prev chain) at the end of the queue."""
        self._filling.pop((st.stream, st.writer), None)
        cmds, st.page = st.page, []
        if not cmds:
            return
        key = (st.stream, st.writer)
        pages, too_large = build_pages(st.stream, st.writer, cmds, st.page_prev, self._page_max, st.fresh)
        if too_large:
            self.stats.too_large += len(too_large)
            logger.error("%s: %d rows larger than a message may be (%d bytes) not published; readers will fetch "
                         "their facts from the table", st.subject, len(too_large), self._page_max)
        for page in pages:
            self._order += 1
            out = _Out(self._order, st.subject, page.payload,
                       _raw_headers(page.msg_id, "" if page.prev is None else str(page.prev)), key, page.end,
                       rows=page.lines)
            self._queue.append(out)
            st.outstanding.append(out)
            self._queued_rows += page.lines
            self.stats.rows_queued += page.lines
        if st.fresh is not None and st.prev is not None and st.prev >= st.fresh[0]:
            st.fresh = None
        st.page_prev = st.prev
        st.last_enqueued = time.monotonic()
        self.stats.queued = self._order

    def _close_pages(self) -> None:
        for st in list(self._filling.values()):
            self._close_page(st)

    def _enqueue_position(self, st: _WriterKey, prev: int, new: int, msg_id: str) -> None:
        """A heartbeat ``POSITION prev new`` as its own message (its id stays the same while nothing changes)."""
        self._close_page(st)
        self._order += 1
        chain = "" if st.prev is None else str(st.prev)
        out = _Out(self._order, st.subject, wire.encode(PositionCommand(st.stream, st.writer, prev, new)) + b"\n",
                   _raw_headers(msg_id, chain), (st.stream, st.writer), new)
        self._queue.append(out)
        self._queued_rows += 1
        st.outstanding.append(out)
        st.prev = new if st.prev is None else max(st.prev, new)
        st.page_prev = st.prev
        st.last_enqueued = time.monotonic()

    def _overflow(self) -> None:
        """Too much queued (JetStream unreachable for long): drop the queue, repair from the source later."""
        dropped = sum(o.rows for o in self._queue if not o.core)
        self.stats.dropped += dropped
        self._queue.clear()
        self._queued_rows = 0
        self._filling.clear()
        logger.error("NATS: more than %d lines queued; dropped %d and will re-publish them from the source "
                     "once JetStream answers", self.max_pending, dropped)
        for st in self._wkeys.values():
            st.outstanding = deque(o for o in st.outstanding if o.order in self._in_flight_orders())
            st.held = []
            st.page = []
            self._start_repair(st)

    def _in_flight_orders(self) -> set[int]:
        return {o.order for o in self._in_flight.values()} | {o.order for o in self._retry}

    def _requeue_in_flight(self) -> None:
        if self._in_flight:
            self._retry.extend(self._in_flight.values())
            self.stats.retried += len(self._in_flight)
            self._in_flight.clear()
        self._wake.set()

    async def _flusher(self) -> None:
        nc = self.nc
        prefix = self._ack_prefix
        window = self.max_in_flight
        while True:
            if self._filling:
                self._close_pages()
            if not (self._queue or self._retry):
                if not self._in_flight and not self._repairs:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if not nc.is_connected:
                await asyncio.sleep(0.05)
                continue
            if self._retry_delay:
                await asyncio.sleep(self._retry_delay)
                self._retry_delay = 0.0
            if len(self._in_flight) >= window:
                self._space.clear()
                await self._space.wait()
                continue
            sent = 0
            if self._retry:
                self._retry.sort(key=lambda o: (o.order, o.part))
                batch, self._retry = self._retry, []
                pending: Iterator[_Out] = iter(batch)
                source: deque[_Out] | None = None
            else:
                pending = iter(())
                source = self._queue
            link = self._link
            frames: list[bytes] = []
            try:
                now = time.monotonic()
                for out in pending:
                    if link != self._link or not nc.is_connected:
                        self._retry.append(out)
                        continue
                    sent += await self._publish_one(nc, prefix, out, now, frames)
                while source and len(self._in_flight) < window and sent < 8 << 20:
                    if link != self._link or not nc.is_connected:
                        break
                    out = source.popleft()
                    self._queued_rows -= out.rows
                    sent += await self._publish_one(nc, prefix, out, now, frames)
                if frames:
                    # One write of many ready-made HPUB frames (what nats-py would build one by one).
                    await nc._send_command(b"".join(frames))  # noqa: SLF001
                    await nc._flush_pending()  # noqa: SLF001
            except Exception as err:  # noqa: BLE001 - buffer full while reconnecting, connection closed
                self._error_log.warning("NATS publish failed (%s); retrying", err)
                await asyncio.sleep(0.05)
            if sent:
                await asyncio.sleep(0)

    async def _publish_one(self, nc: Any, prefix: str, out: _Out, now: float, frames: list[bytes]) -> int:
        """Send ``out`` (appending its frame to ``frames`` when frames can be written directly); bytes sent."""
        if out.core:
            await nc.publish(out.subject, out.payload)
            self.stats.control_sent += 1
            return len(out.payload) + 1
        hdr = out.headers or b"NATS/1.0\r\n\r\n"
        if len(out.payload) + len(hdr) > nc.max_payload:
            self.stats.too_large += out.rows
            logger.error("%s: a %d-byte message is larger than the server's max payload (%d); not published, "
                         "readers will fetch its facts from the table", out.subject, len(out.payload), nc.max_payload)
            self._acked(out, 0, False)
            return 0
        self._n += 1
        n = self._n
        out.sent_at = now
        if not out.first_sent:
            out.first_sent = now
        if not self._in_flight:
            self._last_ack = now  # the stall clock starts with the first unacknowledged publish
        self._in_flight[n] = out
        payload = out.payload
        if self._frames:
            frames.append(b"HPUB %s %s%d %d %d\r\n%s%s\r\n" % (
                out.subject.encode(), prefix.encode(), n, len(hdr), len(hdr) + len(payload), hdr, payload))
            return len(hdr) + len(payload) + 1
        try:
            await nc.publish(out.subject, payload, reply=f"{prefix}{n}", headers=_parse_headers(hdr))
        except Exception:
            self._in_flight.pop(n, None)
            self._retry.append(out)
            raise
        return len(hdr) + len(payload) + 1

    async def _on_ack(self, msg: Any) -> None:
        hdr = msg.headers
        status = hdr.get("Status") if hdr else None
        self._ack(msg.subject.encode(), msg.data, status)

    def _on_ack_fast(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self._ack(subject, data, None)

    def _ack(self, subject: bytes, data: bytes, status: str | None) -> None:
        try:
            n = int(subject[subject.rfind(b".") + 1:])
        except ValueError:
            return
        self._last_ack = time.monotonic()
        if n > self._max_acked:
            self._max_acked = n
        out = self._in_flight.pop(n, None)
        if out is None:
            return  # acknowledged after it was re-sent: the re-send will be acknowledged too
        if data and b'"err_code":10054' in data:
            self.stats.publish_errors += 1
            self._refused_as_too_large(out)  # the same bytes would be refused forever: publish them in pieces
        elif not data or status == "503" or b'"error"' in data:
            self.stats.publish_errors += 1
            self._error_log.warning("JetStream refused a publish on %s (%s); retrying", out.subject,
                                    (data or b"no responders").decode("utf-8", "replace")[:200])
            self._retry.append(out)
            self.stats.retried += 1
            self._retry_delay = 0.1
            self._wake.set()
        else:
            i = data.find(b'"seq":')
            seq = 0
            if i >= 0:
                j = i + 6
                k = j
                while k < len(data) and 48 <= data[k] <= 57:
                    k += 1
                seq = int(data[j:k]) if k > j else 0
            self._acked(out, seq, b'"duplicate":true' in data)
        if len(self._in_flight) < self.max_in_flight:
            self._space.set()
        if not (self._in_flight or self._queue or self._retry or self._repairs):
            self._idle.set()

    def _acked(self, out: _Out, seq: int, duplicate: bool) -> None:
        self.stats.acked += 1
        if duplicate:
            self.stats.duplicates += 1
        out.done = True
        st = self._wkeys.get(out.key) if out.key is not None else None
        if st is None:
            return
        if seq > st.last_seq:
            st.last_seq = seq
        dq = st.outstanding
        while dq and dq[0].done:
            first = dq.popleft()
            if first.end is not None and (st.acked is None or first.end > st.acked):
                st.acked = first.end

    def _refused_as_too_large(self, out: _Out) -> None:
        """JetStream refused ``out`` as larger than the stream's max_msg_size: cut it into smaller messages.

        Retrying the same bytes would be refused forever (the writer stuck,
        its acknowledged position frozen). The page limit is halved until
        messages fit; the pieces keep the message's place in the publish
        order, ids and chain. A single line refused alone fits in no message:
        counted as ``too_large``, logged, and readers take its fact from the table.
        """
        st = self._wkeys.get(out.key) if out.key is not None else None
        lines = out.payload.splitlines(keepends=True)
        if st is None or len(lines) <= 1:
            self.stats.too_large += out.rows
            logger.error("%s: JetStream refuses a %d-byte message of one line (larger than the stream's "
                         "max_msg_size); not published, readers will fetch its fact from the table",
                         out.subject, len(out.payload))
            self._acked(out, 0, False)
            return
        limit = max(64, min(self._page_max, len(out.payload) // 2))
        if limit < self._page_max:
            logger.error("JetStream stream %s refuses %d-byte messages (its max_msg_size is smaller than this "
                         "writer's pages); pages are now at most %d bytes", self.layout.stream,
                         len(out.payload) + len(out.headers or b""), limit)
            self._page_max = limit
        pieces = _split_page(st.stream, st.writer, out, lines, limit)
        outs = [_Out(out.order, out.subject, p.payload, _raw_headers(p.msg_id, "" if p.prev is None else str(p.prev)),
                     out.key, p.end, rows=p.lines, part=(*out.part, i)) for i, p in enumerate(pieces)]
        dq = st.outstanding
        try:
            i = dq.index(out)
        except ValueError:
            i = len(dq)
        else:
            del dq[i]
        for piece in reversed(outs):
            dq.insert(i, piece)
        self.stats.queued += len(outs) - 1
        self.stats.retried += len(outs)
        self._retry.extend(outs)
        self._wake.set()

    def _late(self, now: float) -> list[_Out]:
        """In-flight publishes to send again: older than ``ack_timeout`` and either passed over by the
        acknowledgements of later ones (lost on the way, e.g. to a stream leader that just died) or with no
        acknowledgement at all for ``ack_timeout`` (a stalled server). A busy but answering server is
        never flooded with re-sends: its acknowledgements keep coming, in order."""
        stalled = now - self._last_ack > self.ack_timeout
        cutoff = now - self.ack_timeout
        late: list[int] = []
        for n, out in self._in_flight.items():  # in publish order
            if out.sent_at > cutoff or not (stalled or n < self._max_acked):
                break
            late.append(n)
        return [self._in_flight.pop(n) for n in late]

    async def _ticker(self) -> None:
        """Re-send publishes not acknowledged in time; heartbeat POSITION of idle writers."""
        period = max(0.05, min(self.ack_timeout, self.heartbeat) / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            self._report_outage(now)
            if self._in_flight and self.nc.is_connected:
                late = self._late(now)
                if late:
                    self._error_log.warning("NATS: %d publishes not acknowledged within %.1fs; sending them again",
                                            len(late), self.ack_timeout)
                    self._retry.extend(late)
                    self.stats.retried += len(late)
                    self._wake.set()
            publisher = self._publisher()
            if publisher is None:
                continue
            positions = publisher.positions()
            for st in self._wkeys.values():
                if st.writer != self.instance_name or st.repairing or st.batch:
                    continue
                if now - st.last_enqueued >= self.heartbeat:
                    p = max(positions.get(st.stream, 0), st.prev or 0)
                    st.prev = p
                    self._enqueue_position(st, p, p, msg_id=f"{st.stream}:{st.writer}:{p}:hb")
                    self._wake.set()

    # ------------------------------------------------------------------ reader side

    async def _on_control(self, msg: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            cmd = wire.parse_line(msg.data)
        except ProtocolError as err:
            self.stats.invalid += 1
            self._invalid_log.warning("invalid message on %s: %s", msg.subject, err)
            return
        if type(cmd) in (RdataCommand, PositionCommand):
            self.stats.invalid += 1
            self._invalid_log.warning("%s on the control subject %s ignored: facts travel on the log subjects",
                                      cmd.NAME, msg.subject)
            return
        self.stats.control_received += 1
        self.hub.command_received(conn, cmd)

    def _reader_key(self, stream: str, writer: str) -> _ReaderKey:
        st = self._rkeys.get((stream, writer))
        if st is None:
            st = self._rkeys[(stream, writer)] = _ReaderKey(stream, writer)
            follower = self._follower()
            pos = follower.position(stream, writer) if follower is not None else None
            if pos is None and follower is not None:
                pos = follower.start_position
            st.last_token = pos
        return st

    async def _initial_start(self) -> int:
        """The first sequence this process needs: per (stream, writer), the message after its position."""
        api = self._api
        assert api is not None
        follower = self._follower()
        subjects, first_seq, last_seq = await api.subjects()
        starts: list[int] = []
        for subject in subjects:
            self.stats.lookups += 1
            last, cmds = await api.last_page(subject)
            if last is None:
                continue
            cmd = cmds[0] if cmds else None
            if type(cmd) not in (RdataCommand, PositionCommand):
                continue
            stream, writer = cmd.stream_name, cmd.instance_name  # type: ignore[union-attr]
            if writer == self.instance_name or (follower.streams is not None and stream not in follower.streams):
                continue
            st = self._reader_key(stream, writer)
            pos = follower.position(stream, writer)
            if pos is None and follower.start_position is None:
                # Live only: start after what the log holds, at the writer's position.
                token = page_end(cmds, _prev_of(last.headers)) or 0
                st.last_token = token
                st.last_seq = last.seq
                conn = self._conn
                if conn is not None:
                    self.hub.command_received(conn, PositionCommand(stream, writer, token, token))
                starts.append(last.seq + 1)
                continue
            if pos is None:
                pos = follower.start_position
            st.last_token = pos
            seq = await self._first_after(subject, pos, first_seq, last.seq)
            if seq is None:
                st.last_seq = last.seq
                starts.append(last.seq + 1)
            else:
                st.last_seq = seq - 1
                starts.append(seq)
        start = min(starts) if starts else last_seq + 1
        logger.info("JetStream %s: resuming at sequence %d (%d subjects, %d lookups, no database query)",
                    self.layout.stream, start, len(subjects), self.stats.lookups)
        return max(start, 1)

    async def _first_after(self, subject: str, position: int, lo: int, hi: int) -> int | None:
        """Sequence of ``subject``'s first message reaching above ``position`` (binary search; tokens grow with
        sequence)."""
        api = self._api
        assert api is not None
        answer: int | None = None
        lo = max(lo, 1)
        while lo <= hi:
            mid = (lo + hi) // 2
            self.stats.lookups += 1
            m = await api.get(seq=mid, next_by_subject=subject)
            if m is None or m.seq > hi:
                hi = mid - 1
                continue
            try:
                cmds = decode_page(m.data)
            except ProtocolError:
                lo = m.seq + 1
                continue
            _, last_key = parse_keys(m.headers.get(MSG_ID, "").encode())
            if page_top(cmds, last_key, _prev_of(m.headers)) > position:
                answer = m.seq
                hi = mid - 1
            else:
                lo = m.seq + 1
        return answer

    def _on_log(self, subject: str, data: bytes, headers: bytes | None, seq: int, ts: int,
                pending: int) -> None:
        """One log message (a page), in stream order: check the chain, join cut facts, hand facts to the hub."""
        conn = self._conn
        if conn is None:
            return
        self.stats.received += 1
        try:
            cmds = decode_page(data)  # the codec, in one call
        except ProtocolError as err:
            self.stats.invalid += 1
            self._invalid_log.warning("invalid message %d on %s skipped: %s", seq, subject, err)
            return
        if not cmds:
            self.stats.invalid += 1
            self._invalid_log.warning("empty message %d on %s skipped", seq, subject)
            return
        first = cmds[0]
        if type(first) is not RdataCommand and type(first) is not PositionCommand:
            self.stats.invalid += 1
            self._invalid_log.warning("message %d on %s is %s, not a fact; skipped", seq, subject, first.NAME)
            return
        stream, writer = first.stream_name, first.instance_name
        end, has_position = _relay.same_source(cmds)  # the relay's loop: no Python step per row
        if end < len(cmds):
            self.stats.invalid += 1
            self._invalid_log.warning("message %d on %s mixes %s of %s/%s with %s; skipped", seq, subject,
                                      first.NAME, stream, writer, cmds[end].NAME)
            return
        self.stats.rows_received += len(cmds)
        if writer == self.instance_name:
            self.stats.echoes += 1
            return
        follower = self._follower()
        if follower.streams is not None and stream not in follower.streams:
            return
        st = self._rkeys.get((stream, writer)) or self._reader_key(stream, writer)
        if seq <= st.last_seq:
            self.stats.skipped += 1
            return
        st.last_seq = seq
        st.lag = max(0.0, time.time() - ts / _NS)
        prev, first_key, last_key = header_chain(headers)
        if prev is not None and st.last_token is not None and prev > st.last_token:
            self._fallback(st, conn, st.last_token, prev)
        # Where the page starts: inside a fact whose first rows came in earlier messages (held in st.batch)?
        lead_broken = False
        if type(first) is RdataCommand:
            index = first_key[1] if first_key is not None else None
            if st.batch:
                if index is None or (first_key is not None and first_key[0] == st.batch_token
                                     and index == len(st.batch)):
                    cmds = [*st.batch, *cmds]
                    lead_broken = st.broken
                else:
                    self.stats.broken_batches += 1  # a batch restarted (re-published after a writer crash)
                    lead_broken = index != 0
            else:
                lead_broken = index is not None and index != 0
        elif st.batch:
            self.stats.broken_batches += 1  # rows whose closing row never came
        st.batch = []
        # Where it ends: inside a fact whose last rows come in the next message?
        tail = cmds[-1]
        if type(tail) is RdataCommand and tail.token is None:
            k = len(cmds) - 1
            while k > 0 and type(cmds[k - 1]) is RdataCommand and cmds[k - 1].token is None:  # type: ignore[attr-defined]
                k -= 1
            st.batch = cmds[k:]  # type: ignore[assignment]
            st.batch_token = last_key[0] if last_key is not None else None
            st.broken = (lead_broken and k == 0) or (
                last_key is not None and last_key[1] is not None and last_key[1] != len(st.batch) - 1)
            cmds = cmds[:k]
            if not cmds:
                return
        if lead_broken:
            # The page begins with the last rows of a fact whose first rows are not in the log: take it from the table.
            j = 0
            while type(cmds[j]) is RdataCommand and cmds[j].token is None and j < len(cmds) - 1:  # type: ignore[attr-defined]
                j += 1
            self.stats.broken_batches += 1
            cut = cmds[j]
            if type(cut) is RdataCommand and cut.token is not None:
                if st.last_token is None or cut.token > st.last_token:
                    self._fallback(st, conn, st.last_token, cut.token)
                cmds = cmds[j + 1:]
            else:
                cmds = cmds[j:]
            if not cmds:
                return
        last = st.last_token
        if not has_position:
            low = next(c.token for c in cmds if c.token is not None)  # type: ignore[attr-defined]
            if last is None or low > last:
                # The common case: whole facts, all new, in token order: one call hands them all to the hub.
                st.last_token = cmds[-1].token  # type: ignore[attr-defined]
                self._hand(conn, cmds)
                return
        self._deliver_page(st, conn, cmds)

    def _deliver_page(self, st: _ReaderKey, conn: NatsConnection, cmds: list[Command]) -> None:
        """Hand a page with POSITIONs or facts already delivered to the hub, line by line in order."""
        last = st.last_token
        keep: list[Command] = []
        start = 0
        for i, cmd in enumerate(cmds):
            if type(cmd) is PositionCommand:
                if start < i:
                    self.stats.broken_batches += 1  # batch rows cut by a POSITION: their fact is not here
                if keep:
                    self._hand(conn, keep)
                    keep = []
                if last is None or cmd.new_token > last:
                    self.hub.command_received(conn, cmd)
                    last = cmd.new_token
                else:
                    # Read again (a consumer restarted behind what it delivered): the follower would
                    # take it for the writer going backwards and deliver everything after it again.
                    self.stats.skipped += 1
                start = i + 1
                continue
            token = cmd.token  # type: ignore[attr-defined]
            if token is None:
                continue
            if last is None or token > last:
                keep.extend(cmds[start:i + 1])
                last = token
            else:
                self.stats.skipped += i + 1 - start
            start = i + 1
        st.last_token = last
        if keep:
            self._hand(conn, keep)

    def _hand(self, conn: NatsConnection, cmds: list[Command]) -> None:
        """Hand a run of RDATA (whole facts of one page) to the hub, in one call when it takes runs."""
        many = self._rdata_received
        if many is not None:
            many(conn, cmds)
        else:
            for row in cmds:
                self.hub.command_received(conn, row)

    def _fallback(self, st: _ReaderKey, conn: NatsConnection, pos: int | None, upto: int) -> None:
        st.fallbacks += 1
        self.stats.fallbacks += 1
        logger.warning("%s/%s: JetStream no longer holds facts (%s, %d] (retention, or a re-published message out "
                       "of order); catching up from the stream's table", st.stream, st.writer, pos, upto)
        self.hub.command_received(conn, PositionCommand(st.stream, st.writer, upto, upto))
        st.last_token = upto
        st.batch = []

    # ------------------------------------------------------------------ status

    def key_stats(self) -> list[KeyStats]:
        """Per (stream, writer): the writer side (what this instance publishes) and the reader side."""
        out: list[KeyStats] = []
        for st in self._wkeys.values():
            out.append(KeyStats("writer", st.stream, st.writer, st.last_seq, st.acked, len(st.outstanding)))
        total = self._consumer.pending if self._consumer is not None else 0
        for rt in self._rkeys.values():
            pending = self._behind.get((rt.stream, rt.writer), 0) if total else 0
            out.append(KeyStats("reader", rt.stream, rt.writer, rt.last_seq, rt.last_token, pending, rt.lag,
                                rt.fallbacks))
        return out

    async def refresh_pending(self) -> dict[tuple[str, str], int]:
        """Ask JetStream how many messages it holds for this reader, per (stream, writer) it follows.

        The consumer only knows the total; JetStream counts each subject's
        messages after the last delivered sequence (one small request per
        subject, none when nothing is pending). :meth:`key_stats` reports the
        last answer; a metrics scrape asks again at most every 5 seconds.
        """
        consumer, api = self._consumer, self._api
        if consumer is None or api is None:
            return {}
        subjects = {self.layout.log_subject(rt.stream, rt.writer): (rt.stream, rt.writer)
                    for rt in list(self._rkeys.values())}
        rows = await behind_by_subject(api, consumer.last_seq, subjects, consumer.pending)
        self._behind = {(r["stream"], r["writer"]): r["pending"] for r in rows}
        self._behind_at = time.monotonic()
        return dict(self._behind)

    def _refresh_soon(self, every: float = 5.0) -> None:
        """From any thread (a metrics scrape): refresh the per-key pending counts if they are older than ``every``."""
        loop = self._loop
        if loop is None or loop.is_closed() or time.monotonic() - self._behind_at < every:
            return
        if self._consumer is None or not self._consumer.pending:
            return

        def spawn() -> None:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = loop.create_task(self._refresh_quietly(), name="factstream-nats-pending")

        loop.call_soon_threadsafe(spawn)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh_pending()
        except Exception as err:  # noqa: BLE001 - a metric refresh must never hurt the reader
            self._behind_at = time.monotonic()
            self._error_log.warning("cannot count pending messages per (stream, writer): %s", err)

    def unacknowledged_for(self) -> float:
        """Seconds the oldest message still unacknowledged has waited since it was first sent (0: none waits).

        ``connected`` stays true while a cluster without a stream leader (no
        quorum) acknowledges nothing; this grows instead, for a status line or
        an alert to show the stall.
        """
        waiting = [o.first_sent for o in self._retry if o.first_sent]
        first = next(iter(self._in_flight.values()), None)
        if first is not None and first.first_sent:
            waiting.append(first.first_sent)
        return max(0.0, time.monotonic() - min(waiting)) if waiting else 0.0

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary: stream, connection, counters and :meth:`key_stats`."""
        return {
            "carrier": "nats",
            "url": redact_url(self.url),
            "stream": self.layout.stream,
            "connected": self.connected,
            "unacknowledged_for": round(self.unacknowledged_for(), 3),
            "counters": self.stats.as_dict(),
            "keys": [asdict(k) for k in self.key_stats()],
        }


def _after(cmds: Sequence[Command], target: int) -> list[Command]:
    """The commands of facts above ``target`` (batch rows go with their closing row)."""
    out: list[Command] = []
    batch: list[Command] = []
    for cmd in cmds:
        if type(cmd) is RdataCommand and cmd.token is None:
            batch.append(cmd)
            continue
        if _command_token(cmd) > target:
            out.extend(batch)
            out.append(cmd)
        batch = []
    out.extend(batch)
    return out


def _split_page(stream: str, writer: str, out: _Out, lines: list[bytes], limit: int) -> list[Page]:
    """The lines of a refused message as pages of about ``limit`` bytes, with the ids and chain it had.

    A message is whole facts (and POSITIONs), or part of one fact cut by
    rows; whole facts are kept together where they fit, a fact or fragment
    larger than ``limit`` is cut by rows (a line never is).
    """
    prev, first_key, _ = header_chain(out.headers)
    m = re.search(r"/r\d+$", _parse_headers(out.headers or b"").get(MSG_ID, ""))
    suffix = m[0] if m else ""
    cmds = decode_page(out.payload)
    head, tail = cmds[0], cmds[-1]
    fragment = (type(tail) is RdataCommand and tail.token is None) or (
        type(head) is RdataCommand and first_key is not None and first_key[1] not in (None, 0))
    pieces: list[Page] = []

    def cut(rows: list[bytes], token: int, start: int, end: int | None) -> None:
        """Rows ``start``... of fact ``token`` as pages of at most ``limit`` bytes (``end``: on the last)."""
        i = 0
        while i < len(rows):
            j, size = i, 0
            while j < len(rows) and (j == i or size + len(rows[j]) <= limit):
                size += len(rows[j])
                j += 1
            pieces.append(Page(b"".join(rows[i:j]), page_id(stream, writer, f"{token}:{start + i}",
                                                            f"{token}:{start + j - 1}", j - i, suffix),
                               prev, end if j == len(rows) else None, j - i))
            i = j

    if fragment:
        assert first_key is not None
        cut(lines, first_key[0], first_key[1] or 0, out.end)
        return pieces
    # A re-published fact with fresh ids is the first fact of its message: its pieces keep the suffix.
    fresh = (next((c.token for c in cmds if type(c) is RdataCommand and c.token is not None), 0), suffix) \
        if suffix else None
    chunk: list[Command] = []
    size = 0
    k = 0
    for unit in fact_units(cmds):
        encoded = lines[k:k + len(unit)]
        k += len(unit)
        n = sum(len(x) for x in encoded)
        if chunk and size + n > limit:
            page = _page(stream, writer, chunk, None, prev, fresh)
            pieces.append(page)
            prev = page.end
            chunk, size = [], 0
        if n <= limit or len(unit) == 1:
            chunk.extend(unit)
            size += n
            continue
        token = page_end(unit, prev) or 0
        cut(encoded, token, 0, token)
        prev = token
    if chunk:
        pieces.append(_page(stream, writer, chunk, None, prev, fresh))
    return pieces


def _command_token(cmd: Command) -> int:
    if type(cmd) is PositionCommand:
        return cmd.new_token
    token = getattr(cmd, "token", None)
    return -1 if token is None else int(token)


# ---------------------------------------------------------------------- metrics


class _NatsCollector:
    """``factstream_nats_*`` metrics read from the live carriers at scrape time."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        seq = GaugeMetricFamily("factstream_nats_sequence", "JetStream sequence per (stream, writer): last "
                                "acknowledged (writer) or delivered (reader)", labels=["side", "stream", "writer"])
        pending = GaugeMetricFamily("factstream_nats_pending", "Messages of this (stream, writer) JetStream still "
                                    "holds for this reader (reader; counted at most every 5 s) or not yet "
                                    "acknowledged (writer)", labels=["side", "stream", "writer"])
        lag = GaugeMetricFamily("factstream_nats_lag_seconds", "Age of the last message delivered to this reader",
                                labels=["stream", "writer"])
        fallbacks = CounterMetricFamily("factstream_nats_fallbacks", "Catch-ups from the table because the log "
                                        "no longer held the facts", labels=["stream", "writer"])
        events = CounterMetricFamily("factstream_nats_events", "NatsReplication counters", labels=["event"])
        totals: dict[str, int] = {}
        seqs: dict[tuple[str, str, str], int] = {}
        pend: dict[tuple[str, str, str], int] = {}
        lags: dict[tuple[str, str], float] = {}
        falls: dict[tuple[str, str], int] = {}
        for repl in list(_REPLICATIONS):  # several instances in one process: one sample per label set
            repl._refresh_soon()
            for k in repl.key_stats():
                key = (k.side, k.stream, k.writer)
                seqs[key] = max(k.sequence, seqs.get(key, 0))
                pend[key] = max(k.pending, pend.get(key, 0))
                if k.side == "reader":
                    if k.lag_seconds is not None:
                        lags[(k.stream, k.writer)] = max(k.lag_seconds, lags.get((k.stream, k.writer), 0.0))
                    falls[(k.stream, k.writer)] = falls.get((k.stream, k.writer), 0) + k.fallbacks
            for name, n in repl.stats.as_dict().items():
                totals[name] = totals.get(name, 0) + n
        for key, v in seqs.items():
            seq.add_metric(list(key), v)
        for key, v in pend.items():
            pending.add_metric(list(key), v)
        for key2, f in lags.items():
            lag.add_metric(list(key2), f)
        for key2, c in falls.items():
            fallbacks.add_metric(list(key2), c)
        for name, n in sorted(totals.items()):
            events.add_metric([name], n)
        yield from (seq, pending, lag, fallbacks, events)


REGISTRY.register(_NatsCollector())
