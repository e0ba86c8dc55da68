"""A raw replication link for the CLI's tools (``tail``, ``record``, ``status``, ``pub``).

Why not :class:`~factstream.transport.tcp.TcpClient`: that reader decodes
every row and reconnects forever, silently; a command-line tool wants the
bytes as they arrived (to print or record them as they are) and wants to
*fail* clearly when the peer is wrong. :func:`open_link` connects within a
deadline, sends NAME and PING, and insists that the first line it hears is
``SERVER <name>``: a TLS port spoken to in plaintext, an HTTP server, a
wrong server name or a silent peer each end with one :class:`LinkError`
naming the problem (``permanent`` when retrying cannot help).

The same tools reach Redis and NATS deployments too: :func:`check_redis`
and :func:`check_nats` fail fast with what to do (a refused password, an
unknown host, a database index Redis lacks); :func:`parse_target` refuses a
URL given where ``HOST:PORT`` belongs, and :func:`refuse_tls_options` the
TCP TLS options given with a carrier that takes TLS in its URL.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl as _ssl
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .. import wire
from ..errors import ProtocolError
from ..redaction import redact_url

__all__ = ["LinkError", "Link", "LinkOptions", "connect_within", "open_link", "parse_target", "target_problem", "utc_stamp",
           "check_nats", "check_redis", "cli_exit", "redis_failure", "refuse_tls_options"]

log = logging.getLogger("factstream.link")


class LinkError(Exception):
    """The link could not be opened or was lost; ``permanent``: retrying will not help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


#: scheme -> the option that takes a URL of it, for a URL given where HOST:PORT belongs.
_URL_OPTIONS = {"redis": "--redis", "rediss": "--redis", "unix": "--redis", "nats": "--nats", "tls": "--nats",
                "ws": "--nats", "wss": "--nats", "postgresql": "--db", "postgres": "--db", "sqlite": "--db"}
#: The URL options of each command taking HOST:PORT (a URL for another one is named as unsupported).
_COMMAND_URL_OPTIONS = {
    "factstream tail": ("--redis", "--nats", "--db"), "factstream record": ("--redis", "--nats"),
    "factstream status": ("--redis", "--nats"), "factstream pub": ("--redis",),
    "factstream positions": ("--redis", "--db"),
}


def target_problem(target: str, prog: str = "factstream") -> str | None:
    """Why ``target`` is not a ``HOST:PORT`` (password masked), or None when it is one.

    A URL typed without its option (``tail redis://:pw@host:6379``) parses as
    host ``redis://:pw@host``: it used to be looked up as a host name (after
    the whole --connect-timeout) and echoed with its password, or turned into
    a capture name.
    """
    shown = redact_url(target)
    if "://" in target:
        option = _URL_OPTIONS.get(target.split("://", 1)[0].lower())
        takes = _COMMAND_URL_OPTIONS.get(prog, ("--redis", "--nats", "--db"))
        if option is not None and option in takes:
            return f"{shown!r} is a URL: use {option} URL (or HOST:PORT for a TCP writer)"
        also = " or ".join(f"{o} URL" for o in takes)
        return f"{shown!r} is a URL; {prog} takes HOST:PORT of a TCP writer (e.g. 127.0.0.1:9092)" + (
            f" or {also}" if also else "")
    host, sep, port = target.rpartition(":")
    if "@" in host:
        return (f"{shown!r} holds a user or password; a TCP writer is given as HOST:PORT only "
                "(for Redis use --redis redis://:PASSWORD@HOST:PORT, for NATS --nats nats://USER:PASSWORD@HOST:PORT)")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return f"expected HOST:PORT (e.g. 127.0.0.1:9092), got {shown!r}"
    return None


def parse_target(target: str, prog: str = "factstream") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); a usage error (exit 2) otherwise."""
    problem = target_problem(target, prog)
    if problem is not None:
        cli_exit(prog, problem, 2)
    host, _, port = target.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def utc_stamp(t: float | None = None) -> str:
    """ISO-8601 UTC with microseconds and Z, the recorder's line prefix."""
    t = time.time() if t is None else t
    whole = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((t - whole) * 1e6):06d}Z"


@dataclass
class LinkOptions:
    """How to reach a writer's replication listener."""

    host: str
    port: int
    client_name: str = "factstream-cli"
    expected_server_name: str | None = None
    ssl: _ssl.SSLContext | None = None
    connect_timeout: float = 10.0
    ping_interval: float = 5.0
    timeout: float = 15.0
    replicate: bool = True
    extra: list[bytes] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


class Link:
    """One open connection: :meth:`read` gives raw chunks of whole lines; PINGs are sent for you."""

    def __init__(self, opts: LinkOptions, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 server_name: str, first: list[bytes]) -> None:
        self.opts = opts
        self.reader = reader
        self.writer = writer
        self.server_name = server_name
        self.sent: list[bytes] = list(first)  # what we sent, for recorders (NAME, PING, REPLICATE)
        self._rest = b""
        self._last_recv = time.monotonic()
        self._peer_pinged = False
        self._pinger = asyncio.get_running_loop().create_task(self._keepalive())
        self.on_sent: list[object] = []

    def send_lines(self, lines: list[bytes]) -> None:
        """Send complete lines (no newline) as they are."""
        self.writer.write(b"".join(line + b"\n" for line in lines))
        for cb in self.on_sent:
            cb(lines)  # type: ignore[operator]

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.opts.ping_interval)
            try:
                self.send_lines([f"PING {int(time.time() * 1000)}".encode()])
                await self.writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                return

    async def read(self) -> bytes:
        """The next chunk of complete lines (each ending in newline); LinkError when the link ends."""
        while True:
            budget = self.opts.timeout if self._peer_pinged else None
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 16), budget)
            except TimeoutError:
                raise LinkError(f"{self.opts.target} sent nothing for {self.opts.timeout:g}s") from None
            except (ConnectionError, OSError) as err:
                raise LinkError(f"connection to {self.opts.target} lost: {err}") from None
            if not data:
                raise LinkError(f"{self.opts.target} closed the connection")
            self._last_recv = time.monotonic()
            if not self._peer_pinged and b"PING " in data:
                self._peer_pinged = True
            cut = data.rfind(b"\n")
            if cut < 0:
                self._rest += data
                continue
            chunk = self._rest + data[: cut + 1] if self._rest else data[: cut + 1]
            self._rest = data[cut + 1 :]
            return chunk

    async def close(self) -> None:
        self._pinger.cancel()
        try:
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)
        except (ConnectionError, OSError, TimeoutError, _ssl.SSLError):
            pass


def _why(err: BaseException, opts: LinkOptions) -> LinkError:
    """A connect failure as a one-line LinkError (permanent when retrying cannot help)."""
    target = opts.target
    if isinstance(err, _ssl.SSLCertVerificationError):
        return LinkError(f"TLS certificate of {target} not trusted: {err.verify_message or err} "
                         "(pass --cafile CA.pem, or --insecure to skip verification)", permanent=True)
    if isinstance(err, _ssl.SSLError):
        hint = " (is it a plaintext port? drop --tls)" if "WRONG_VERSION" in str(err).upper() else ""
        return LinkError(f"TLS handshake with {target} failed: {err.reason or err}{hint}", permanent=True)
    if isinstance(err, TimeoutError):
        return LinkError(f"cannot connect to {target}: no answer within {opts.connect_timeout:g}s "
                         "(--connect-timeout)")
    if isinstance(err, socket.gaierror) and err.errno != socket.EAI_AGAIN:
        return LinkError(f"cannot connect to {target}: unknown host {opts.host!r} ({err.strerror or err}); "
                         "check the HOST of HOST:PORT", permanent=True)
    if isinstance(err, OSError) and err.errno == errno.ECONNREFUSED:
        return LinkError(f"cannot connect to {target}: connection refused (is a replication listener "
                         "running there? e.g. factstream serve --port PORT)")
    return LinkError(f"cannot connect to {target}: {getattr(err, 'strerror', None) or err}")


async def _greeting(reader: asyncio.StreamReader, opts: LinkOptions, deadline: float) -> str:
    """Read the first line and insist it is SERVER; its name."""
    target = opts.target
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), max(0.01, deadline - time.monotonic()))
    except TimeoutError:
        raise LinkError(f"{target} accepted the connection but sent no SERVER greeting within "
                        f"{opts.connect_timeout:g}s: not a replication listener?", permanent=True) from None
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            hint = " (is it a TLS port? add --tls)" if opts.ssl is None else ""
            raise LinkError(f"{target} closed the connection without a SERVER greeting{hint}",
                            permanent=True) from None
        line = err.partial
    except asyncio.LimitOverrunError:
        raise LinkError(f"{target} does not speak the replication protocol (no line break in its first "
                        "64 KiB)", permanent=True) from None
    except (ConnectionError, OSError, _ssl.SSLError) as err:
        raise LinkError(f"connection to {target} failed during the handshake: {err}", permanent=True) from None
    shown = line[:60].decode("utf-8", "replace").strip()
    try:
        cmd = wire.parse_line(line.rstrip(b"\r\n"))
    except ProtocolError:
        cmd = None
    if not isinstance(cmd, wire.ServerCommand):
        raise LinkError(f"{target} does not speak the replication protocol: its first line was {shown!r}, "
                        "expected 'SERVER <name>'", permanent=True)
    name = cmd.data
    if opts.expected_server_name is not None and name != opts.expected_server_name:
        raise LinkError(f"{target} is server {name!r}, not {opts.expected_server_name!r} (--server-name)",
                        permanent=True)
    return name


async def open_link(opts: LinkOptions) -> Link:
    """Connect, greet (NAME, PING) and check SERVER within ``connect_timeout``; REPLICATE if asked."""
    deadline = time.monotonic() + opts.connect_timeout
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(opts.host, opts.port, ssl=opts.ssl,
                                    server_hostname=opts.host if opts.ssl else None, limit=1 << 16),
            opts.connect_timeout,
        )
    except (OSError, TimeoutError, _ssl.SSLError) as err:
        raise _why(err, opts) from None
    first = [f"NAME {opts.client_name}".encode(), f"PING {int(time.time() * 1000)}".encode()]
    try:
        writer.write(b"".join(line + b"\n" for line in first))
        name = await _greeting(reader, opts, deadline)
    except BaseException:
        writer.close()
        raise
    link = Link(opts, reader, writer, name, first)
    more = [*opts.extra, b"REPLICATE"] if opts.replicate else list(opts.extra)
    if more:
        link.send_lines(more)
        link.sent.extend(more)
    return link


def cli_exit(prog: str, message: str, status: int) -> NoReturn:
    """Print ``prog: message`` on stderr and exit with ``status`` (2: usage, 1: environment)."""
    import sys

    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(status)


def refuse_tls_options(args: Any, prog: str) -> None:
    """Exit 2 when --tls/--cafile/--insecure (TCP's) come with --redis or --nats, where they would do nothing.

    TLS to Redis is asked for in its URL (rediss://), to NATS in its URL
    (tls://); taking the options and connecting in plaintext anyway let a
    user believe the link was encrypted.
    """
    given = [flag for flag, dest in (("--tls", "tls"), ("--cafile", "cafile"), ("--insecure", "insecure"))
             if getattr(args, dest, None)]
    if not given:
        return
    flags = f"{'/'.join(given)} {'applies' if len(given) == 1 else 'apply'} only to TCP"
    if getattr(args, "redis", None):
        cli_exit(prog, f"{flags}; for Redis over TLS use a rediss:// URL "
                       "(e.g. rediss://host:6380?ssl_ca_certs=/path/ca.pem)", 2)
    if getattr(args, "nats", None):
        cli_exit(prog, f"{flags}; for NATS over TLS use a tls:// URL "
                       "(e.g. --nats tls://host:4222)", 2)


def redis_failure(shown: str, url: str, err: BaseException, timeout: float) -> str:
    """What a failed connect + PING to the Redis at ``url`` means and what to do (``shown``: url, masked)."""
    from urllib.parse import urlsplit

    from redis.exceptions import AuthenticationError, AuthenticationWrongNumberOfArgsError, InvalidResponse
    from redis.exceptions import ResponseError

    parts = urlsplit(url)
    said = str(err).rstrip(".")
    if isinstance(err, (AuthenticationError, AuthenticationWrongNumberOfArgsError)):
        if "without any password configured" in said or "no password is set" in said:
            return (f"Redis at {shown} has no password set, but the URL gives one: remove it from the --redis URL "
                    "(redis://HOST:PORT), or set one on the server (requirepass)")
        if "NOAUTH" in said or "Authentication required" in said:
            return f"Redis at {shown} requires a password: put it in the --redis URL (redis://:PASSWORD@HOST:PORT)"
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        if userinfo and ":" not in userinfo:
            return (f"Redis at {shown} refused the credentials ({said}); a password goes after a colon: "
                    "redis://:PASSWORD@HOST:PORT ('redis://WORD@' sends WORD as a user name)")
        return (f"Redis at {shown} refused the credentials ({said}); put the right password in the --redis URL "
                "(redis://:PASSWORD@HOST:PORT, or redis://USER:PASSWORD@HOST:PORT for an ACL user)")
    if isinstance(err, ResponseError) and "DB index is out of range" in said:
        return (f"Redis at {shown} has no database {parts.path.strip('/') or '?'} (DB index is out of range); "
                "drop the /N from the --redis URL: channels are the same in every database")
    if isinstance(err, InvalidResponse):
        return f"{shown} does not answer as Redis does ({said}): is it another service's port?"
    if isinstance(err, TimeoutError):
        if parts.scheme.lower() == "rediss":
            return (f"cannot reach Redis at {shown}: no TLS handshake within {timeout:g}s (--connect-timeout); "
                    "is it a plaintext port? then use redis://")
        return f"cannot reach Redis at {shown}: no answer within {timeout:g}s (--connect-timeout)"
    cause = err.__context__ if err.__context__ is not None else err
    if isinstance(cause, socket.gaierror):
        return (f"cannot reach Redis at {shown}: unknown host {parts.hostname!r} ({cause.strerror or cause}); "
                "check the host in the --redis URL")
    if isinstance(cause, ConnectionRefusedError):
        return (f"cannot reach Redis at {shown}: nothing listens there (connection refused); start Redis there "
                "(e.g. redis-server --port 6379) or pass the right --redis URL")
    if isinstance(cause, _ssl.SSLError):
        hint = " (is it a plaintext port? then use redis://)" if "WRONG_VERSION" in str(cause).upper() else ""
        return f"TLS with Redis at {shown} failed: {getattr(cause, 'reason', None) or cause}{hint}"
    return (f"cannot reach Redis at {shown} ({said or type(err).__name__}); start Redis there "
            "(e.g. redis-server --port 6379) or pass the right --redis URL")


async def check_redis(url: str, server_name: str, prog: str, timeout: float = 5.0) -> None:
    """Exit with a message saying what to do when ``url`` is malformed or Redis does not answer.

    The carrier itself reconnects forever (right for a running process riding
    out a Redis restart); a command started against a wrong URL or a Redis
    that is not running should say so at once instead.
    """
    from redis.exceptions import RedisError

    from ..transport.redis import RedisChannels, connection_kwargs_from_url

    shown = redact_url(url)
    try:
        RedisChannels.for_server(server_name)
    except ValueError as err:
        cli_exit(prog, f"--server-name: {err} (it names the Redis channel)", 2)
    try:
        cls, kwargs = connection_kwargs_from_url(url)
        conn = cls(**{"protocol": 2, "socket_connect_timeout": timeout, "retry": None, "retry_on_error": [], **kwargs})
    except (ValueError, TypeError) as err:
        what = str(err) if isinstance(err, ValueError) else f"unsupported option in Redis URL {shown!r}: {err}"
        cli_exit(prog, f"{what} (expected redis://[[user]:password@]host[:port][/db], rediss://... or "
                       "unix:///path/to/redis.sock; percent-encode special characters in the password)", 2)
    try:
        async with asyncio.timeout(timeout):
            await conn.connect()  # type: ignore[no-untyped-call]  # redis-py: AbstractConnection.connect() is unannotated
            await conn.send_command("PING")
            await conn.read_response()
    except (RedisError, OSError, TimeoutError) as err:
        cli_exit(prog, redis_failure(shown, url, err, timeout), 1)
    finally:
        try:
            await conn.disconnect()
        except Exception:  # noqa: BLE001 - closing a socket that never opened may fail any way
            pass


async def check_nats(url: str, server_name: str, prog: str, timeout: float = 5.0) -> None:
    """Exit with a message saying what to do when ``url`` is malformed (2) or no JetStream answers there (1)."""
    from ..transport.nats import NatsUnavailable
    from ..transport.nats import check_nats as check

    try:
        await check(url, server_name, timeout)
    except ValueError as err:
        cli_exit(prog, str(err), 2)
    except NatsUnavailable as err:
        cli_exit(prog, str(err), 1)


async def connect_within(opts: LinkOptions, *, quiet: bool = False) -> Any:
    """open_link, retrying a refused/failed connect with backoff until ``connect_timeout``; LinkError after."""
    deadline = time.monotonic() + opts.connect_timeout
    delay = 0.05
    while True:
        try:
            return await open_link(opts)
        except LinkError as err:
            left = deadline - time.monotonic()
            if err.permanent or left <= delay:
                raise
            if not quiet:
                log.info("%s; retrying for %.1fs more", err, left)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
