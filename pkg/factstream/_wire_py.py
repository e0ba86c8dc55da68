"""Pure-Python twin of the wire codec: the readable specification.

Same public names and behaviour as the compiled ``_wire_c``; this module is
also the typing source for it. Synapse's framing: ``NAME``, one space, body;
the body is split per command. Where Synapse is lax by accident we are strict
(see docs/codec.md, "Differences from Synapse").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from json.encoder import JSONEncoder, c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, cast

from . import _json
from ._wire_args import check_publish_args, chunk_bytes
from .commands import (
    ClearUserSyncsCommand,
    Command,
    FederationAckCommand,
    LockReleasedCommand,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    UserIpCommand,
    UserSyncCommand,
    COMMAND_MAP,
)
from .errors import ProtocolError

__all__ = [
    "parse_line", "encode", "encode_lines", "encode_redis_publish", "LineDecoder", "DEFAULT_MAX_LINE_LENGTH",
    "column_text", "ColumnParams",
]

#: Longest line accepted by default, in bytes without the newline (Synapse's limit).
DEFAULT_MAX_LINE_LENGTH = 16384

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_Line = bytes | str


def _int_field(text: str, what: str, line: _Line) -> int:
    """ASCII digits with an optional leading '-', fitting a signed 64-bit int."""
    digits = text[1:] if text.startswith("-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ProtocolError(f"{what} {text!r} is not an integer", line)
    value = int(text) if len(digits) < 20 else _INT64_MAX + 1
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ProtocolError(f"{what} {text!r} does not fit in 64 bits", line)
    return value


def _word_field(text: str, what: str, line: _Line) -> str:
    if not text:
        raise ProtocolError(f"{what} is empty", line)
    return text


def _json_field(text: str, what: str, line: _Line) -> Any:
    try:
        return _json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProtocolError(f"{what} is not valid JSON ({err})", line) from None


def _split(body: str, n: int, usage: str, line: _Line) -> list[str]:
    parts = body.split(" ", n - 1)
    if len(parts) != n:
        raise ProtocolError(f"expected {usage}", line)
    return parts


def _parse_rdata(body: str, line: _Line) -> Command:
    stream, instance, token, row = _split(body, 4, "RDATA <stream_name> <instance_name> <token> <row_json>", line)
    return RdataCommand(
        _word_field(stream, "stream_name", line),
        _word_field(instance, "instance_name", line),
        None if token == "batch" else _int_field(token, "token", line),
        _json_field(row, "row", line),
    )


def _parse_position(body: str, line: _Line) -> Command:
    stream, instance, prev, new = _split(
        body, 4, "POSITION <stream_name> <instance_name> <prev_token> <new_token>", line
    )
    return PositionCommand(
        _word_field(stream, "stream_name", line),
        _word_field(instance, "instance_name", line),
        _int_field(prev, "prev_token", line),
        _int_field(new, "new_token", line),
    )


def _parse_user_sync(body: str, line: _Line) -> Command:
    instance, user, device, state, last_sync = _split(
        body, 5, "USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>", line
    )
    if state not in ("start", "end"):
        raise ProtocolError(f"USER_SYNC state must be 'start' or 'end', not {state!r}", line)
    return UserSyncCommand(
        _word_field(instance, "instance_id", line),
        _word_field(user, "user_id", line),
        None if device == "None" else _word_field(device, "device_id", line),
        state == "start",
        _int_field(last_sync, "last_sync_ms", line),
    )


def _parse_federation_ack(body: str, line: _Line) -> Command:
    instance, token = _split(body, 2, "FEDERATION_ACK <instance_name> <token>", line)
    return FederationAckCommand(_word_field(instance, "instance_name", line), _int_field(token, "token", line))


def _parse_user_ip(body: str, line: _Line) -> Command:
    user, fields_json = _split(body, 2, "USER_IP <user_id> <json_array>", line)
    fields = _json_field(fields_json, "USER_IP fields", line)
    if type(fields) is not list or len(fields) != 5:
        raise ProtocolError(
            "USER_IP fields must be a JSON array [access_token, ip, user_agent, device_id, last_seen]", line
        )
    return UserIpCommand(_word_field(user, "user_id", line), *fields)


def _parse_lock_released(body: str, line: _Line) -> Command:
    fields = _json_field(body, "LOCK_RELEASED fields", line)
    if type(fields) is not list or len(fields) != 3:
        raise ProtocolError("LOCK_RELEASED body must be a JSON array [instance_name, lock_name, lock_key]", line)
    return LockReleasedCommand(*fields)


def _simple(cls: Any) -> Any:
    return lambda body, line: cls(body)


_PARSERS: dict[str, Any] = {name: _simple(cls) for name, cls in COMMAND_MAP.items()}
_PARSERS.update(
    RDATA=_parse_rdata,
    POSITION=_parse_position,
    USER_SYNC=_parse_user_sync,
    CLEAR_USER_SYNC=lambda body, line: ClearUserSyncsCommand(body),
    FEDERATION_ACK=_parse_federation_ack,
    USER_IP=_parse_user_ip,
    LOCK_RELEASED=_parse_lock_released,
    # Synapse ignores anything after REPLICATE (older clients sent arguments).
    REPLICATE=lambda body, line: ReplicateCommand(),
)


def _parse_text(text: str, line: _Line) -> Command:
    idx = text.find(" ")
    if idx < 0:
        name, body = text, ""
    else:
        name, body = text[:idx], text[idx + 1 :]
    parser = _PARSERS.get(name)
    if parser is None:
        if not text.strip():
            raise ProtocolError("empty line", line)
        raise ProtocolError(f"unknown command {name!r}", line)
    result: Command = parser(body, line)
    return result


def parse_line(line: bytes | str, *, rows: bool = False) -> Command:
    """Parse one replication line (without its newline; one trailing ``\\n`` is allowed).

    With ``rows=True`` an RDATA row is decoded at once rather than on first
    read of ``.row`` (this twin always decodes at once, so it changes
    nothing here; the compiled twin then validates and builds in one pass).
    Raises :class:`ProtocolError` for anything that is not a valid command.
    """
    if isinstance(line, str):
        if line.endswith("\n"):
            line = line[:-1]
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("line is not valid UTF-8 (it contains a lone surrogate)", line) from None
        text = line
    elif isinstance(line, (bytes, bytearray, memoryview)):
        line = bytes(line)
        if line.endswith(b"\n"):
            line = line[:-1]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ProtocolError(f"line is not valid UTF-8 ({err.reason} at byte {err.start})", line) from None
    else:
        raise TypeError(f"parse_line() takes bytes or str, not {type(line).__name__}")
    if "\n" in text:
        raise ProtocolError("line contains a newline", line)
    return _parse_text(text, line)


def encode(cmd: Command) -> bytes:
    """One line as published on Redis: ``NAME body``, UTF-8, no newline."""
    if not isinstance(cmd, Command):
        raise TypeError(f"encode() takes a Command, not {type(cmd).__name__}")
    text = cmd.NAME + " " + cmd.to_line()
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"cannot encode {cmd.NAME}: a field contains a lone surrogate") from None


def encode_lines(cmds: Iterable[Command]) -> bytes:
    """Newline-terminated lines for a TCP stream."""
    return b"".join([encode(cmd) + b"\n" for cmd in cmds])


def _publish_header(channel: bytes) -> bytes:
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n" % (len(channel), channel)


def encode_redis_publish(cmds: Iterable[Command], channel: bytes, user_ip_channel: bytes, counts: dict[str, int]) -> bytes:
    """The commands as pipelined Redis ``PUBLISH`` requests (RESP), one bytes object.

    Each command is one ``PUBLISH channel line`` request, ``USER_IP`` on
    ``user_ip_channel`` (Synapse's layout), the others on ``channel``; so a
    carrier writes a whole batch with one call and no per-command Python.
    ``counts`` (command name -> number) is increased for each command packed.
    An encoding error raises :class:`ProtocolError` for the first bad command;
    then nothing is returned and ``counts`` is left as it was.
    """
    check_publish_args(channel, user_ip_channel, counts)
    main = _publish_header(channel)
    user_ip = _publish_header(user_ip_channel)
    parts = []
    packed: dict[str, int] = {}
    for cmd in cmds:
        data = encode(cmd)
        name = cmd.NAME
        parts.append(b"%s$%d\r\n%s\r\n" % (user_ip if name == "USER_IP" else main, len(data), data))
        packed[name] = packed.get(name, 0) + 1
    for name, n in packed.items():  # only once all of them encoded
        counts[name] = counts.get(name, 0) + n
    return b"".join(parts)


_WINDOW_BYTES = 32768  # iter_feed builds the commands of about this many bytes at a time (as the compiled twin)


class LineDecoder:
    """Incremental decoder: feed bytes as they arrive, get completed commands.

    Partial lines are held across calls; blank lines are ignored. A line
    longer than ``max_line_length`` bytes is refused (and skipped up to its
    newline). When a line is bad, ``feed`` raises :class:`ProtocolError` whose
    ``commands`` holds the commands completed before it; the bytes after the
    bad line stay buffered and come out of the next ``feed`` (``feed(b"")``
    continues without new data). ``rows=True`` decodes RDATA rows as the
    lines are parsed (as ``parse_line(..., rows=True)``).

    ``iter_feed`` is ``feed`` for big buffers: the same commands, built about
    32 KiB of lines at a time as they are taken, so a caller that handles and
    drops each never holds a whole file's commands at once.
    """

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH, *, rows: bool = False) -> None:
        if max_line_length < 1:
            raise ValueError("max_line_length must be positive")
        self.max_line_length = max_line_length
        self.rows = rows
        self._buf = b""
        self._discarding = False
        # iter_feed's state, held here so that every command comes out once, in order, whoever takes it next:
        self._pending: bytes | None = None  # bytes given to iter_feed and not parsed yet (from _pending_at)
        self._pending_at = 0
        self._ready: list[Command] | None = None  # commands built and not taken yet (from _ready_at)
        self._ready_at = 0
        self._deferred: ProtocolError | None = None  # a bad line's error, raised once the commands before it are taken

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line (and, during ``iter_feed``, the bytes not parsed yet)."""
        if self._pending is not None:
            return len(self._buf) + len(self._pending) - self._pending_at
        return len(self._buf)

    def feed(self, data: bytes) -> list[Command]:
        """The commands completed by ``data`` (see the class docstring for errors)."""
        data = chunk_bytes(data)
        if self._pending is not None or self._ready is not None or self._deferred is not None:
            return self._feed_after_iter(data)
        return self._feed(data)

    def iter_feed(self, data: bytes) -> Iterator[Command]:
        """The commands completed by ``data``, as ``feed`` gives them, built as they are taken.

        A whole file's buffer costs per line no more than 64 KiB pieces of it
        cost when each command is dropped after use: only a small window of
        commands (small enough to stay in the cache) is built ahead of the
        caller. At a bad line the iterator first gives
        every command before it, then raises :class:`ProtocolError` (its
        ``commands`` empty) and ends; the bytes after the bad line stay
        buffered, as with ``feed``. What is not taken yet stays with the
        decoder: the next ``feed`` or iterator gives it first.
        """
        data = chunk_bytes(data, "iter_feed")
        self._pending = self._take_pending() + data if self._pending is not None else data
        self._pending_at = 0
        return _Commands(self)

    def _feed_after_iter(self, data: bytes) -> list[Command]:
        # What an iterator left comes first: its built commands, its bad line, its unparsed bytes.
        out = self._ready[self._ready_at :] if self._ready is not None else []
        err = self._deferred
        rest = self._take_pending() + data
        self._ready = None
        self._deferred = None
        if err is not None:
            if rest:  # behind the bad line: kept for the next feed
                self._pending = rest
                self._pending_at = 0
            err.commands = list(out)
            raise err
        try:
            out.extend(self._feed(rest))
        except ProtocolError as err2:
            err2.commands = out + err2.commands
            raise
        return out

    def _take_pending(self) -> bytes:
        data = self._pending
        self._pending = None
        if data is None:
            return b""
        return data[self._pending_at :] if self._pending_at else data

    def _next(self) -> Command | None:
        """The next command for an iterator, or None when none is left."""
        while True:
            if self._ready is not None:
                if self._ready_at < len(self._ready):
                    cmd = self._ready[self._ready_at]
                    self._ready_at += 1
                    return cmd
                self._ready = None
            if self._deferred is not None:
                err = self._deferred
                self._deferred = None
                err.commands = []
                raise err
            if self._pending is None:
                return None
            self._window()

    def _window(self) -> None:
        # Parse the next _WINDOW_BYTES (to a line's end) of the pending bytes into _ready.
        data = self._pending
        assert data is not None
        at = self._pending_at
        end = len(data)
        if end - at > _WINDOW_BYTES:
            nl = data.find(b"\n", at + _WINDOW_BYTES)
            if nl >= 0:
                end = nl + 1
        if end == len(data):
            self._pending = None
        else:
            self._pending_at = end
        self._ready_at = 0
        try:
            self._ready = self._feed(data[at:end])
        except ProtocolError as err:
            self._ready = cast("list[Command]", err.commands)  # the commands before the bad line
            self._deferred = err

    def _feed(self, data: bytes) -> list[Command]:
        buf = self._buf + data if self._buf else data
        out: list[Command] = []
        limit = self.max_line_length
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            if self._discarding:  # the tail of a line already reported as too long
                self._discarding = False
                continue
            if len(line) > limit:
                self._buf = buf[start:]
                raise self._error(ProtocolError(f"line longer than {limit} bytes", line), out)
            if not line.strip():
                continue
            try:
                out.append(parse_line(line, rows=self.rows))
            except ProtocolError as err:
                self._buf = buf[start:]
                raise self._error(err, out) from None
        rest = buf[start:]
        if self._discarding:
            rest = b""
        elif len(rest) > limit:
            self._discarding = True
            self._buf = b""
            raise self._error(ProtocolError(f"line longer than {limit} bytes", rest), out)
        self._buf = rest
        return out

    @staticmethod
    def _error(err: ProtocolError, done: list[Command]) -> ProtocolError:
        err.commands = list(done)
        return err


class _Commands:
    """The iterator ``LineDecoder.iter_feed`` returns: takes the decoder's next command."""

    __slots__ = ("_dec",)

    def __init__(self, dec: LineDecoder) -> None:
        self._dec = dec

    def __iter__(self) -> _Commands:
        return self

    def __next__(self) -> Command:
        cmd = self._dec._next()
        if cmd is None:
            raise StopIteration
        return cmd


# -- table columns: a row's fields as a writer stores them (see factstream.replication.tables)

# The stdlib's C encoder, made once: json.dumps' text without its per-call set-up. (No
# circular-reference check: a row is a tree; a cycle raises RecursionError, not ValueError.)
_ENCODE = (
    c_make_encoder(None, JSONEncoder().default, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    if c_make_encoder is not None else None
)
_SCALARS = {type(None): "null", True: "true", False: "false"}


def column_text(value: Any) -> str:
    """``json.dumps(value)`` (its defaults: ASCII, ``", "`` and ``": "``), as a table's JSON column holds it."""
    t = type(value)
    if t is str:
        return encode_basestring_ascii(value)
    if t is int:
        return int.__repr__(value)
    if value is None or t is bool:
        return _SCALARS[value if t is bool else t]
    if _ENCODE is None:
        return json.dumps(value)
    return "".join(_ENCODE(value, 0))


class ColumnParams:
    """The parameters inserting one row into a table: ``(token, instance_name, *fields)``.

    ``json_flags`` says, per column, whether the field is stored as its JSON
    text (:func:`column_text`) or as it is. Made once per table; :meth:`params`
    runs for every row a writer writes.
    """

    __slots__ = ("table", "json_flags")

    def __init__(self, table: str, json_flags: Sequence[bool]) -> None:
        self.table = table
        self.json_flags = tuple(bool(f) for f in json_flags)

    def params(self, token: int, instance_name: str, row: Sequence[Any]) -> tuple[Any, ...]:
        """``(token, instance_name, *fields)``; ValueError when the row has another number of fields."""
        flags = self.json_flags
        if len(row) != len(flags):
            raise ValueError(f"row has {len(row)} fields, table {self.table} has {len(flags)} columns")
        return (token, instance_name, *[column_text(v) if j else v for j, v in zip(flags, row)])
