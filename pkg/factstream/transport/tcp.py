"""Replication over TCP (Synapse's protocol), on asyncio or uvloop.

:class:`TcpServer` is the writer end (it answers SERVER + PING on connect),
:class:`TcpClient` the reader end (NAME + PING, then the hub's REPLICATE; it
reconnects forever with capped exponential backoff and jitter). Both carry
commands for a :class:`~factstream.replication.ReplicationHub` through the
carrier contract and handle, themselves and nothing more:

* handshake: SERVER / NAME / PING; a client that hears an unexpected server
  name sends ERROR and closes (then retries with backoff);
* keepalive: a command at least every ``ping_interval`` (PING when idle); once
  the peer has sent a PING, ``timeout`` seconds of silence close the link
  (a netcat session that never PINGs is never timed out);
* validation: a command the peer may not send (server-only vs client-only
  lists), an unparseable, non-UTF-8 or over-long line gets ``ERROR <why>``
  and a close; the server never raises on a bad client;
* congestion: while the socket is backed up, at most ``max_buffered``
  commands wait per connection; past that the peer is told it fell behind
  and disconnected (it reconnects and catches up from the database);
* optional TLS (:func:`server_ssl_context`, :func:`client_ssl_context`;
  ``client_cafile`` for mutual TLS). The TLS listener accepts sockets itself
  and runs each handshake as a task (``loop.connect_accepted_socket``): a
  connection becomes a reader (in
  ``TcpServer.connections``) only once its handshake is done; a handshake
  not done within ``handshake_timeout`` seconds is aborted, and at most
  ``max_handshakes`` run at once (connections past that are closed at once,
  counted as ``factstream_disconnects{reason="tls_handshake_limit"}``). A
  plaintext client, a port scanner or a client refusing the certificate
  therefore costs a few seconds and one slot, never a reader forever.

The fetch endpoint (:class:`FetchServer`, :class:`RemoteUpdateSource`) lets
readers fetch missed facts of in-memory streams from the writer: one JSON
request line, one JSON answer line, on its own port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl as _ssl
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from .. import _json, metrics, wire
from ..replication import _relay
from ..backoff import backoff_delay
from ..commands import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Command,
    ErrorCommand,
    NameCommand,
    PingCommand,
    RdataCommand,
    ServerCommand,
)
from ..errors import FactstreamError, ProtocolError
from ..replication.carrier import CommandSink, Connection
from ..streams.rows import Row
from ..streams.sources import UpdateSource, Updates

__all__ = [
    "TcpServer",
    "TcpClient",
    "TcpConnection",
    "FetchServer",
    "RemoteUpdateSource",
    "server_ssl_context",
    "client_ssl_context",
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_MAX_HANDSHAKES",
]

log = logging.getLogger(__name__)

DEFAULT_PING_INTERVAL = 5.0
DEFAULT_TIMEOUT = 15.0
DEFAULT_MAX_BUFFERED = 10_000
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_MAX_HANDSHAKES = 256
_ABORT_GRACE = 1.0  # seconds a closing connection may take to flush its ERROR


_IN: dict[str, Any] = {}
_OUT: dict[str, Any] = {}


def _count(cache: dict[str, Any], counter: Any, counts: dict[str, int]) -> None:
    """One metric update per command name (labels cached); ``counts`` from the relay's ``tally``."""
    for name, n in counts.items():
        child = cache.get(name)
        if child is None:
            child = cache[name] = counter.labels(name)
        child.inc(n)


def _now_ms() -> str:
    return str(int(time.time() * 1000))


class TcpConnection(asyncio.Protocol, Connection):
    """One TCP link, server or client end (see module doc)."""

    def __init__(
        self,
        sink: CommandSink,
        *,
        is_server: bool,
        local_name: str,
        expected_server_name: str | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_line_length: int = wire.DEFAULT_MAX_LINE_LENGTH,
        on_close: Any = None,
        on_made: Any = None,
        codec: Any = None,
        relay: Any = None,
    ) -> None:
        self.sink = sink
        self.is_server = is_server
        self.local_name = local_name
        self.expected_server_name = expected_server_name
        self.ping_interval = ping_interval
        self.timeout = timeout
        self.max_buffered = max_buffered
        self._allowed = CLIENT_COMMANDS if is_server else SERVER_COMMANDS
        self.may_send = SERVER_COMMANDS if is_server else CLIENT_COMMANDS
        self._codec = codec or wire
        self._decoder = self._codec.LineDecoder(max_line_length=max_line_length)
        self._encode_lines = self._codec.encode_lines
        self._tally = (relay or _relay).tally
        # Runs of RDATA go to the sink in one call when it takes them (the hub does).
        self._rdata_sink = None if is_server else getattr(sink, "rdata_received", None)
        self._outq: list[Command] = []
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._pending: deque[Command] = deque()
        self._closing = False
        self._made = False
        self._peer_pinged = False
        self._last_recv = self._last_sent = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._close_reason = "closed"
        self._on_close = on_close
        self._on_made = on_made
        self.handshake_done = False
        self.closed: asyncio.Future[str] = asyncio.get_event_loop().create_future()
        self.description = "tcp"
        #: For ``TcpServer.connections_info`` (``factstream status``): peer address, when it connected (epoch
        #: seconds) and when it last sent PING (None: never).
        self.peer_address = ""
        self.connected_at: float | None = None
        self.last_ping_at: float | None = None

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        if self._closing:
            # Closed before the transport arrived (a server stopping while a peer
            # was connecting): never set it up, or it would outlive the server.
            transport.abort()  # type: ignore[attr-defined]
            return
        peer = transport.get_extra_info("peername")
        self.peer_address = f"{peer[0]}:{peer[1]}" if peer else ""
        self.connected_at = time.time()
        side = "from" if self.is_server else "to"
        self.description = f"tcp {side} {peer[0]}:{peer[1]}" if peer else "tcp"
        if self.is_server:
            self._write([ServerCommand(self.local_name), PingCommand(_now_ms())])
        else:
            self._write([NameCommand(self.local_name), PingCommand(_now_ms())])
        self._schedule()
        self._made = True
        if self._on_made is not None:
            self._on_made(self)
        self.sink.connection_made(self)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._last_recv = time.monotonic()
        error: ProtocolError | None = None
        try:
            cmds = self._decoder.feed(data)
        except ProtocolError as err:
            cmds = err.commands
            error = err
        if cmds:
            counts = self._tally(cmds)
            _count(_IN, metrics.COMMANDS_IN, counts)
            try:
                rdata_sink = self._rdata_sink
                if rdata_sink is not None and counts.get("RDATA") == len(cmds):
                    rdata_sink(self, cmds)  # the hot path: a read of nothing but RDATA
                else:
                    i, n = 0, len(cmds)
                    while i < n:
                        if self._closing:
                            return
                        if rdata_sink is not None and type(cmds[i]) is RdataCommand:
                            j = i + 1
                            while j < n and type(cmds[j]) is RdataCommand:
                                j += 1
                            rdata_sink(self, cmds[i:j])
                            i = j
                        else:
                            self._handle(cmds[i])
                            i += 1
            except Exception:  # a bug behind the sink must not take the process down
                log.exception("%s: handling a received command failed; closing the connection", self.description)
                self._abort_with("error", "internal error while handling a command")
                return
        if error is not None and not self._closing:
            log.warning("%s: bad line, closing: %s", self.description, error)
            self._abort_with("protocol", f"invalid line: {error}")

    def eof_received(self) -> bool | None:
        self._close_reason = "eof"
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._closing = True
        if self._pending:
            metrics.PENDING_OUT.dec(len(self._pending))
            self._pending.clear()
        reason = self._close_reason if exc is None or self._close_reason != "closed" else f"error: {exc}"
        if self._made:  # one that never came up (a failed TLS handshake) is counted where it failed
            metrics.DISCONNECTS.labels(reason.split(":")[0]).inc()
            self._made = False
            self.sink.connection_lost(self, reason)
        if not self.closed.done():
            self.closed.set_result(reason)
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._pending and not self._closing:
            cmds = list(self._pending)
            cmds.extend(self._outq)
            self._outq = []
            metrics.PENDING_OUT.dec(len(cmds))
            self._pending.clear()
            self._write(cmds)

    # ------------------------------------------------------------ Connection

    def send(self, cmd: Command) -> None:
        self.send_many((cmd,))

    def send_many(self, cmds: Iterable[Command]) -> None:
        if self._closing:
            return
        if not self._paused:
            # Coalesce everything sent in one loop iteration into one write (one syscall).
            self._outq.extend(cmds)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_event_loop().call_soon(self._flush)
            return
        self._buffer(cmds)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closing or not self._outq:
            self._outq = []
            return
        cmds, self._outq = self._outq, []
        if self._paused:
            self._buffer(cmds)
        else:
            self._write(cmds)

    def _buffer(self, cmds: Iterable[Command]) -> None:
        """The socket is backed up: hold at most ``max_buffered`` commands, then drop the peer."""
        before = len(self._pending)
        self._pending.extend(cmds)
        metrics.PENDING_OUT.inc(len(self._pending) - before)
        if len(self._pending) > self.max_buffered:
            log.error(
                "%s (%s) fell behind: more than %d commands buffered; disconnecting it "
                "(it will reconnect and catch up)", self.description, self.peer_name, self.max_buffered,
            )
            self._abort_with("congestion", f"client fell behind: more than {self.max_buffered} commands buffered")

    def close(self, reason: str | None = None) -> None:
        if self._closing:
            return
        if reason:
            self._abort_with("closed", reason)
        else:
            self._close_reason = "closed"
            self._shutdown()

    @property
    def connected(self) -> bool:
        return not self._closing and self._transport is not None

    @property
    def buffered(self) -> int:
        """Commands waiting because the socket is backed up."""
        return len(self._pending)

    # ------------------------------------------------------------ internals

    def _write(self, cmds: Iterable[Command]) -> None:
        cmds = list(cmds) if not isinstance(cmds, (list, tuple)) else cmds
        if not cmds or self._transport is None:
            return
        try:
            data = self._encode_lines(cmds)
        except ProtocolError:
            log.exception("%s: cannot encode outgoing commands; dropping them", self.description)
            return
        self._transport.write(data)
        self._last_sent = time.monotonic()
        _count(_OUT, metrics.COMMANDS_OUT, self._tally(cmds))

    def _handle(self, cmd: Command) -> None:
        name = cmd.NAME
        if name == "RDATA" and not self.is_server:  # the hot path
            self.sink.command_received(self, cmd)
            return
        if name not in self._allowed:
            side = "client" if self.is_server else "server"
            self._abort_with("direction", f"{name} is not a command a {side} may send")
            return
        if name == "PING":
            self._peer_pinged = True
            self.last_ping_at = time.time()
            return
        if name == "SERVER":
            server_name = cmd.data  # type: ignore[attr-defined]
            self.peer_name = server_name
            if self.expected_server_name is not None and server_name != self.expected_server_name:
                log.error("%s: expected server %r but it says it is %r", self.description, self.expected_server_name, server_name)
                self._abort_with("server_name", f"wrong server name: expected {self.expected_server_name!r}, got {server_name!r}")
                return
            self.handshake_done = True
            return
        if name == "NAME":
            self.peer_name = cmd.data  # type: ignore[attr-defined]
            self.handshake_done = True
            return
        if name == "ERROR":
            log.warning("%s (%s) reported an error: %s", self.description, self.peer_name, cmd.data)  # type: ignore[attr-defined]
            return
        self.sink.command_received(self, cmd)

    def _abort_with(self, reason: str, message: str) -> None:
        """Send ERROR <message> (bypassing the congestion buffer) and close."""
        if self._closing:
            return
        self._close_reason = reason
        if self._transport is not None:
            try:
                self._transport.write(self._encode_lines([ErrorCommand(message.replace("\n", " ").replace("\r", " "))]))
                metrics.COMMANDS_OUT.labels("ERROR").inc()
            except Exception:  # the ERROR is a courtesy
                pass
        self._shutdown()

    def _shutdown(self) -> None:
        self._closing = True
        if self._pending:
            metrics.PENDING_OUT.dec(len(self._pending))
            self._pending.clear()
        transport = self._transport
        if transport is None:
            return
        transport.close()
        # A peer that does not read would keep the socket open forever: abort after a grace period.
        asyncio.get_event_loop().call_later(_ABORT_GRACE, transport.abort)

    def _schedule(self) -> None:
        interval = max(0.01, min(self.ping_interval, self.timeout) / 3)
        self._timer = asyncio.get_event_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        if self._closing:
            return
        now = time.monotonic()
        if self._peer_pinged and now - self._last_recv > self.timeout:
            log.warning("%s (%s): nothing received for %.1fs, closing", self.description, self.peer_name, now - self._last_recv)
            self._abort_with("timeout", f"no command received for {self.timeout:g}s")
            return
        if now - self._last_sent >= self.ping_interval:
            self.send(PingCommand(_now_ms()))
            self._last_sent = now
        self._schedule()


# ====================================================================== server


class TcpServer:
    """The writer end: accepts readers on ``host:port`` (loopback unless told otherwise).

    ``connections`` holds the readers: connections that are up (over TLS:
    whose handshake is done). ``handshakes`` says how many TLS handshakes are
    in progress (at most ``max_handshakes``, each at most
    ``handshake_timeout`` seconds).
    """

    def __init__(
        self,
        sink: CommandSink,
        server_name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl: _ssl.SSLContext | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_line_length: int = wire.DEFAULT_MAX_LINE_LENGTH,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
        codec: Any = None,
        relay: Any = None,
    ) -> None:
        if handshake_timeout <= 0 or max_handshakes < 1:
            raise ValueError("need handshake_timeout > 0 and max_handshakes >= 1")
        self.sink = sink
        self.server_name = server_name
        self.host = host
        self.port = port
        self.ssl = ssl
        self.handshake_timeout = handshake_timeout
        self.max_handshakes = max_handshakes
        self.opts = dict(
            ping_interval=ping_interval, timeout=timeout, max_buffered=max_buffered, max_line_length=max_line_length,
            codec=codec, relay=relay,
        )
        self._server: asyncio.Server | None = None
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        #: Readers: connections that are up (over TLS: handshake done).
        self.connections: set[TcpConnection] = set()
        self._unmade: set[TcpConnection] = set()  # accepted, connection_made not yet called
        self._handshakes: set[asyncio.Task[None]] = set()
        #: TLS handshakes that failed or timed out, and connections refused for too many handshakes at once.
        self.handshake_failures = 0
        self.handshakes_refused = 0
        self._refused_logged = 0.0

    @property
    def handshakes(self) -> int:
        """TLS handshakes in progress."""
        return len(self._handshakes)

    def connections_info(self) -> list[dict[str, Any]]:
        """The connected readers, read only: name, address, connected since, commands buffered, last PING."""
        return [
            {"name": c.peer_name, "address": c.peer_address, "connected_since": c.connected_at,
             "buffered": c.buffered, "last_ping": c.last_ping_at}
            for c in list(self.connections) if c.connected_at is not None
        ]

    def _protocol(self) -> TcpConnection:
        conn = TcpConnection(
            self.sink, is_server=True, local_name=self.server_name, on_close=self._closed_connection,
            on_made=self._made_connection, **self.opts,
        )
        self._unmade.add(conn)
        return conn

    def _made_connection(self, conn: TcpConnection) -> None:
        self._unmade.discard(conn)
        self.connections.add(conn)

    def _closed_connection(self, conn: TcpConnection) -> None:
        self._unmade.discard(conn)
        self.connections.discard(conn)

    def _tls_accepted(self, sock: socket.socket, peer: Any) -> None:
        if len(self._handshakes) >= self.max_handshakes:
            sock.close()
            self.handshakes_refused += 1
            metrics.DISCONNECTS.labels("tls_handshake_limit").inc()
            now = time.monotonic()
            if now - self._refused_logged > 10:
                self._refused_logged = now
                log.warning(
                    "replication listener: %d TLS handshakes in progress (the limit); closing new connections "
                    "at once (%d so far)", len(self._handshakes), self.handshakes_refused,
                )
            return
        task = asyncio.get_running_loop().create_task(self._handshake(sock, peer))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _accept_tls(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as err:  # e.g. out of file descriptors: wait, do not spin
                log.warning("replication listener: accept failed (%s)", err)
                await asyncio.sleep(0.1)
                continue
            self._tls_accepted(sock, peer)

    async def _handshake(self, sock: socket.socket, peer: Any) -> None:
        assert self.ssl is not None
        conn = self._protocol()
        try:
            # The connection's connection_made (hence counting it as a reader) comes once the handshake is done.
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: conn, sock, ssl=self.ssl, ssl_handshake_timeout=self.handshake_timeout
            )
        except asyncio.CancelledError:
            self._unmade.discard(conn)
            sock.close()
            raise
        except (OSError, _ssl.SSLError, TimeoutError, ConnectionError) as err:
            # A plaintext client, a scanner, a client refusing our certificate (or, with
            # client_cafile, one without a valid certificate of its own).
            self._unmade.discard(conn)
            sock.close()
            self.handshake_failures += 1
            metrics.DISCONNECTS.labels("tls_handshake").inc()
            log.info("replication listener: TLS handshake with %s failed (%s)", _peer_text(peer),
                     str(err) or type(err).__name__)

    async def start(self) -> TcpServer:
        """Start listening; ``self.port`` holds the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        if self.ssl is None:
            self._server = await loop.create_server(self._protocol, self.host, self.port, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]
        else:
            # TLS: accept sockets here and run each handshake as a bounded, timed task (see _handshake).
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            listener = socket.create_server((self.host, self.port), family=infos[0][0], backlog=1024)
            listener.setblocking(False)
            self._listener = listener
            self.port = listener.getsockname()[1]
            self._accept_task = loop.create_task(self._accept_tls(listener), name="factstream-tls-accept")
        _LISTENING.add(self)
        log.info("replication listening on %s:%d%s", self.host, self.port, " (TLS)" if self.ssl else "")
        return self

    async def stop(self, reason: str = "server stopping") -> None:
        """Stop listening, abort handshakes in progress and close every connection with ERROR ``reason``.

        Connections are closed together: the wait is one grace period in all,
        not one per connection.
        """
        if self._server is not None:
            self._server.close()
        if self._accept_task is not None:
            self._accept_task.cancel()
            try:
                await self._accept_task
            except asyncio.CancelledError:
                pass
            self._accept_task = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        handshakes = list(self._handshakes)
        for task in handshakes:
            task.cancel()
        for conn in list(self._unmade):
            conn.close(reason)  # made later, it aborts at once
        conns = list(self.connections)
        for conn in conns:
            conn.close(reason)
        waits: list[Any] = [asyncio.shield(conn.closed) for conn in conns] + handshakes
        if waits:
            await asyncio.wait(waits, timeout=_ABORT_GRACE + 1)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), _ABORT_GRACE + 1)
            except TimeoutError:
                log.warning("replication server stopped with connections still closing")
            self._server = None

    async def __aenter__(self) -> TcpServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _peer_text(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "a client"


class _ReaderCollector:
    """Per connected reader of every listening TcpServer, at scrape time: ``factstream_reader_*`` gauges."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["server", "name", "address"]
        since = GaugeMetricFamily("factstream_reader_connected_since_seconds",
                                  "When a reader connected (Unix time)", labels=labels)
        buffered = GaugeMetricFamily("factstream_reader_buffered_commands",
                                     "Commands waiting for a slow reader's socket", labels=labels)
        ping = GaugeMetricFamily("factstream_reader_last_ping_seconds",
                                 "When a reader last sent PING (Unix time; 0: never)", labels=labels)
        for server in list(_LISTENING):
            for info in server.connections_info():
                key = [server.server_name, str(info["name"] or ""), info["address"]]
                since.add_metric(key, info["connected_since"])
                buffered.add_metric(key, info["buffered"])
                ping.add_metric(key, info["last_ping"] or 0)
        yield since
        yield buffered
        yield ping


_LISTENING: weakref.WeakSet[TcpServer] = weakref.WeakSet()


def _register_reader_collector() -> None:
    from prometheus_client import REGISTRY

    REGISTRY.register(_ReaderCollector())


_register_reader_collector()


# ====================================================================== client


class TcpClient:
    """The reader end: keeps one connection to a writer, reconnecting forever with backoff."""

    def __init__(
        self,
        sink: CommandSink,
        host: str,
        port: int,
        *,
        client_name: str = "factstream",
        expected_server_name: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_line_length: int = wire.DEFAULT_MAX_LINE_LENGTH,
        backoff_initial: float = 0.1,
        backoff_max: float = 30.0,
        connect_timeout: float = 10.0,
        codec: Any = None,
        relay: Any = None,
    ) -> None:
        self.sink = sink
        self.host = host
        self.port = port
        self.client_name = client_name
        self.expected_server_name = expected_server_name
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.opts = dict(
            ping_interval=ping_interval, timeout=timeout, max_buffered=max_buffered, max_line_length=max_line_length,
            codec=codec, relay=relay,
        )
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.connection: TcpConnection | None = None
        self.connects = 0
        self.attempts = 0
        #: Why recent connections ended (newest last, at most 100).
        self.close_reasons: deque[str] = deque(maxlen=100)
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def start(self) -> TcpClient:
        """Start connecting (returns at once; see :meth:`wait_connected`)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"factstream-tcp-client-{self.port}")
        return self

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a connection is up."""
        await asyncio.wait_for(self._connected.wait(), timeout)

    @property
    def connected(self) -> bool:
        """True while a connection is up."""
        return self.connection is not None and self.connection.connected

    def next_delay(self, attempt: int) -> float:
        """Backoff before retry ``attempt`` (1-based): exponential, capped, with jitter."""
        return backoff_delay(attempt - 1, self.backoff_initial, self.backoff_max)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        target = f"{self.host}:{self.port}"
        attempt = 0
        while True:
            conn = TcpConnection(
                self.sink,
                is_server=False,
                local_name=self.client_name,
                expected_server_name=self.expected_server_name,
                **self.opts,
            )
            self.attempts += 1
            try:
                await asyncio.wait_for(
                    loop.create_connection(
                        lambda: conn, self.host, self.port, ssl=self.ssl,
                        server_hostname=self.server_hostname if self.ssl else None,
                    ),
                    self.connect_timeout,
                )
            except (OSError, TimeoutError, _ssl.SSLError) as err:
                attempt += 1
                delay = self.next_delay(attempt)
                log.info("replication connect to %s failed (%s); retrying in %.2fs", target, err, delay)
                metrics.RECONNECTS.labels(target).inc()
                await asyncio.sleep(delay)
                continue
            self.connection = conn
            self.connects += 1
            self._connected.set()
            reason = await asyncio.shield(conn.closed)
            self.close_reasons.append(reason)
            self._connected.clear()
            self.connection = None
            attempt = 0 if conn.handshake_done and reason != "server_name" else attempt + 1
            delay = self.next_delay(max(attempt, 1))
            log.info("replication connection to %s lost (%s); reconnecting in %.2fs", target, reason, delay)
            metrics.RECONNECTS.labels(target).inc()
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stop reconnecting and close the connection."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        conn = self.connection
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), _ABORT_GRACE + 1)
            except TimeoutError:
                pass
        self.connection = None

    async def __aenter__(self) -> TcpClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# ====================================================================== TLS


def server_ssl_context(certfile: str, keyfile: str | None = None, *, client_cafile: str | None = None) -> _ssl.SSLContext:
    """A listener context; with ``client_cafile`` clients must present a certificate signed by it."""
    ctx = _ssl.create_default_context(_ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    if client_cafile:
        ctx.load_verify_locations(client_cafile)
        ctx.verify_mode = _ssl.CERT_REQUIRED
    return ctx


def client_ssl_context(
    cafile: str | None = None, *, verify: bool = True, certfile: str | None = None, keyfile: str | None = None
) -> _ssl.SSLContext:
    """A client context verifying the server (against ``cafile`` or the system store) unless ``verify=False``."""
    ctx = _ssl.create_default_context(_ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if not verify:
        log.warning("TLS certificate verification is OFF for replication; anyone on the path can read and inject")
        ctx.check_hostname = False
        ctx.verify_mode = _ssl.CERT_NONE
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


# ====================================================================== fetch endpoint


class FetchError(FactstreamError):
    """The writer could not answer a catch-up fetch."""


class FetchServer:
    """Answers catch-up fetches for in-memory streams: one JSON line in, one out (loopback by default)."""

    def __init__(
        self, sources: Mapping[str, UpdateSource], *, host: str = "127.0.0.1", port: int = 0,
        ssl: _ssl.SSLContext | None = None, max_limit: int = 10_000,
    ) -> None:
        self.sources = dict(sources)
        self.host = host
        self.port = port
        self.ssl = ssl
        self.max_limit = max_limit
        self._server: asyncio.Server | None = None

    async def start(self) -> FetchServer:
        """Start listening; ``self.port`` is the bound port."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                writer.write(_json.dumps(await self._answer(line)).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line)
            stream, instance = str(req["stream"]), str(req["instance"])
            start, upto, limit = int(req["from"]), int(req["upto"]), min(int(req["limit"]), self.max_limit)
        except (ValueError, KeyError, TypeError) as err:
            return {"error": f"bad request: {err}"}
        source = self.sources.get(stream)
        if source is None:
            return {"error": f"stream {stream!r} is not served here (have: {', '.join(sorted(self.sources))})"}
        try:
            updates, upto_token, limited = await source.get_updates(instance, start, upto, limit)
        except Exception as err:
            return {"error": f"{type(err).__name__}: {err}"}
        return {
            "updates": [[t, r.to_wire() if isinstance(r, Row) else r] for t, r in updates],
            "upto": upto_token,
            "limited": limited,
        }


class RemoteUpdateSource:
    """An update source that asks a writer's :class:`FetchServer` (for in-memory streams)."""

    def __init__(
        self, stream: str, host: str, port: int, *, ssl: _ssl.SSLContext | None = None, timeout: float = 10.0
    ) -> None:
        self.stream = stream
        self.host = host
        self.port = port
        self.ssl = ssl
        self.timeout = timeout

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        req = {"stream": self.stream, "instance": instance_name, "from": from_token, "upto": upto_token, "limit": limit}
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 24), self.timeout
        )
        try:
            writer.write(_json.dumps(req).encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), self.timeout)
        finally:
            writer.close()
        if not line:
            raise FetchError(f"writer at {self.host}:{self.port} closed the fetch connection")
        answer = json.loads(line)
        if "error" in answer:
            raise FetchError(f"writer at {self.host}:{self.port} refused the fetch: {answer['error']}")
        return [(int(t), r) for t, r in answer["updates"]], int(answer["upto"]), bool(answer["limited"])
