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
from itertools import islice
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.asyncio.connection import Connection as TcpRedisConnection
from redis.exceptions import RedisError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

from ... import metrics, wire
from ..._checks import backoff, seconds, text, whole
from ...backoff import backoff_delay
from ...commands import Command
from ...redaction import redact_text
from ...redaction import redact_url as redacted_url
from ...replication.droplog import DropLog
from .fastpaths import REPLY_LOWAT_MAX, _buffered_replies, _direct_write, _reply_lowat
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
    round_trips: int = 0  #: pipelined writes (each up to ``max_batch`` commands; replies counted in bulk)
    dropped: int = 0  #: commands refused because the outbound queue was full
    overflows: int = 0  #: times the bound was hit (each followed by a resync)
    lost_in_flight: int = 0  #: written, but the connection died before Redis replied
    subscriber_connects: int = 0  #: subscriptions confirmed (first one included)
    subscriber_losses: int = 0  #: confirmed subscriptions that ended (each followed by a resubscribe)
    publisher_connects: int = 0  #: publisher connections made (first one included)
    subscriber_failures: int = 0  #: subscriber connects that failed or connections lost
    publisher_failures: int = 0  #: publisher connects that failed or connections lost
    health_check_failures: int = 0  #: connections declared dead by the PING health check
    resyncs: int = 0  #: ``on_resync`` calls

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict (for logs, JSON and metrics)."""
        return asdict(self)


#: Commands packed (and, when the publisher is idle, written) per chunk by ``send_many``.
CHUNK = 512


def _flag(name: str, value: object) -> bool:
    """A bool option; a truthy string such as ``"no"`` is refused rather than read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


class _State:
    """Where a carrier is in its one life: made, running, closing (flushing), closed."""

    NEW, RUNNING, CLOSING, CLOSED = "new", "running", "closing", "closed"


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
    ``close()``. A carrier lives once: ``close()`` (even before ``start()``)
    is final and always stops what ``start()`` started; from then on
    ``start()``, ``send()``, ``flush()`` and ``wait_subscribed()`` raise
    RuntimeError (a command accepted by a closed carrier would be lost
    silently). Make a new carrier to connect again. ``send(cmd)`` never
    blocks and never raises for connection trouble; it returns False when
    the command was refused (queue full).
    ``listen=False`` makes a publish-only carrier (no subscriber connection).
    Options that cannot work (a backoff of 0, a timeout of 0, None, NaN or
    infinity, a batch of 2.5 commands) raise ValueError or TypeError here.
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
        # Checked now: a 0 backoff or timeout would retry in a busy loop much later.
        text("url", url)
        text("server_name", server_name)
        max_pending = whole("max_pending", max_pending)
        max_batch = whole("max_batch", max_batch)
        pipelining = _flag("pipelining", pipelining)
        listen = _flag("listen", listen)
        subscribe_user_ip = _flag("subscribe_user_ip", subscribe_user_ip)
        ping_interval = seconds("ping_interval", ping_interval)
        ping_timeout = seconds("ping_timeout", ping_timeout)
        if ping_interval > ping_timeout:
            raise ValueError(f"ping_interval ({ping_interval:g}) must not be above ping_timeout ({ping_timeout:g})")
        connect_timeout = seconds("connect_timeout", connect_timeout)
        backoff_initial, backoff_max = backoff(backoff_initial, backoff_max)
        if client_name is not None:
            text("client_name", client_name)
        if instance_name is not None:
            text("instance_name", instance_name)
        self.url = url
        self.server_name = server_name
        self.channels = RedisChannels.for_server(server_name)
        self.instance_name = instance_name
        self.subscribe_user_ip = subscribe_user_ip
        self.listen = listen
        self.max_pending = max_pending
        self.max_batch = max_batch if pipelining else 1
        self.pipelining = pipelining
        self._chunk = min(self.max_batch, CHUNK)
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
        self._channel_main = self.channels.main.encode()
        self._channel_user_ip = self.channels.user_ip.encode()

        #: packed PUBLISH requests waiting for the publisher task: (bytes, commands in them)
        self._queue: deque[tuple[bytes, int]] = deque()
        self._queued = 0  # commands in _queue
        #: write-through on the live publisher connection (send_many), None when not usable
        self._direct: Callable[[bytes], bool] | None = None
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
        self._state = _State.NEW
        self._closer: asyncio.Task[None] | None = None
        #: why the last connect or connection failed (password masked), for a caller's own message; None
        #: before any failure
        self.last_error: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._hook_tasks: set[asyncio.Task[Any]] = set()
        self._rng = random.Random()
        self._pending_reported = 0
        self._m_in = metrics.LabelledCounter(metrics.COMMANDS_IN)
        self._m_out = metrics.LabelledCounter(metrics.COMMANDS_OUT)
        self._invalid_log = DropLog(logger, interval=1.0)
        self._drop_log = DropLog(logger, interval=5.0)
        self._refused_log = DropLog(logger, interval=5.0)
        #: redis-side client ids of the live connections (for operators and tests)
        self.subscriber_client_id: int | None = None
        self.publisher_client_id: int | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start both connection loops; returns at once (see ``wait_subscribed``)."""
        if self._state == _State.RUNNING:
            raise RuntimeError("RedisCarrier already started")
        self._check_open("start")
        if not HIREDIS_AVAILABLE:  # pragma: no cover - hiredis is a dependency
            logger.warning("hiredis is not available; redis-py falls back to its slower Python parser")
        logger.info(
            "replicating over Redis %s as %s (channels %s)",
            redacted_url(self.url), self.instance_name or "(anonymous)", ", ".join(self._subscribe_to),
        )
        self._state = _State.RUNNING
        self._tasks = [asyncio.create_task(self._publisher_main(), name=f"redis-publisher-{self.server_name}")]
        if self.listen:
            self._tasks.append(
                asyncio.create_task(self._subscriber_main(), name=f"redis-subscriber-{self.server_name}")
            )

    async def close(self, flush_timeout: float = 1.0) -> None:
        """Stop both connections, first trying for ``flush_timeout`` s to publish what is queued.

        Final, and safe to call any number of times: commands are refused
        from the first call; every call returns once both connections and
        every task of this carrier are gone (a cancelled caller does not cut
        the shutdown short). Closing a carrier never started just marks it closed.
        """
        if self._state == _State.CLOSED:
            return
        if self._closer is None:
            if self._state == _State.NEW:
                self._state = _State.CLOSING
                self._finish_close()
                return
            self._state = _State.CLOSING  # refuse new commands: the flush below must end
            self._closer = asyncio.get_running_loop().create_task(
                self._shut_down(flush_timeout), name=f"redis-close-{self.server_name}"
            )
        await asyncio.shield(self._closer)

    async def _shut_down(self, flush_timeout: float) -> None:
        if flush_timeout > 0 and (self._queued or self._in_flight):
            try:
                await self._wait_drained(flush_timeout)
            except (TimeoutError, RuntimeError):
                pass
        tasks = self._tasks + list(self._hook_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._finish_close()

    def _finish_close(self) -> None:
        """Drop what is left and wake every waiter with the news (nothing waits on a closed carrier)."""
        lost = self._queued + self._in_flight
        if lost:
            logger.warning("closing with %d commands still unpublished", lost)
        self._queue.clear()
        self._queued = self._in_flight = 0
        self._report_metrics()
        self._subscribed = self._publisher_up = False
        self._state = _State.CLOSED
        self._subscribed_event.set()  # wait_subscribed() callers see the state and raise
        waiters, self._drained_waiters = self._drained_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(
                    f"RedisCarrier closed with {lost} commands unpublished (raise close()'s flush_timeout "
                    "to give them longer)"
                ))

    def _check_open(self, what: str) -> None:
        if self._state in (_State.CLOSING, _State.CLOSED):
            raise RuntimeError(
                f"RedisCarrier for {self.server_name!r} is closed: cannot {what}; make a new carrier to connect again"
            )

    @property
    def closed(self) -> bool:
        """True from the first ``close()`` call on: the carrier accepts nothing more."""
        return self._state in (_State.CLOSING, _State.CLOSED)

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
        return self._queued + self._in_flight

    async def wait_subscribed(self, timeout: float | None = None) -> None:
        """Wait until the subscription is confirmed (raises TimeoutError after ``timeout``).

        Raises RuntimeError on a closed carrier, also when it is closed while waiting.
        """
        if not self.listen:
            raise RuntimeError("this carrier was made with listen=False: it never subscribes")
        async with asyncio.timeout(timeout):
            while True:
                self._check_open("wait for a subscription")
                if self._subscribed:
                    return
                self._subscribed_event.clear()
                await self._subscribed_event.wait()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the queue is empty and Redis acknowledged the last batch.

        While the publisher is disconnected this waits for the reconnect; a
        batch lost with a connection counts as done (see ``stats.lost_in_flight``).
        Raises RuntimeError on a closed carrier, and when ``close()`` ends
        with commands of this flush still unpublished.
        """
        if self._state == _State.CLOSED:
            self._check_open("flush")
        await self._wait_drained(timeout)

    async def _wait_drained(self, timeout: float | None) -> None:
        if not self._queued and not self._in_flight:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained_waiters.append(fut)
        async with asyncio.timeout(timeout):
            await fut

    # ------------------------------------------------------------------ sending

    def send(self, cmd: Command) -> bool:
        """Queue ``cmd`` for publishing; False if refused because the queue is full.

        Encoding errors (a command Synapse could not carry) raise
        :class:`factstream.wire.ProtocolError` here, at the caller, and a
        closed carrier raises RuntimeError (it would never publish it).
        Everything queued in one event-loop tick goes out in one write.
        """
        return self.send_many((cmd,)) == 1

    def send_many(self, cmds: Iterable[Command]) -> int:
        """Queue several commands in order; returns how many were accepted.

        They are packed into PUBLISH requests a chunk at a time (one compiled
        call per chunk, see ``wire.encode_redis_publish``). A full chunk
        finding nothing older queued is written at once on the publisher
        connection, so Redis works on it while the next chunk is packed; the
        rest waits for the publisher task. Accepted commands still count as
        published only when Redis acknowledged them. An encoding error raises
        at the bad command, the ones before it accepted, as with ``send``;
        a closed (or closing) carrier raises RuntimeError and takes none.
        """
        self._check_open("send commands")
        if not isinstance(cmds, (list, tuple)):
            try:
                cmds = list(cmds)
            except TypeError:
                raise TypeError(f"send_many takes an iterable of commands, got {type(cmds).__name__}") from None
        total = len(cmds)
        room = 0 if self._overflowing else self.max_pending - self._queued
        accepted = min(total, max(room, 0))
        encode = wire.encode_redis_publish
        main, user_ip = self._channel_main, self._channel_user_ip
        counts = self._m_out.counts
        chunk = self._chunk
        start = 0
        while start < accepted:
            part = cmds[start:min(start + chunk, accepted)]
            try:
                data = encode(part, main, user_ip, counts)
            except Exception:
                # Accept the commands before the bad one, one by one, then raise its error.
                for cmd in part:
                    self._put(encode((cmd,), main, user_ip, counts), 1)
                raise
            n = len(part)
            start += n
            direct = self._direct
            if (
                n == chunk and direct is not None and not self._queued
                and self._in_flight + n <= self.max_pending and direct(data)
            ):
                self._in_flight += n
                self.stats.queued += n
                self.stats.round_trips += 1
                self._wake_flusher()
            else:
                self._put(data, n)
        if accepted < total:
            refused = 0
            try:
                for cmd in cmds[accepted:]:
                    encode((cmd,), main, user_ip, {})  # the same errors as an accepted command
                    refused += 1
            finally:
                if refused:  # those before a bad one are dropped, and counted, as with send()
                    self._refuse(refused)
        return accepted

    def _put(self, data: bytes, n: int) -> None:
        self._queue.append((data, n))
        self._queued += n
        self.stats.queued += n
        self._wake_flusher()

    def _wake_flusher(self) -> None:
        if self._flusher_waiting:
            self._flusher_waiting = False
            self._wake.set()

    def _refuse(self, n: int) -> None:
        """``n`` commands found the queue full (or still overflowing): count and log them."""
        self.stats.dropped += n
        if not self._overflowing:
            self._overflowing = True
            self._need_resync = True
            self.stats.overflows += 1
            self._dropped_before = self.stats.dropped - n
            logger.error(
                "Redis publish queue full (%d commands, publisher %s): dropping new commands until it "
                "drains; readers will catch up from positions announced afterwards. Raise max_pending "
                "or check the Redis connection.",
                self._queued + self._in_flight, "connected" if self._publisher_up else "DISCONNECTED",
            )
        else:
            self._drop_log.log("Redis publish queue still full: %d commands dropped so far", self.stats.dropped)

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
        pending = self._queued + self._in_flight
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
        self.last_error = redact_text(self._describe(err))
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
            if was_subscribed:
                self.stats.subscriber_losses += 1
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
                        if self._state == _State.RUNNING:  # closing: the owner could send nothing on it
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
                logger.info("Redis publisher reconnected; %d commands queued", self._queued)
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
                "Redis publisher connection lost (%s); %d commands queued, reconnecting", reason, self._queued
            )
            await self._backoff("publisher", attempt, ConnectionError(reason))
            attempt += 1

    async def _publish_on(self, conn: AbstractConnection) -> None:
        """Flush the queue over ``conn`` and count Redis' replies until it fails; PING it when idle."""
        self._direct = _direct_write(conn) if self.pipelining else None
        try:
            await self._publish_loop(conn)
        finally:
            self._direct = None

    async def _publish_loop(self, conn: AbstractConnection) -> None:
        queue = self._queue
        read = functools.partial(conn.read_response, disconnect_on_error=False)  # we close, and wait for it
        gets, nothing = _buffered_replies(conn)
        write = conn.send_packed_command
        stats = self.stats
        max_batch = self.max_batch
        lowat = _reply_lowat(conn) if self.pipelining else None
        waiting_for = 1  # the socket's low-water mark now

        async def send(parts: list[bytes]) -> None:
            # Through the same synchronous write as send_many when there is one,
            # so nothing written by send_many can overtake these bytes.
            direct = self._direct
            if direct is None or not direct(b"".join(parts)):
                await write(parts, check_health=False)

        while True:
            if self._in_flight:
                # Take every reply already buffered in one C-level loop (hiredis' gets called
                # by iter() until it says "nothing"), check them all with one sum() (replies
                # are receiver counts; an error reply is not an int); when there are none,
                # wait for the next. send_many may write more meanwhile: _in_flight grows
                # and this goes on until it is 0.
                acked = errors = 0
                try:
                    replies = list(islice(iter(gets, nothing), self._in_flight))
                    acked = len(replies)
                    try:
                        sum(replies)
                    except TypeError:
                        for reply in replies:
                            if type(reply) is not int:
                                errors += self._publish_error(reply)
                    if not acked:
                        if lowat is not None:
                            waiting_for = min(4 * self._in_flight - 3, REPLY_LOWAT_MAX)
                            lowat(waiting_for)
                        try:
                            async with asyncio.timeout(self.ping_timeout):
                                reply = await read()
                        except ResponseError as err:
                            reply = err
                        except TimeoutError:
                            stats.health_check_failures += 1
                            raise TimeoutError(f"no reply from Redis within {self.ping_timeout:g}s") from None
                        acked = 1
                        if type(reply) is not int:
                            errors += self._publish_error(reply)
                finally:
                    self._in_flight -= acked
                    stats.published += acked - errors
                    stats.publish_errors += errors
                if lowat is not None and waiting_for != 1 and not self._in_flight:
                    waiting_for = 1  # PING and the next batch: wake for any reply
                    lowat(1)
                continue
            if queue:
                batch: list[bytes] = []
                n = 0
                while queue and n + queue[0][1] <= max_batch:
                    data, k = queue.popleft()
                    batch.append(data)
                    n += k
                self._queued -= n
                self._in_flight = n
                self._report_metrics()
                stats.round_trips += 1
                try:
                    async with asyncio.timeout(self.ping_timeout):
                        await send(batch)
                except TimeoutError:
                    stats.health_check_failures += 1
                    raise TimeoutError(f"could not write to Redis within {self.ping_timeout:g}s") from None
                continue
            self._drained()
            self._report_metrics()
            if queue or self._in_flight:
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
                    await send([b"*1\r\n$4\r\nPING\r\n"])
                    await read()  # the first reply from here on: nothing was in flight
            except TimeoutError:
                stats.health_check_failures += 1
                raise TimeoutError(f"no reply to PING within {self.ping_timeout:g}s") from None

    def _publish_error(self, reply: Any) -> int:
        """A PUBLISH reply that is not a count: 1 for a refusal (logged, rate-limited), else raise."""
        if isinstance(reply, ResponseError):
            self._refused_log.log("Redis refused PUBLISH: %s", reply, level=logging.ERROR)
            return 1
        if isinstance(reply, Exception):
            raise reply
        raise RedisError(f"unexpected reply to PUBLISH: {reply!r}")

    def _lost_in_flight(self) -> None:
        """A batch was written but not (fully) acknowledged: some of it may never reach anyone.

        Publishing what is queued behind it would let a reader apply later
        facts over the hole without noticing, so the queue is dropped and new
        commands refused until the publisher is back and ``on_resync`` has
        announced positions (readers then fetch the hole from the database).
        """
        lost, queued = self._in_flight, self._queued
        self._in_flight = self._queued = 0
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
        if self._need_resync and self._state != _State.CLOSING:  # closing: no one may send positions now
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
