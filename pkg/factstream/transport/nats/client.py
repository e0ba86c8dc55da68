"""NATS plumbing: connecting, the JetStream API calls the carrier makes, and message headers.

nats-py's per-message machinery is bypassed on the hot paths (acks and
consumer deliveries handed over raw from its parser, publishes written as
ready-made frames); everything else goes through its public API.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...commands import Command
from ...errors import FactstreamError, ProtocolError
from ...redaction import redact_url
from .layout import PREV, JetStreamLayout, Retention
from .pages import decode_page

logger = logging.getLogger("factstream.transport.nats")

#: URL schemes nats-py speaks (tls:// and wss:// insist on TLS).
NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def _servers(url: str) -> list[str]:
    """The server URLs of ``url``; ValueError (saying what to write) for one nats-py would misread.

    nats-py takes ``http://h:4222`` as host "http" and a bad port as "invalid
    connect url option", both found only when connecting.
    """
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise ValueError("empty NATS URL (expected nats://host:port[,nats://host2:port2...])")
    for s in servers:
        scheme = s.split("://", 1)[0].lower() if "://" in s else ""
        if scheme not in NATS_SCHEMES:
            raise ValueError(f"bad NATS URL {redact_url(s)!r} (expected nats://host:port, tls://host:port for TLS, "
                             "or ws:// / wss://)")
        try:
            parts = urlsplit(s)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
        except ValueError:
            raise ValueError(f"bad NATS URL {redact_url(s)!r}: the port must be a number "
                             "(expected nats://host:port)") from None
        if not parts.hostname:
            raise ValueError(f"bad NATS URL {redact_url(s)!r}: no host (expected nats://host:port)")
    return servers


def _tls_not_offered(nc: Any, info: dict[str, Any]) -> str | None:
    """Why the server ``nc`` is connecting to cannot be used for a tls:// URL (None: it can).

    nats-py upgrades to TLS only when the server's INFO requires it: a
    ``tls://`` URL pointing at a plaintext port used to connect, and send the
    password, in the clear. A server that offers TLS without requiring it is
    upgraded; one that does not offer it is refused before anything is sent.
    """
    uri: Any = getattr(getattr(nc, "_current_server", None), "uri", None)
    if uri is None or uri.scheme != "tls" or info.get("tls_required") or nc.options.get("tls_handshake_first"):
        return None
    if info.get("tls_available"):
        info["tls_required"] = True  # nats-py reads this next, from the same dict, and upgrades
        return None
    return (f"the NATS server at {uri.hostname}:{uri.port} does not offer TLS, but the URL asks for it (tls://); "
            "nothing was sent: configure TLS on the server, or use nats:// to connect in plaintext")


async def connect_nats(url: str, *, name: str, timeout: float = 5.0, **callbacks: Any) -> Any:
    """One nats-py connection to ``url`` (comma-separated servers) that reconnects forever once made.

    The first connect tries each server twice and raises (nats-py would loop
    silently); the caller retries with its own logging.
    """

    async def _quiet(err: Exception) -> None:
        logger.debug("NATS: %s", err)

    options: dict[str, Any] = {
        "servers": _servers(url),
        "name": name,
        "connect_timeout": timeout,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "ping_interval": 5,
        "max_outstanding_pings": 3,
        "no_echo": True,
        "pending_size": 64 * 1024 * 1024,
        "error_cb": _quiet,
    }
    options.update(callbacks)
    forever = options["max_reconnect_attempts"] < 0
    if forever:
        options["max_reconnect_attempts"] = 1
    client = _client_class()
    if not _TLS_CHECKED and any(s.lower().startswith("tls://") for s in options["servers"]):
        raise ValueError("this nats-py version cannot be made to insist on TLS for a tls:// URL (it would connect "
                         "in plaintext to a server without TLS); install the nats-py version factstream supports")
    nc = client()
    await nc.connect(**options)
    if forever:
        nc.options["max_reconnect_attempts"] = -1  # from now on nats-py reconnects forever
    return nc


class NatsUnavailable(Exception):
    """NATS or its JetStream does not answer at the given URL (the message says what to do)."""


class StreamConfigError(FactstreamError):
    """JetStream refused to create the deployment's stream (an API error 400/500 with a description).

    ``code``, ``err_code`` and ``description`` are JetStream's; the message
    says what to change. ``permanent``: the configuration itself is refused
    (replicas on a single server, a duplicate window longer than max_age),
    so asking again gets the same answer; otherwise the server's state is in
    the way (another stream takes the subjects, a limit is reached), which an
    operator can fix while the carrier keeps asking. Not raised for a server
    that is down, slow or still forming a cluster.
    """

    def __init__(self, stream: str, code: int, err_code: int, description: str, hint: str,
                 permanent: bool = True) -> None:
        super().__init__(f"JetStream refused to create stream {stream}: {description} "
                         f"(error {code}, err_code {err_code}); {hint}")
        self.stream = stream
        self.code = code
        self.err_code = err_code
        self.description = description
        self.permanent = permanent


#: err_codes of a 400/500 answer that pass on their own while a cluster forms or elects a leader
#: (no peers for placement yet, not assigned, not the leader, a raft hiccup): retried as "not available yet".
_PASSING_ERRORS = frozenset({10005, 10007, 10009, 10041})

#: err_codes about the server's state, not the configuration asked for (err_code -> what to do):
#: reported as errors and asked again, since they can be fixed on the server while the carrier waits.
_SERVER_STATE_HINTS = {
    10065: "another stream already takes the subjects {subjects}: delete it, or pass another subject_prefix",
    10027: "the account's limit of streams is reached: delete unused streams or raise the limit",
    10002: "the account's JetStream limits are reached: raise them, or lower Retention(max_bytes=...)",
    10047: "the server lacks storage for the stream: free some, or lower Retention(max_bytes=...)",
    10028: "the server lacks memory for the stream: free some, or use Retention(storage='file')",
}

#: What to do about the configuration errors met in practice (err_code -> hint).
_CONFIG_HINTS = {
    10074: "use Retention(replicas=1) on a single server (factstream serve: --nats-replicas 1), "
           "or run a JetStream cluster",
    10052: "fix the Retention options (duplicate_window must not be longer than a non-zero max_age)",
}


def _refused(stream: str, subjects: str, err: _ApiError) -> StreamConfigError | None:
    """The StreamConfigError for a refused STREAM.CREATE, or None when ``err`` is worth retrying quietly."""
    if err.code not in (400, 500) or err.err_code in _PASSING_ERRORS:
        return None
    state = _SERVER_STATE_HINTS.get(err.err_code)
    if state is not None:
        return StreamConfigError(stream, err.code, err.err_code, err.description, state.format(subjects=subjects),
                                 permanent=False)
    hint = _CONFIG_HINTS.get(err.err_code, "change the Retention options (or the server's JetStream "
                             "configuration) and start again; asking again gets the same answer")
    return StreamConfigError(stream, err.code, err.err_code, err.description, hint)


async def check_nats(url: str, server_name: str, timeout: float = 5.0) -> None:
    """Fail fast for a command line: ValueError for a malformed URL or server name, NatsUnavailable otherwise.

    The carrier itself reconnects forever (right for a running process riding
    out a NATS restart); a command started against a wrong URL, a server that
    is not running or one without JetStream should say so at once instead.
    """
    servers = _servers(url)
    JetStreamLayout.for_server(server_name)
    shown = redact_url(url)
    seen: list[BaseException] = []

    async def _note(err: Exception) -> None:
        seen.append(err)

    try:
        nc = await connect_nats(url, name="factstream-check", timeout=timeout, allow_reconnect=False,
                                max_reconnect_attempts=1, error_cb=_note)
    except Exception as err:  # noqa: BLE001 - every failure to connect is said in words below
        raise NatsUnavailable(_why_unreachable(shown, servers, [*seen, err], timeout)) from None
    try:
        try:
            await _Api(nc, JetStreamLayout.for_server(server_name), timeout).request("INFO")
        except Exception as err:  # noqa: BLE001
            raise NatsUnavailable(f"NATS at {shown} answers but JetStream does not ({err or type(err).__name__}); "
                                  "start nats-server with -js (JetStream enabled)") from None
    finally:
        await nc.close()


def _why_unreachable(shown: str, servers: list[str], errors: list[BaseException], timeout: float) -> str:
    """What a failed first connect means and what to do, from the errors nats-py met (the last one first).

    nats-py ends most failures with "no servers available for connection";
    the error behind it (a refused credential, an unknown host, nothing
    listening) is what the user can act on.
    """
    def has(kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
        return next((e for e in reversed(errors) if isinstance(e, kind)), None)

    text = [str(e) for e in errors]
    tls = next((t for t in text if "does not offer TLS" in t), None)
    if tls is not None:
        return f"cannot use NATS at {shown}: {tls}"
    if any("Authorization Violation" in t or "Authentication" in t for t in text):
        if any("@" in urlsplit(s).netloc for s in servers):
            return (f"NATS at {shown} refused the credentials (Authorization Violation); check the user and "
                    "password (nats://USER:PASSWORD@host:port) or token (nats://TOKEN@host:port) in the --nats URL")
        return (f"NATS at {shown} requires credentials (Authorization Violation); put them in the --nats URL: "
                "nats://USER:PASSWORD@host:port or nats://TOKEN@host:port")
    import socket

    unknown = has(socket.gaierror)
    if unknown is not None and not has((ConnectionRefusedError, TimeoutError)):
        hosts = ", ".join(sorted({repr(urlsplit(s).hostname) for s in servers}))
        return (f"cannot reach NATS at {shown}: unknown host {hosts} ({getattr(unknown, 'strerror', None) or unknown}); "
                "check the host in the --nats URL")
    if has(ConnectionRefusedError) and not has(TimeoutError):
        return (f"cannot reach NATS at {shown}: nothing listens there (connection refused); start it with "
                "JetStream (e.g. nats-server -js -p 4222) or pass the right --nats URL")
    if has(TimeoutError):
        return (f"cannot reach NATS at {shown}: no answer within {timeout:g}s (--connect-timeout); is it a NATS "
                "port? (a NATS server greets at once)")
    last = errors[-1]
    why = redact_url(str(last) or type(last).__name__)
    return (f"cannot reach NATS at {shown} ({why}); start it with JetStream (e.g. nats-server -js -p 4222) "
            "or pass the right --nats URL")


async def delete_stream(url: str, server_name: str, *, stream: str | None = None) -> bool:
    """Delete deployment ``server_name``'s JetStream stream (its whole log); False when there was none."""
    layout = JetStreamLayout.for_server(server_name, stream=stream)
    nc = await connect_nats(url, name="factstream-admin", allow_reconnect=False, max_reconnect_attempts=1)
    try:
        await _Api(nc, layout).request(f"STREAM.DELETE.{layout.stream}")
        return True
    except _ApiError as err:
        if err.code == 404:
            return False
        raise
    finally:
        await nc.close()


#: ``handler(subject, reply, data, raw_headers)`` for the messages of one subscription, called
#: synchronously from nats-py's parser (no Msg object, no queue, no task per message).
FastHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]

_CLIENT: Any = None
#: Whether _CLIENT checks a new connection's INFO against a tls:// URL (nats-py's internals as expected).
_TLS_CHECKED = False


def _client_class() -> Any:
    """nats-py's ``Client`` with a fast path for the carrier's hot subscriptions (acks and deliveries).

    nats-py turns every message into a ``Msg`` with parsed headers, queues it
    and awaits a callback in a task: a few times the cost of what the carrier
    does with it. Subscriptions registered with :func:`_fast_subscribe` get
    their data messages handed over raw instead; status messages (JetStream
    heartbeats, flow control) still take nats-py's own path. Each new
    connection's INFO is checked against a tls:// URL (:func:`_tls_not_offered`).
    If nats-py's internals change, the fast path is simply not installed, and
    without the INFO check tls:// URLs are refused (:func:`connect_nats`).
    """
    global _CLIENT, _TLS_CHECKED
    if _CLIENT is not None:
        return _CLIENT
    from nats.aio.client import Client
    from nats.errors import Error as NatsError

    class TlsNotOffered(NatsError):
        """A tls:// URL met a server without TLS (a nats-py Error, so its connect loop moves on)."""

    class FastClient(Client):
        def __init__(self) -> None:
            super().__init__()
            self.factstream_fast: dict[int, FastHandler] = {}

        async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
            if initial_connection:  # the INFO of a new connection, before nats-py decides on TLS and sends CONNECT
                refused = _tls_not_offered(self, info)
                if refused is not None:
                    raise TlsNotOffered(refused)
            await super()._process_info(info, initial_connection)

        async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                               headers: bytes | None) -> None:
            fast = self.factstream_fast.get(sid)
            if fast is not None and not (headers and headers[8:9] == b" "):
                self.stats["in_msgs"] += 1
                self.stats["in_bytes"] += len(data)
                fast(subject, reply, data, headers)
                return
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]

    import inspect

    _TLS_CHECKED = list(inspect.signature(Client._process_info).parameters) == ["self", "info", "initial_connection"]
    if not _TLS_CHECKED:
        del FastClient._process_info
    params = inspect.signature(Client._process_msg).parameters
    if list(params)[:6] != ["self", "sid", "subject", "reply", "data", "headers"]:
        del FastClient._process_msg  # nats-py's own message path
    _CLIENT = FastClient
    return _CLIENT


async def _fast_subscribe(nc: Any, subject: str, handler: FastHandler, cb: Callable[[Any], Awaitable[None]]) -> Any:
    """Subscribe with ``cb`` (nats-py's path), and ``handler`` for data messages when the fast path exists."""
    sub = await nc.subscribe(subject, cb=cb)
    fast = getattr(nc, "factstream_fast", None)
    sid = getattr(sub, "_id", None)
    if isinstance(fast, dict) and isinstance(sid, int):
        fast[sid] = handler
    return sub


def _can_write_frames(nc: Any) -> bool:
    return callable(getattr(nc, "_send_command", None)) and callable(getattr(nc, "_flush_pending", None))


def _raw_headers(msg_id: str, prev: str) -> bytes:
    return b"NATS/1.0\r\nNats-Msg-Id: %s\r\nFs-Prev: %s\r\n\r\n" % (msg_id.encode(), prev.encode())


def _parse_headers(raw: bytes) -> dict[str, str]:
    """Headers of a stored message (``NATS/1.0\\r\\nK: V\\r\\n...``)."""
    out: dict[str, str] = {}
    if not raw:
        return out
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


@dataclass
class _Stored:
    """One message read back from the stream by sequence or subject."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: str = ""  #: when JetStream stored it (RFC 3339, UTC)


class _Api:
    """The few JetStream API requests the carrier makes, with typed errors."""

    def __init__(self, nc: Any, layout: JetStreamLayout, timeout: float = 5.0) -> None:
        self.nc = nc
        self.layout = layout
        self.timeout = timeout

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        payload = b"" if body is None else json.dumps(body).encode()
        msg = await self.nc.request(f"$JS.API.{subject}", payload, timeout=self.timeout)
        if msg.headers and msg.headers.get("Status") == "503":
            raise _ApiError(503, "JetStream is not available (no responders)")
        resp: dict[str, Any] = json.loads(msg.data)
        err = resp.get("error")
        if err:
            raise _ApiError(int(err.get("code", 0)), str(err.get("description", err)), int(err.get("err_code", 0)))
        return resp

    async def ensure_stream(self, retention: Retention) -> dict[str, Any]:
        """The stream's info, creating it with ``retention`` when it does not exist.

        Raises :class:`StreamConfigError` when JetStream refuses to create
        it, and the other errors (timeouts, 503, a cluster electing) for the
        caller to retry.
        """
        name = self.layout.stream
        try:
            info = await self.request(f"STREAM.INFO.{name}")
        except _ApiError as err:
            if err.code != 404:
                raise
            try:
                info = await self.request(f"STREAM.CREATE.{name}", retention.stream_config(self.layout))
                logger.info("created JetStream stream %s (%d replicas, %s storage)", name, retention.replicas,
                            retention.storage)
            except _ApiError as err2:
                if err2.err_code == 10058:  # created concurrently by another instance
                    return await self.request(f"STREAM.INFO.{name}")
                refused = _refused(name, self.layout.log_subjects, err2)
                if refused is not None:
                    raise refused from None
                raise
        return info

    async def subjects(self) -> tuple[dict[str, int], int, int]:
        """(subject -> message count, first sequence, last sequence) of the stream."""
        subjects: dict[str, int] = {}
        offset = 0
        while True:
            info = await self.request(
                f"STREAM.INFO.{self.layout.stream}", {"subjects_filter": self.layout.log_subjects, "offset": offset}
            )
            state = info.get("state", {})
            page = state.get("subjects") or {}
            subjects.update(page)
            offset += len(page)
            total = int(info.get("total", 0) or 0)
            if not page or offset >= total:
                return subjects, int(state.get("first_seq", 0)), int(state.get("last_seq", 0))

    async def get(self, *, seq: int | None = None, last_by_subject: str | None = None,
                  next_by_subject: str | None = None) -> _Stored | None:
        """A stored message, or None when there is none."""
        body: dict[str, Any] = {}
        if last_by_subject is not None:
            body["last_by_subj"] = last_by_subject
        else:
            body["seq"] = seq
            if next_by_subject is not None:
                body["next_by_subj"] = next_by_subject
        try:
            resp = await self.request(f"STREAM.MSG.GET.{self.layout.stream}", body)
        except _ApiError as err:
            if err.code == 404:
                return None
            raise
        m = resp["message"]
        hdrs = _parse_headers(base64.b64decode(m["hdrs"])) if m.get("hdrs") else {}
        data = base64.b64decode(m["data"]) if m.get("data") else b""
        return _Stored(int(m["seq"]), m["subject"], data, hdrs, str(m.get("time", "")))

    async def last_page(self, subject: str) -> tuple[_Stored | None, list[Command]]:
        """The last message on ``subject`` and its commands ([] when it does not decode; (None, []) when none)."""
        last = await self.get(last_by_subject=subject)
        if last is None:
            return None, []
        try:
            return last, decode_page(last.data)
        except ProtocolError:
            return last, []

    async def create_consumer(self, config: dict[str, Any]) -> str:
        resp = await self.request(
            f"CONSUMER.CREATE.{self.layout.stream}", {"stream_name": self.layout.stream, "config": config}
        )
        return str(resp["name"])

    async def consumers(self) -> list[dict[str, Any]]:
        """Every consumer of the stream (JetStream's ConsumerInfo documents)."""
        out: list[dict[str, Any]] = []
        while True:
            resp = await self.request(f"CONSUMER.LIST.{self.layout.stream}", {"offset": len(out)})
            page = resp.get("consumers") or []
            out.extend(page)
            if not page or len(out) >= int(resp.get("total", 0) or 0):
                return out

    async def delete_consumer(self, name: str) -> None:
        try:
            await self.request(f"CONSUMER.DELETE.{self.layout.stream}.{name}")
        except Exception:  # noqa: BLE001 - best effort; an ephemeral consumer also expires by itself
            pass


class _ApiError(Exception):
    def __init__(self, code: int, description: str, err_code: int = 0) -> None:
        super().__init__(f"JetStream error {code}: {description}")
        self.code = code
        self.err_code = err_code
        self.description = description


def _prev_of(headers: dict[str, str] | None) -> int | None:
    raw = (headers or {}).get(PREV)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None
