"""The Redis carrier: two connections (subscriber, publisher) carrying replication commands.

Over 600 lines on purpose: :class:`RedisCarrier` is one object whose two
connection loops share the publish queue, the resync rule and the stats;
splitting it would pass that state between modules. The package's
``__init__`` describes what it guarantees.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.asyncio.connection import Connection as TcpRedisConnection
from redis.exceptions import RedisError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

from ... import metrics, wire
from ...backoff import backoff_delay
from ...commands import Command
from ...redaction import redact_url as redacted_url
from ...replication.droplog import DropLog
from .urls import RedisChannels, connection_kwargs_from_url

logger = logging.getLogger("factstream.transport.redis")


#: Commands an instance drops when they carry its own instance name.
ECHO_COMMANDS: frozenset[str] = frozenset({"RDATA", "POSITION", "LOCK_RELEASED"})

CommandHandler = Callable[[Command], object]
Hook = Callable[[], object]


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
