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
  (a netcat session that never PINGs is never timed out, as in Synapse);
  a peer whose socket stays backed up (it reads nothing) for ``timeout``
  seconds is dropped, PING or not;
* validation: a command the peer may not send (server-only vs client-only
  lists), an unparseable, non-UTF-8 or over-long line gets ``ERROR <why>``
  and a close; the server never raises on a bad client; refused peers are
  logged naming them, at most a burst per window (``PEER_ERRORS``), the rest
  counted in one line; a TLS client on a plaintext listener, or a plaintext
  one on a TLS listener, is logged as such;
* congestion: while the socket is backed up, at most ``max_buffered``
  commands wait per connection; past that the peer is told it fell behind
  and disconnected (it reconnects and catches up from the database);
* fairness: one link handles at most ``COMMANDS_PER_TURN`` commands per turn
  of the event loop (``READER_COMMANDS_PER_TURN`` at a reader's end); a peer
  sending more has the rest handled in the next turns, in order, with
  reading from it paused meanwhile, so a client flooding the writer cannot
  hold its loop;
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

Each link is a :class:`~factstream.transport.tcp_connection.ServerConnection`
or :class:`~factstream.transport.tcp_connection.ClientConnection` (one
:class:`~factstream.transport.tcp_connection.ConnState` at a time). The fetch
side channel (:class:`FetchServer`, :class:`RemoteUpdateSource`) lives in
:mod:`factstream.transport.fetch` and is re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
import time
import weakref
from collections import deque
from collections.abc import Iterable
from typing import Any

from .. import _checks, metrics, wire
from ..errors import FactstreamError
from ..backoff import backoff_delay
from ..replication.carrier import CommandSink
from .fetch import FetchError, FetchServer, RemoteUpdateSource
from .tcp_connection import (
    PEER_ERRORS,
    _ABORT_GRACE,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_PING_INTERVAL,
    DEFAULT_TIMEOUT,
    ClientConnection,
    Codec,
    ConnState,
    Relay,
    ServerConnection,
    TcpConnection,
)

__all__ = [
    "TcpServer",
    "TcpClient",
    "TlsFileError",
    "TcpConnection",
    "ServerConnection",
    "ClientConnection",
    "ConnState",
    "FetchError",
    "FetchServer",
    "RemoteUpdateSource",
    "server_ssl_context",
    "client_ssl_context",
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_MAX_HANDSHAKES",
    "STOPPING",
]

log = logging.getLogger(__name__)

DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_MAX_HANDSHAKES = 256
#: The ERROR a stopping server closes its connections with (a reader can tell it from being dropped).
STOPPING = "server stopping"


def _link_options(ping_interval: float, timeout: float, max_buffered: int, max_line_length: int,
                  codec: Codec | None, relay: Relay | None) -> dict[str, Any]:
    """The options every connection of a server or client gets, checked once (a keepalive every 0 s
    would spin, a buffer of 0 commands drop every reader)."""
    return dict(ping_interval=_checks.seconds("ping_interval", ping_interval),
                timeout=_checks.seconds("timeout", timeout),
                max_buffered=_checks.whole("max_buffered", max_buffered),
                max_line_length=_checks.whole("max_line_length", max_line_length), codec=codec, relay=relay)


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
        codec: Codec | None = None,
        relay: Relay | None = None,
    ) -> None:
        handshake_timeout = _checks.seconds("handshake_timeout", handshake_timeout)
        _checks.whole("max_handshakes", max_handshakes)
        _checks.port("port", port)
        self.sink = sink
        self.server_name = server_name
        self.host = host
        self.port = port
        self.ssl = ssl
        self.handshake_timeout = handshake_timeout
        self.max_handshakes = max_handshakes
        self.opts = _link_options(ping_interval, timeout, max_buffered, max_line_length, codec, relay)
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

    def _protocol(self) -> ServerConnection:
        conn = ServerConnection(
            self.sink, local_name=self.server_name, on_close=self._closed_connection,
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
            reason = getattr(err, "reason", None)
            if reason in _PLAINTEXT_REASONS:
                # A reader without TLS: a mistake the operator should see (a scanner or a probe that
                # connects and closes stays at INFO); at most a few lines however many there are.
                PEER_ERRORS.log(logging.WARNING, "replication listener: %s spoke plaintext to this TLS listener "
                                "(a reader without --tls?); closing", _peer_text(peer))
            else:
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

    async def stop(self, reason: str = STOPPING) -> None:
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
        PEER_ERRORS.flush()
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


#: OpenSSL's reasons when the first bytes are no TLS record (a plaintext client, or an HTTP request).
_PLAINTEXT_REASONS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
                                "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})


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
        codec: Codec | None = None,
        relay: Relay | None = None,
    ) -> None:
        _checks.port("port", port)
        backoff_initial, backoff_max = _checks.backoff(backoff_initial, backoff_max)
        connect_timeout = _checks.seconds("connect_timeout", connect_timeout)
        self.sink = sink
        self.host = host
        self.port = port
        self.client_name = client_name
        self.expected_server_name = expected_server_name
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.opts = _link_options(ping_interval, timeout, max_buffered, max_line_length, codec, relay)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.connection: TcpConnection | None = None
        self.connects = 0
        self.attempts = 0
        #: Attempts that did not give a working link: no connection, or one closed before its handshake.
        self.failed_attempts = 0
        #: Connections that ended (their reasons: close_reasons).
        self.disconnects = 0
        #: Why recent connections ended (newest last, at most 100).
        self.close_reasons: deque[str] = deque(maxlen=100)
        #: The ERROR the server sent before it closed a connection, for those it sent one (at most 100).
        self.server_errors: deque[str] = deque(maxlen=100)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._connected = asyncio.Event()

    async def start(self) -> TcpClient:
        """Start connecting (returns at once; see :meth:`wait_connected`)."""
        if self._task is None:
            self._stopping = False
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
            conn = ClientConnection(
                self.sink,
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
            except asyncio.CancelledError:
                conn.close()  # stopped while connecting: a transport made at the last moment is aborted
                raise
            except (OSError, TimeoutError, _ssl.SSLError) as err:
                self.failed_attempts += 1
                attempt += 1
                delay = self.next_delay(attempt)
                log.info("replication connect to %s failed (%s); retrying in %.2fs", target, err, delay)
                metrics.RECONNECTS.labels(target).inc()
                await asyncio.sleep(delay)
                continue
            if self._stopping:  # stop() came as the connect completed (asyncio's wait_for may then drop the cancel)
                conn.close()
                return
            self.connection = conn
            self.connects += 1
            self._connected.set()
            reason = await asyncio.shield(conn.closed)
            self.close_reasons.append(reason)
            self.disconnects += 1
            if conn.peer_error is not None:
                self.server_errors.append(conn.peer_error)
            self._connected.clear()
            self.connection = None
            self.failed_attempts += not conn.handshake_done
            attempt = 0 if conn.handshake_done and reason != "server_name" else attempt + 1
            delay = self.next_delay(max(attempt, 1))
            log.info("replication connection to %s lost (%s); reconnecting in %.2fs", target, reason, delay)
            metrics.RECONNECTS.labels(target).inc()
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stop reconnecting and close the connection."""
        self._stopping = True
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


class TlsFileError(FactstreamError, ValueError):
    """A certificate, key or CA file that cannot be used, with which one and why."""


def _pem_holds(path: str, label: str) -> bool:
    """Whether ``path`` holds a PEM block whose label ends in ``label`` (unreadable: False)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return False
    return f"{label}-----".encode() in text and b"-----BEGIN " in text


def _encrypted_key(path: str) -> bytes:
    raise TlsFileError(
        f"the private key in {path} is encrypted (it has a passphrase), and a server cannot ask for one: "
        f"give a key without a passphrase (openssl pkey -in {path} -out plain-key.pem)"
    )


def load_cert_chain(ctx: _ssl.SSLContext, certfile: str, keyfile: str | None = None) -> None:
    """``ctx.load_cert_chain``, whose errors say which file is wrong and how (not "[SSL] PEM lib").

    An encrypted key is refused instead of prompting on the terminal for a
    passphrase (a service has none to type it into).
    """
    key = keyfile or certfile
    try:
        ctx.load_cert_chain(certfile, keyfile, password=lambda: _encrypted_key(key))
    except _ssl.SSLError as err:
        if "KEY_VALUES_MISMATCH" in str(err):
            raise TlsFileError(f"the private key in {key} does not belong to the certificate in {certfile}") from None
        if not _pem_holds(certfile, "CERTIFICATE"):
            raise TlsFileError(f"{certfile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
        if not _pem_holds(key, "PRIVATE KEY"):
            if keyfile is None:
                raise TlsFileError(f"{certfile} holds a certificate but no private key: give the key file "
                                   "too (--tls-key)") from None
            raise TlsFileError(f"{keyfile} holds no PEM private key (-----BEGIN PRIVATE KEY-----)") from None
        raise TlsFileError(f"cannot load {certfile}{' and ' + keyfile if keyfile else ''}: {err}") from None


def _no_ca(cafile: str | None, err: _ssl.SSLError) -> TlsFileError:
    return TlsFileError(f"{cafile} holds no PEM CA certificate ({err.reason or err})")


def load_ca_file(ctx: _ssl.SSLContext, cafile: str) -> None:
    """``ctx.load_verify_locations(cafile)``, whose error names the file."""
    try:
        ctx.load_verify_locations(cafile)
    except _ssl.SSLError as err:
        raise _no_ca(cafile, err) from None


def server_ssl_context(certfile: str, keyfile: str | None = None, *, client_cafile: str | None = None) -> _ssl.SSLContext:
    """A listener context; with ``client_cafile`` clients must present a certificate signed by it."""
    ctx = _ssl.create_default_context(_ssl.Purpose.CLIENT_AUTH)
    load_cert_chain(ctx, certfile, keyfile)
    if client_cafile:
        load_ca_file(ctx, client_cafile)
        ctx.verify_mode = _ssl.CERT_REQUIRED
    return ctx


def client_ssl_context(
    cafile: str | None = None, *, verify: bool = True, certfile: str | None = None, keyfile: str | None = None
) -> _ssl.SSLContext:
    """A client context verifying the server (against ``cafile`` or the system store) unless ``verify=False``."""
    try:  # with cafile, only it is trusted (not the system's store as well)
        ctx = _ssl.create_default_context(_ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except _ssl.SSLError as err:
        raise _no_ca(cafile, err) from None
    if not verify:
        log.warning("TLS certificate verification is OFF for replication; anyone on the path can read and inject")
        ctx.check_hostname = False
        ctx.verify_mode = _ssl.CERT_NONE
    if certfile:
        load_cert_chain(ctx, certfile, keyfile)
    return ctx


# ====================================================================== fetch endpoint
