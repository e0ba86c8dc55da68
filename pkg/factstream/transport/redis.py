"""Replication over Redis pub/sub: the carrier.

Synapse's Redis layout: every instance (writers and readers alike) holds two
connections to Redis, one subscribed and one publishing. Each command is one
pub/sub message holding one line without its newline, published on the
channel named after the deployment (``<server_name>``), except USER_IP, which
goes to ``<server_name>/USER_IP`` (subscribing to that one is opt-in).

The carrier turns messages into commands and commands into messages, nothing
more: it never looks at positions. What it adds around that:

* both connections reconnect forever, independently, with capped exponential
  backoff and jitter; a silent dead connection is found by PING health checks;
* ``on_subscribed`` fires every time the subscription is confirmed by Redis
  (the owner publishes REPLICATE and its positions from there, so no answer
  can arrive before anyone listens);
* outbound commands go into a bounded queue that is flushed with pipelining:
  everything queued in one event-loop tick goes out in one round trip, in
  order. Past the bound, new commands are refused and counted, loudly;
  ``on_resync`` then fires once the queue has drained, and after every
  publisher reconnect, so the owner can announce its positions and let
  readers repair the gap from the database (pub/sub is at-most-once);
* an instance's own RDATA / POSITION / LOCK_RELEASED echoes are dropped by
  instance name;
* invalid messages are logged (rate-limited) and counted, never raised.

The transport is redis-py's asyncio ``Connection`` with the hiredis parser,
used directly (no pool, no client object) so reconnects, health checks and
pipelining are under this module's control.

:class:`RedisReplication` plugs the carrier into a
:class:`~factstream.replication.ReplicationHub` (REPLICATE after every
confirmed subscription, positions announced after every reconnect, RDATA
held back on a fresh subscription until its writer's POSITION);
:func:`tail_redis` prints a live deployment's traffic. See docs/redis.md.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import random
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from redis.asyncio.connection import AbstractConnection, parse_url
from redis.asyncio.connection import Connection as TcpRedisConnection
from redis.exceptions import RedisError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

from .. import metrics, wire
from ..backoff import backoff_delay
from ..commands import Command, PositionCommand, RdataCommand, ReplicateCommand
from ..redaction import redact_url as redacted_url
from ..replication.carrier import CommandSink, Connection
from ..replication.droplog import DropLog

__all__ = [
    "RedisCarrier",
    "RedisReplication",
    "RedisConnection",
    "RedisCarrierStats",
    "RedisChannels",
    "backoff_delay",
    "connection_kwargs_from_url",
    "redacted_url",
    "tail_redis",
    "command_to_json",
    "USER_IP_CHANNEL",
    "ECHO_COMMANDS",
]

logger = logging.getLogger(__name__)

#: Suffix of the opt-in channel that carries USER_IP (``<server_name>/USER_IP``).
USER_IP_CHANNEL = "USER_IP"
#: Commands an instance drops when they carry its own instance name.
ECHO_COMMANDS: frozenset[str] = frozenset({"RDATA", "POSITION", "LOCK_RELEASED"})

CommandHandler = Callable[[Command], object]
Hook = Callable[[], object]

# URL options that configure redis-py's pool, not one connection.
_POOL_ONLY_OPTIONS = ("max_connections", "timeout")


@dataclass(frozen=True)
class RedisChannels:
    """The channel names of one deployment (Synapse's layout)."""

    main: str
    user_ip: str

    @classmethod
    def for_server(cls, server_name: str) -> RedisChannels:
        """Channels of the deployment ``server_name``."""
        if not server_name or any(c in server_name for c in " \r\n"):
            raise ValueError(f"server name {server_name!r} must be non-empty without spaces or line breaks")
        return cls(main=server_name, user_ip=f"{server_name}/{USER_IP_CHANNEL}")

    def for_command(self, name: str) -> str:
        """The channel a command named ``name`` is published on."""
        return self.user_ip if name == "USER_IP" else self.main


@dataclass
class RedisCarrierStats:
    """Counters of one carrier; plain integers, cheap to read and to export."""

    received: int = 0  #: commands decoded and handed to ``on_command``
    invalid: int = 0  #: messages that did not parse (logged, skipped)
    echoes: int = 0  #: own RDATA/POSITION/LOCK_RELEASED dropped
    handler_errors: int = 0  #: ``on_command`` raised (logged, skipped)
    queued: int = 0  #: commands accepted by ``send``
    published: int = 0  #: commands Redis acknowledged
    publish_errors: int = 0  #: commands Redis answered with an error
    round_trips: int = 0  #: pipelined flushes (one write, one read of all replies)
    dropped: int = 0  #: commands refused because the outbound queue was full
    overflows: int = 0  #: times the bound was hit (each followed by a resync)
    lost_in_flight: int = 0  #: written, but the connection died before Redis replied
    subscriber_connects: int = 0  #: subscriptions confirmed (first one included)
    publisher_connects: int = 0  #: publisher connections made (first one included)
    subscriber_failures: int = 0  #: subscriber connects that failed or connections lost
    publisher_failures: int = 0  #: publisher connects that failed or connections lost
    health_check_failures: int = 0  #: connections declared dead by the PING health check
    resyncs: int = 0  #: ``on_resync`` calls

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict (for logs, JSON and metrics)."""
        return asdict(self)


def connection_kwargs_from_url(url: str, **overrides: Any) -> tuple[type[AbstractConnection], dict[str, Any]]:
    """The redis-py connection class and arguments for ``url``.

    Accepts ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS;
    options such as ``ssl_ca_certs``, ``ssl_cert_reqs`` or
    ``ssl_check_hostname`` go in the query string or in ``overrides``) and
    ``unix:///path/to/redis.sock[?db=N&password=...]``. Pub/sub channels are
    global to a Redis server: the database number does not separate
    deployments, the server name does.
    """
    try:
        kwargs: dict[str, Any] = dict(parse_url(url))
    except ValueError as err:
        raise ValueError(f"bad Redis URL {redacted_url(url)!r}: {err}") from None
    for option in _POOL_ONLY_OPTIONS:
        kwargs.pop(option, None)
    cls: type[AbstractConnection] = kwargs.pop("connection_class", TcpRedisConnection)
    kwargs.update(overrides)
    return cls, kwargs


_NOTHING: Any = object()


def _buffered_replies(conn: AbstractConnection) -> tuple[Callable[[], Any], Any]:
    """``(gets, nothing)``: ``gets()`` returns the next reply already buffered, or ``nothing``.

    With hiredis this is the parser's own ``gets`` (a C call, no coroutine),
    which lets a burst of pub/sub messages or PUBLISH replies be consumed in
    one synchronous loop after a single awaited read. Without it (or if
    redis-py's internals change) ``gets`` always says ``nothing`` and every
    reply goes through the public ``read_response``.
    """
    reader = getattr(getattr(conn, "_parser", None), "_reader", None)
    try:
        from redis._parsers.hiredis import NOT_ENOUGH_DATA
    except ImportError:  # pragma: no cover - depends on the redis-py version
        reader = None
    gets = getattr(reader, "gets", None)
    if gets is None:
        return (lambda: _NOTHING), _NOTHING
    return gets, NOT_ENOUGH_DATA


def _pack_publish_header(channel: bytes) -> bytes:
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n" % (len(channel), channel)


class RedisCarrier:
    """Carries replication commands over Redis pub/sub for one instance.

    ``on_command(cmd)`` is called for each command received (own echoes
    removed when ``instance_name`` is given). ``on_subscribed()`` is called
    each time Redis confirms the subscription and ``on_unsubscribed(reason)``
    when that subscription is lost; ``on_resync()`` when commands may have
    been lost on the way out (publisher reconnect, queue overflow) and the
    owner should announce its positions. Hooks may be plain functions
    or coroutine functions (run as tasks); their errors are logged, never
    propagated.

    Use ``async with RedisCarrier(...) as carrier:`` or ``start()`` /
    ``close()``. ``send(cmd)`` never blocks and never raises for connection
    trouble; it returns False when the command was refused (queue full).
    ``listen=False`` makes a publish-only carrier (no subscriber connection).
    """

    def __init__(
        self,
        url: str,
        server_name: str,
        *,
        on_command: CommandHandler | None = None,
        on_subscribed: Hook | None = None,
        on_resync: Hook | None = None,
        on_unsubscribed: Callable[[str], object] | None = None,
        instance_name: str | None = None,
        subscribe_user_ip: bool = False,
        max_pending: int = 10_000,
        max_batch: int = 10_000,
        pipelining: bool = True,
        ping_interval: float = 5.0,
        ping_timeout: float = 15.0,
        connect_timeout: float = 5.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        client_name: str | None = None,
        connection_options: Mapping[str, Any] | None = None,
        listen: bool = True,
    ) -> None:
        if max_pending < 1 or max_batch < 1:
            raise ValueError("max_pending and max_batch must be at least 1")
        if not 0 < ping_interval <= ping_timeout:
            raise ValueError("need 0 < ping_interval <= ping_timeout")
        self.url = url
        self.server_name = server_name
        self.channels = RedisChannels.for_server(server_name)
        self.instance_name = instance_name
        self.subscribe_user_ip = subscribe_user_ip
        self.listen = listen
        self.max_pending = max_pending
        self.max_batch = max_batch if pipelining else 1
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = RedisCarrierStats()
        self._on_command = on_command
        self._on_subscribed = on_subscribed
        self._on_resync = on_resync
        self._on_unsubscribed = on_unsubscribed
        self._kick: asyncio.Future[str] | None = None
        name = client_name or f"factstream-{instance_name or 'anon'}"
        self._client_name = "".join(c if c.isalnum() or c in "-_.:/" else "_" for c in name)
        self._conn_class, self._conn_kwargs = connection_kwargs_from_url(url, **(connection_options or {}))
        # Validate the URL options now, not on the first reconnect.
        self._new_connection("check")

        self._subscribe_to = [self.channels.main]
        if subscribe_user_ip:
            self._subscribe_to.append(self.channels.user_ip)
        self._header_main = _pack_publish_header(self.channels.main.encode())
        self._header_user_ip = _pack_publish_header(self.channels.user_ip.encode())

        self._queue: deque[bytes] = deque()
        self._overflowing = False
        self._dropped_before = 0
        self._need_resync = False
        self._wake = asyncio.Event()
        self._flusher_waiting = False
        self._in_flight = 0
        self._drained_waiters: list[asyncio.Future[None]] = []
        self._subscribed = False
        self._subscribed_event = asyncio.Event()
        self._rx = 0  # messages read on the current subscriber connection (health check)
        self._publisher_up = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._hook_tasks: set[asyncio.Task[Any]] = set()
        self._rng = random.Random()
        self._pending_reported = 0
        self._m_in = metrics.LabelledCounter(metrics.COMMANDS_IN)
        self._m_out = metrics.LabelledCounter(metrics.COMMANDS_OUT)
        self._invalid_log = DropLog(logger, interval=1.0)
        self._drop_log = DropLog(logger, interval=5.0)
        #: redis-side client ids of the live connections (for operators and tests)
        self.subscriber_client_id: int | None = None
        self.publisher_client_id: int | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start both connection loops; returns at once (see ``wait_subscribed``)."""
        if self._tasks:
            raise RuntimeError("RedisCarrier already started")
        if not HIREDIS_AVAILABLE:  # pragma: no cover - hiredis is a dependency
            logger.warning("hiredis is not available; redis-py falls back to its slower Python parser")
        logger.info(
            "replicating over Redis %s as %s (channels %s)",
            redacted_url(self.url), self.instance_name or "(anonymous)", ", ".join(self._subscribe_to),
        )
        self._tasks = [asyncio.create_task(self._publisher_main(), name=f"redis-publisher-{self.server_name}")]
        if self.listen:
            self._tasks.append(
                asyncio.create_task(self._subscriber_main(), name=f"redis-subscriber-{self.server_name}")
            )

    async def close(self, flush_timeout: float = 1.0) -> None:
        """Stop both connections, first trying for ``flush_timeout`` s to publish what is queued."""
        if self._closing:
            return
        if flush_timeout > 0 and self._tasks and (self._queue or self._in_flight):
            try:
                await self.flush(timeout=flush_timeout)
            except TimeoutError:
                logger.warning("closing with %d commands still unpublished", len(self._queue) + self._in_flight)
        self._closing = True
        tasks = self._tasks + list(self._hook_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._queue.clear()
        self._in_flight = 0
        self._report_metrics()
        self._subscribed = self._publisher_up = False
        for fut in self._drained_waiters:
            if not fut.done():
                fut.cancel()

    async def __aenter__(self) -> RedisCarrier:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def subscribed(self) -> bool:
        """True while the subscriber connection is up and its subscription confirmed."""
        return self._subscribed

    @property
    def publisher_connected(self) -> bool:
        """True while the publishing connection is up."""
        return self._publisher_up

    @property
    def pending(self) -> int:
        """Commands queued or in flight, not yet acknowledged by Redis."""
        return len(self._queue) + self._in_flight

    async def wait_subscribed(self, timeout: float | None = None) -> None:
        """Wait until the subscription is confirmed (raises TimeoutError after ``timeout``)."""
        if not self.listen:
            raise RuntimeError("this carrier was made with listen=False: it never subscribes")
        async with asyncio.timeout(timeout):
            while not self._subscribed:
                self._subscribed_event.clear()
                await self._subscribed_event.wait()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the queue is empty and Redis acknowledged the last batch.

        While the publisher is disconnected this waits for the reconnect; a
        batch lost with a connection counts as done (see ``stats.lost_in_flight``).
        """
        if not self._queue and not self._in_flight:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained_waiters.append(fut)
        async with asyncio.timeout(timeout):
            await fut

    # ------------------------------------------------------------------ sending

    def send(self, cmd: Command) -> bool:
        """Queue ``cmd`` for publishing; False if refused because the queue is full.

        Encoding errors (a command Synapse could not carry) raise
        :class:`factstream.wire.ProtocolError` here, at the caller.
        """
        data = wire.encode(cmd)
        name = cmd.NAME
        header = self._header_user_ip if name == "USER_IP" else self._header_main
        if self._enqueue(b"%s$%d\r\n%s\r\n" % (header, len(data), data)):
            counts = self._m_out.counts
            counts[name] = counts.get(name, 0) + 1
            return True
        return False

    def send_many(self, cmds: Iterable[Command]) -> int:
        """Queue several commands in order; returns how many were accepted."""
        accepted = 0
        for cmd in cmds:
            accepted += self.send(cmd)
        return accepted

    def _enqueue(self, packed: bytes) -> bool:
        queue = self._queue
        if self._overflowing or len(queue) >= self.max_pending:
            self.stats.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                self._need_resync = True
                self.stats.overflows += 1
                self._dropped_before = self.stats.dropped - 1
                logger.error(
                    "Redis publish queue full (%d commands, publisher %s): dropping new commands until it "
                    "drains; readers will catch up from positions announced afterwards. Raise max_pending "
                    "or check the Redis connection.",
                    len(queue), "connected" if self._publisher_up else "DISCONNECTED",
                )
            else:
                self._drop_log.log("Redis publish queue still full: %d commands dropped so far", self.stats.dropped)
            return False
        queue.append(packed)
        self.stats.queued += 1
        if self._flusher_waiting:
            self._flusher_waiting = False
            self._wake.set()
        return True

    # ------------------------------------------------------------------ connections

    def _new_connection(self, role: str) -> AbstractConnection:
        options: dict[str, Any] = dict(
            protocol=2,  # pub/sub messages as plain arrays, identical on every Redis version
            socket_connect_timeout=self.connect_timeout,
            socket_timeout=None,
            health_check_interval=0,  # our own health checks, see _watch_subscriber/_publish_on
            client_name=f"{self._client_name}:{role}",
            retry=None,
            retry_on_error=[],
        )
        if issubclass(self._conn_class, TcpRedisConnection):  # TCP (and TLS): let the kernel probe idle peers too
            options["socket_keepalive"] = True
        options.update(self._conn_kwargs)
        try:
            return self._conn_class(**options)
        except TypeError as err:
            raise ValueError(f"unsupported option in Redis URL {redacted_url(self.url)!r}: {err}") from None

    async def _connect(self, role: str) -> AbstractConnection:
        conn = self._new_connection(role)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]  # redis-py: AbstractConnection.connect() is unannotated
                await conn.send_command("CLIENT", "ID", check_health=False)
                client_id = int(await conn.read_response())
        except BaseException:
            await self._discard(conn)
            raise
        if role == "sub":
            self.subscriber_client_id = client_id
        else:
            self.publisher_client_id = client_id
        return conn

    @staticmethod
    async def _discard(conn: AbstractConnection) -> None:
        # Wait for the close (bounded by redis-py's connect timeout): a TLS
        # shutdown still in progress when the loop closes is a resource leak.
        try:
            await conn.disconnect()
        except Exception:  # noqa: BLE001 - closing a broken socket may fail any way
            pass

    def _describe(self, err: BaseException) -> str:
        if isinstance(err, TimeoutError):
            return "timed out"
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__

    def _report_pending(self) -> None:
        pending = len(self._queue) + self._in_flight
        if pending != self._pending_reported:
            metrics.PENDING_OUT.inc(pending - self._pending_reported)
            self._pending_reported = pending

    def _report_metrics(self) -> None:
        """Move the locally counted figures to Prometheus (once per round trip / read burst)."""
        self._m_out.report()
        self._m_in.report()
        self._report_pending()

    async def _backoff(self, role: str, attempt: int, err: BaseException) -> None:
        metrics.RECONNECTS.labels(f"redis {role}").inc()
        self._report_metrics()
        delay = backoff_delay(attempt, self.backoff_initial, self.backoff_max, self._rng)
        log = logger.warning if attempt < 3 or attempt % 10 == 0 else logger.info
        log(
            "Redis %s connection to %s failed (%s); retry %d in %.2fs",
            role, redacted_url(self.url), self._describe(err), attempt + 1, delay,
        )
        await asyncio.sleep(delay)

    # ------------------------------------------------------------------ subscriber

    async def _subscriber_main(self) -> None:
        attempt = 0
        while True:
            try:
                conn = await self._connect("sub")
            except Exception as err:  # noqa: BLE001 - keep trying forever, whatever went wrong
                self.stats.subscriber_failures += 1
                await self._backoff("subscriber", attempt, err)
                attempt += 1
                continue
            confirmed_before = self.stats.subscriber_connects
            try:
                reason = await self._subscribe_on(conn)
            except Exception as err:  # noqa: BLE001
                reason = self._describe(err)
                if not isinstance(err, (RedisError, OSError, TimeoutError)):
                    logger.exception("unexpected error on the Redis subscriber connection")
            finally:
                was_subscribed = self._subscribed
                self._subscribed = False
                await self._discard(conn)
            if was_subscribed and self._on_unsubscribed is not None:
                try:
                    self._on_unsubscribed(reason)
                except Exception:  # noqa: BLE001
                    logger.exception("Redis carrier hook on_unsubscribed failed")
            if self.stats.subscriber_connects != confirmed_before:
                attempt = 0  # it worked for a while: start the backoff over
            self.stats.subscriber_failures += 1
            metrics.DISCONNECTS.labels("redis subscriber lost").inc()
            logger.warning(
                "Redis subscriber connection lost (%s)%s; reconnecting",
                reason, "; messages published meanwhile are missed until catch-up" if was_subscribed else "",
            )
            await self._backoff("subscriber", attempt, ConnectionError(reason))
            attempt += 1

    async def _subscribe_on(self, conn: AbstractConnection) -> str:
        """Subscribe and read messages until the connection dies; returns why it stopped."""
        self._rx = 0
        kick: asyncio.Future[str]
        kick = self._kick = asyncio.get_running_loop().create_future()
        reader = asyncio.create_task(self._read_subscribed(conn))
        watcher = asyncio.create_task(self._watch_subscriber(conn))
        try:
            done, _ = await asyncio.wait((reader, watcher, kick), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._kick = None
            for task in (reader, watcher):
                task.cancel()
            await asyncio.gather(reader, watcher, return_exceptions=True)
        if kick in done:
            return kick.result()
        kick.cancel()
        if watcher in done and not watcher.cancelled() and watcher.exception() is None:
            return str(watcher.result())
        task = reader if reader in done else watcher
        err = task.exception()
        if err is not None:
            raise err
        return "closed"

    def kick_subscriber(self, reason: str) -> None:
        """Drop the subscriber connection and subscribe afresh (after the usual backoff)."""
        if self._kick is not None and not self._kick.done():
            self._kick.set_result(reason)

    async def _read_subscribed(self, conn: AbstractConnection) -> None:
        await conn.send_command("SUBSCRIBE", *self._subscribe_to, check_health=False)
        unconfirmed = set(self._subscribe_to)
        dispatch = self._dispatch
        read = functools.partial(conn.read_response, disconnect_on_error=False)  # we close, and wait for it
        gets, nothing = _buffered_replies(conn)
        while True:
            msg = await read()
            while True:  # this message, then every one already buffered behind it
                self._rx += 1
                if type(msg) is not list:
                    if isinstance(msg, Exception):
                        raise msg
                elif msg[0] == b"message":
                    dispatch(msg[2])
                elif msg[0] == b"subscribe":
                    unconfirmed.discard(msg[1].decode())
                    if not unconfirmed and not self._subscribed:
                        self._subscribed = True
                        self.stats.subscriber_connects += 1
                        self._subscribed_event.set()
                        logger.info("subscribed to Redis channels %s", ", ".join(self._subscribe_to))
                        self._run_hook(self._on_subscribed, "on_subscribed")
                # b"pong" answers our health check; nothing else is expected.
                msg = gets()
                if msg is nothing:
                    break
            if self._m_in.counts:
                self._m_in.report()

    async def _watch_subscriber(self, conn: AbstractConnection) -> str:
        """PING when idle; return when nothing at all came back within ping_timeout."""
        loop = asyncio.get_running_loop()
        seen = self._rx
        last_rx = loop.time()
        while True:
            await asyncio.sleep(self.ping_interval)
            now = loop.time()
            if self._rx != seen:
                seen, last_rx = self._rx, now
                continue
            if now - last_rx >= self.ping_timeout:
                self.stats.health_check_failures += 1
                return f"no reply to PING within {self.ping_timeout:g}s"
            async with asyncio.timeout(self.ping_timeout):
                await conn.send_command("PING", check_health=False)

    def _dispatch(self, data: bytes) -> None:
        if not data or data.isspace():
            return
        try:
            cmd = wire.parse_line(data)
        except Exception as err:  # noqa: BLE001 - a bad message must never stop the reader
            self.stats.invalid += 1
            self._invalid_log.dropped("bad_message", 1, "", "ignoring invalid replication message on Redis: %s", err)
            return
        own = self.instance_name
        if own is not None and cmd.NAME in ECHO_COMMANDS and cmd.instance_name == own:  # type: ignore[attr-defined]
            self.stats.echoes += 1
            return
        self.stats.received += 1
        counts = self._m_in.counts
        counts[cmd.NAME] = counts.get(cmd.NAME, 0) + 1
        handler = self._on_command
        if handler is None:
            return
        try:
            result = handler(cmd)
        except Exception:  # noqa: BLE001
            self.stats.handler_errors += 1
            logger.exception("replication handler failed on %s", cmd.NAME)
            return
        if inspect.isawaitable(result):
            self._track(asyncio.ensure_future(result), f"handler for {cmd.NAME}")

    # ------------------------------------------------------------------ hooks

    def _run_hook(self, hook: Hook | None, what: str) -> None:
        if hook is None:
            return
        try:
            result = hook()
        except Exception:  # noqa: BLE001
            logger.exception("Redis carrier hook %s failed", what)
            return
        if inspect.isawaitable(result):
            self._track(asyncio.ensure_future(result), what)

    def _track(self, fut: asyncio.Future[Any], what: str) -> None:
        self._hook_tasks.add(fut)  # type: ignore[arg-type]

        def done(f: asyncio.Future[Any]) -> None:
            self._hook_tasks.discard(f)
            if not f.cancelled() and f.exception() is not None:
                if what.startswith("handler"):
                    self.stats.handler_errors += 1
                logger.error("Redis carrier %s failed", what, exc_info=f.exception())

        fut.add_done_callback(done)

    # ------------------------------------------------------------------ publisher

    async def _publisher_main(self) -> None:
        attempt = 0
        connected_before = False
        while True:
            try:
                conn = await self._connect("pub")
            except Exception as err:  # noqa: BLE001 - keep trying forever, whatever went wrong
                self.stats.publisher_failures += 1
                await self._backoff("publisher", attempt, err)
                attempt += 1
                continue
            attempt = 0
            self.stats.publisher_connects += 1
            self._publisher_up = True
            if connected_before:
                logger.info("Redis publisher reconnected; %d commands queued", len(self._queue))
            connected_before = True
            try:
                await self._publish_on(conn)
                reason = "closed"
            except Exception as err:  # noqa: BLE001
                reason = self._describe(err)
                if not isinstance(err, (RedisError, OSError, TimeoutError)):
                    logger.exception("unexpected error on the Redis publisher connection")
            finally:
                self._publisher_up = False
                await self._discard(conn)
                # Whatever was published since the last resync may be lost: announce positions again.
                self._need_resync = True
                if self._in_flight:
                    self._lost_in_flight()
            self.stats.publisher_failures += 1
            metrics.DISCONNECTS.labels("redis publisher lost").inc()
            logger.warning(
                "Redis publisher connection lost (%s); %d commands queued, reconnecting", reason, len(self._queue)
            )
            await self._backoff("publisher", attempt, ConnectionError(reason))
            attempt += 1

    async def _publish_on(self, conn: AbstractConnection) -> None:
        """Flush the queue over ``conn`` until it fails; PING it when idle."""
        queue = self._queue
        read = functools.partial(conn.read_response, disconnect_on_error=False)  # we close, and wait for it
        gets, nothing = _buffered_replies(conn)
        write = conn.send_packed_command
        stats = self.stats
        while True:
            if not queue:
                self._drained()
                self._report_metrics()
                if queue:
                    continue  # the resync hook queued positions
                self._wake.clear()
                self._flusher_waiting = True
                try:
                    async with asyncio.timeout(self.ping_interval):
                        await self._wake.wait()
                    continue
                except TimeoutError:
                    self._flusher_waiting = False
                try:
                    async with asyncio.timeout(self.ping_timeout):
                        await write(b"*1\r\n$4\r\nPING\r\n", check_health=False)
                        await read()
                except TimeoutError:
                    stats.health_check_failures += 1
                    raise TimeoutError(f"no reply to PING within {self.ping_timeout:g}s") from None
                continue
            n = min(len(queue), self.max_batch)
            if n == len(queue):
                batch = list(queue)
                queue.clear()
            else:
                batch = [queue.popleft() for _ in range(n)]
            self._in_flight = n
            self._report_metrics()
            try:
                async with asyncio.timeout(self.ping_timeout):
                    await write(batch, check_health=False)
                    errors = 0
                    remaining = n
                    while remaining:
                        reply = gets()
                        if reply is nothing:
                            self._in_flight = remaining
                            try:
                                reply = await read()
                            except ResponseError as err:
                                reply = err
                        if isinstance(reply, Exception):
                            if not isinstance(reply, ResponseError):
                                raise reply
                            errors += 1
                            if errors == 1:
                                logger.error("Redis refused PUBLISH: %s", reply)
                        remaining -= 1
                    self._in_flight = 0
            except TimeoutError:
                stats.health_check_failures += 1
                raise TimeoutError(f"no reply from Redis within {self.ping_timeout:g}s") from None
            stats.round_trips += 1
            stats.published += n - errors
            stats.publish_errors += errors

    def _lost_in_flight(self) -> None:
        """A batch was written but not (fully) acknowledged: some of it may never reach anyone.

        Publishing what is queued behind it would let a reader apply later
        facts over the hole without noticing, so the queue is dropped and new
        commands refused until the publisher is back and ``on_resync`` has
        announced positions (readers then fetch the hole from the database).
        """
        lost, queued = self._in_flight, len(self._queue)
        self._in_flight = 0
        self.stats.lost_in_flight += lost
        self.stats.dropped += queued
        self._queue.clear()
        self._report_pending()
        if not self._overflowing:
            self._overflowing = True
            self.stats.overflows += 1
            self._dropped_before = self.stats.dropped - queued
        logger.error(
            "Redis publisher connection lost with %d commands unacknowledged; dropping %d queued commands and "
            "refusing new ones until reconnected, then announcing positions so readers catch up", lost, queued,
        )

    def _drained(self) -> None:
        """The queue is empty: resync if something may have been lost, wake flush() waiters."""
        if self._need_resync:
            self._need_resync = False
            if self._overflowing:
                logger.warning(
                    "Redis publishing resumes after dropping %d commands; announcing positions",
                    self.stats.dropped - self._dropped_before,
                )
            self._overflowing = False
            self.stats.resyncs += 1
            self._run_hook(self._on_resync, "on_resync")
            if self._queue:
                return
        waiters, self._drained_waiters = self._drained_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


# ---------------------------------------------------------------------- replication


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
        """Publish ``cmd`` (queued, pipelined; refused and counted when the queue is full)."""
        if self._open:
            self._carrier.send(cmd)

    def send_many(self, cmds: Iterable[Command]) -> None:
        """Publish several commands in order."""
        if self._open:
            self._carrier.send_many(cmds)

    def close(self, reason: str | None = None) -> None:
        """Drop this subscription; the carrier subscribes again (a new connection)."""
        if self._open:
            self._carrier.kick_subscriber(reason or "closed by the replication core")

    @property
    def connected(self) -> bool:
        return self._open


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
        """Connect both Redis connections (in the background; see ``wait_connected``)."""
        await self.carrier.start()
        return self

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the subscription is confirmed and the hub has its connection."""
        await self.carrier.wait_subscribed(timeout)

    async def stop(self, flush_timeout: float = 1.0) -> None:
        """Publish what is queued (for up to ``flush_timeout`` s), then disconnect."""
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


# ---------------------------------------------------------------------- tail


def command_to_json(cmd: Command) -> dict[str, Any]:
    """A JSON-ready dict of ``cmd``: ``{"command": NAME, <field>: value, ...}``."""
    out: dict[str, Any] = {"command": cmd.NAME}
    for field in cmd._FIELDS:  # noqa: SLF001 - the field list is the public shape of a command
        out[field] = getattr(cmd, field)
    return out


def _stream_of(cmd: Command) -> str | None:
    return getattr(cmd, "stream_name", None)


async def tail_redis(
    url: str,
    server_name: str,
    streams: Sequence[str] = (),
    json_output: bool = False,
    *,
    user_ip: bool = False,
    replicate: bool = False,
    out: IO[str] | None = None,
    limit: int | None = None,
    stop: asyncio.Event | None = None,
) -> RedisCarrierStats:
    """Print a live deployment's replication traffic, decoded, until cancelled.

    ``streams`` keeps only RDATA/POSITION of those streams (other commands
    always show). ``json_output`` prints one JSON object per line instead of
    the wire line. ``user_ip`` also subscribes to ``<server_name>/USER_IP``.
    ``replicate`` publishes REPLICATE once subscribed, so writers announce
    their positions (otherwise tail only listens). Stops after ``limit``
    commands or when ``stop`` is set; returns the carrier's counters.
    """
    out = out or sys.stdout
    wanted = frozenset(streams)
    done = stop or asyncio.Event()
    shown = 0

    def show(cmd: Command) -> None:
        nonlocal shown
        stream = _stream_of(cmd)
        if wanted and stream is not None and stream not in wanted:
            return
        if json_output:
            out.write(json.dumps(command_to_json(cmd), separators=(",", ":")) + "\n")
        else:
            out.write(wire.encode(cmd).decode("utf-8", "replace") + "\n")
        out.flush()
        shown += 1
        if limit is not None and shown >= limit:
            done.set()

    carrier: RedisCarrier

    def subscribed() -> None:
        if replicate:
            carrier.send(wire.ReplicateCommand())

    carrier = RedisCarrier(
        url, server_name, on_command=show, on_subscribed=subscribed,
        subscribe_user_ip=user_ip, client_name="factstream-tail",
    )
    async with carrier:
        await done.wait()
    return carrier.stats
