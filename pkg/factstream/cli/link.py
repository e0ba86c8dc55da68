"""A raw replication link for the CLI's tools (``tail``, ``record``, ``status``, ``pub``).

Why not :class:`~factstream.transport.tcp.TcpClient`: that reader decodes
every row and reconnects forever, silently; a command-line tool wants the
bytes as they arrived (to print or record them as they are) and wants to
*fail* clearly when the peer is wrong. :func:`open_link` connects within a
deadline, sends NAME and PING, and insists that the first line it hears is
``SERVER <name>``: a TLS port spoken to in plaintext, an HTTP server, a
wrong server name or a silent peer each end with one :class:`LinkError`
naming the problem (``permanent`` when retrying cannot help).
"""

from __future__ import annotations

import asyncio
import errno
import ssl as _ssl
import time
from dataclasses import dataclass, field

from .. import wire
from ..errors import ProtocolError

__all__ = ["LinkError", "Link", "LinkOptions", "open_link", "parse_target", "utc_stamp"]


class LinkError(Exception):
    """The link could not be opened or was lost; ``permanent``: retrying will not help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def parse_target(target: str, prog: str = "factstream") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); a usage error (exit 2) otherwise."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        import sys

        print(f"{prog}: expected HOST:PORT (e.g. 127.0.0.1:9092), got {target!r}", file=sys.stderr)
        raise SystemExit(2)
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
