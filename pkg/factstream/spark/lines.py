"""Archived lines -> Arrow record batches, through factstream's own codec.

This module is what Spark executors run; it needs pyarrow but not pyspark, so
it can be tested and benchmarked on its own. One archive line becomes at most
one output row: the replication command parsed by :func:`factstream.wire.parse_line`
(the compiled codec when it is built), plus where it came from (file, line
number, timestamp, direction, Redis channel). A line the codec refuses comes
out with the codec's message in ``error`` and the line itself in ``raw``;
lines are never dropped, except blank lines (the protocol ignores them) and
Redis capture chatter that carries no payload (subscribe confirmations,
MONITOR entries other than PUBLISH).

Archive formats (``FORMATS``):

``lines``
    one protocol line per line, optionally prefixed by an ISO-8601 timestamp
    and/or a direction marker (``>`` server to client, ``<`` client to server):
    ``2026-11-22T01:02:03.456Z > RDATA events master 5 [...]``.
``monitor``
    ``redis-cli MONITOR`` output: ``<unix-time> [db addr] "PUBLISH" "<channel>" "<payload>"``.
``redis-csv``
    ``redis-cli --csv SUBSCRIBE``/``PSUBSCRIBE`` output: ``"message","<channel>","<payload>"``.
``redis-raw``
    ``redis-cli SUBSCRIBE`` piped to a file: ``message``, channel and payload on
    three lines (records span lines, so such files are never split).
``auto``
    sniff each file's first lines and pick one of the above.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .. import wire
from ..commands import FederationAckCommand, PositionCommand, RdataCommand
from ..errors import ProtocolError
from .formats import FORMATS

__all__ = [
    "FORMATS",
    "ParseOptions",
    "ARROW_SCHEMA",
    "SPARK_DDL",
    "HEADER_SCHEMA",
    "HEADER_DDL",
    "TYPED_COLUMNS",
    "detect_format",
    "parse_block",
    "redis_unquote",
]


#: Output columns, in order. ``ts_text`` is the timestamp as written; the
#: pipeline turns it into a Spark timestamp (``ts``) in the JVM.
ARROW_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("line_number", pa.int64()),
        ("ts_text", pa.string()),
        ("direction", pa.string()),
        ("channel", pa.string()),
        ("command", pa.string()),
        ("stream", pa.string()),
        ("instance", pa.string()),
        ("token", pa.int64()),
        ("prev_token", pa.int64()),
        ("row", pa.string()),
        ("data", pa.string()),
        ("error", pa.string()),
        ("raw", pa.string()),
        ("ev_kind", pa.string()),
        ("ev_event_id", pa.string()),
        ("ev_room_id", pa.string()),
        ("ev_type", pa.string()),
        ("ev_state_key", pa.string()),
        ("ev_redacts", pa.string()),
        ("ev_relates_to", pa.string()),
        ("ev_membership", pa.string()),
        ("ev_rejected", pa.bool_()),
        ("ev_outlier", pa.bool_()),
        ("cache_func", pa.string()),
        ("cache_keys", pa.list_(pa.string())),
        ("cache_invalidation_ts", pa.int64()),
    ]
)

#: The header-only schema: the same minus the typed events/caches columns.
HEADER_SCHEMA = pa.schema(list(ARROW_SCHEMA)[:14])

_SPARK_TYPES = {
    pa.string(): "string",
    pa.int64(): "bigint",
    pa.bool_(): "boolean",
    pa.list_(pa.string()): "array<string>",
}
#: The same schema as a Spark DDL string (for ``mapInArrow``).
SPARK_DDL: str = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in ARROW_SCHEMA)
#: Spark DDL of HEADER_SCHEMA.
HEADER_DDL: str = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in HEADER_SCHEMA)
#: Spark types of the typed columns, for filling them with nulls after a header-only parse.
TYPED_COLUMNS: tuple[tuple[str, str], ...] = tuple((f.name, _SPARK_TYPES[f.type]) for f in list(ARROW_SCHEMA)[14:])



@dataclass(frozen=True)
class ParseOptions:
    """How to read an archive: its format and whether to decode rows into typed columns.

    ``typed=False`` is the header-only parse: command, stream, writer, tokens
    and the row as JSON text, without decoding the row.
    """

    format: str = "auto"
    typed: bool = True

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown archive format {self.format!r}; choose one of {', '.join(FORMATS)}")


# ----------------------------------------------------------------- prefixes

_PREFIX = re.compile(
    rb"(?:(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)(?: +|$))?(?:([<>])(?: +|$))?"
)
_MONITOR = re.compile(rb'(\d+(?:\.\d+)?) \[[^\]]*\] (.*)')
_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def _unescape(match: re.Match[bytes]) -> bytes:
    code = match.group(1)
    if len(code) == 3:
        return bytes((int(code[1:], 16),))
    return _SIMPLE_ESCAPES.get(code, code)


def redis_unquote(text: bytes) -> bytes:
    """Undo redis-cli's quoting of one string (the body between the quotes)."""
    if b"\\" not in text:
        return text
    return _ESCAPE.sub(_unescape, text)


def _quoted_fields(text: bytes) -> list[bytes] | None:
    """The quoted, comma- or space-separated strings of a redis-cli line; None if it is not one."""
    fields = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _QUOTED.match(text, pos)
        if m is None:
            # --csv prints integers bare (e.g. the subscription count)
            end = text.find(b",", pos)
            end = n if end < 0 else end
            fields.append(text[pos:end])
            pos = end
        else:
            fields.append(redis_unquote(m.group(1)))
            pos = m.end()
        if pos < n:
            if text[pos] not in (0x2C, 0x20):  # ',' or ' '
                return None
            pos += 1
    return fields


def detect_format(head: list[bytes]) -> str:
    """Guess an archive's format from its first lines (see the module docstring)."""
    for line in head:
        if not line.strip():
            continue
        if _MONITOR.match(line) and b'"' in line:
            return "monitor"
        if line.startswith((b'"message",', b'"pmessage",', b'"subscribe",', b'"psubscribe",', b'"smessage",')):
            return "redis-csv"
        if line.startswith(b"Reading messages"):
            return "redis-csv"
        if line in (b"subscribe", b"psubscribe", b"message", b"pmessage", b"ssubscribe", b"smessage"):
            return "redis-raw"
        if line in (b"OK",):  # MONITOR's first reply
            continue
        return "lines"
    return "lines"


# ------------------------------------------------------------------ columns


class _Columns:
    """Columns of one record batch: dense lists for what most lines have, sparse for the rest."""

    __slots__ = (
        "typed", "line_number", "command", "stream", "instance", "token", "row",
        "ts_text", "direction", "channel", "prev_token", "data", "error", "raw", "ev", "cache",
    )

    def __init__(self, typed: bool) -> None:
        self.typed = typed
        self.line_number: list[int] = []
        self.command: list[str | None] = []
        self.stream: list[str | None] = []
        self.instance: list[str | None] = []
        self.token: list[int | None] = []
        self.row: list[bytes | None] = []
        # sparse: index -> value
        self.ts_text: dict[int, bytes] = {}
        self.direction: dict[int, bytes] = {}
        self.channel: dict[int, bytes] = {}
        self.prev_token: dict[int, int] = {}
        self.data: dict[int, bytes | None] = {}
        self.error: dict[int, str] = {}
        self.raw: dict[int, str] = {}
        # typed rows: (index, decoded row) of the events and caches streams
        self.ev: list[tuple[int, Any]] = []
        self.cache: list[tuple[int, Any]] = []

    def add_bad(self, number: int, problem: str, payload: bytes) -> None:
        i = len(self.line_number)
        self.line_number.append(number)
        self.command.append(None)
        self.stream.append(None)
        self.instance.append(None)
        self.token.append(None)
        self.row.append(None)
        self.error[i] = problem
        self.raw[i] = payload.decode("utf-8", "replace")

    def add_cmd(self, number: int, cmd: Any, payload: bytes) -> None:
        i = len(self.line_number)
        self.line_number.append(number)
        cls = type(cmd)
        self.command.append(cls.NAME)
        if cls is RdataCommand:
            stream = cmd.stream_name
            self.stream.append(stream)
            self.instance.append(cmd.instance_name)
            self.token.append(cmd.token)
            self.row.append(_row_text(cmd, payload))
            if self.typed:
                if stream == "events":
                    self.ev.append((i, cmd.row))
                elif stream == "caches":
                    self.cache.append((i, cmd.row))
            return
        self.row.append(None)
        if cls is PositionCommand:
            self.stream.append(cmd.stream_name)
            self.instance.append(cmd.instance_name)
            self.token.append(cmd.new_token)
            self.prev_token[i] = cmd.prev_token
        elif cls is FederationAckCommand:
            self.stream.append(None)
            self.instance.append(cmd.instance_name)
            self.token.append(cmd.token)
        else:
            self.stream.append(None)
            self.instance.append(None)
            self.token.append(None)
            body = payload.split(b" ", 1)
            if len(body) == 2:
                self.data[i] = body[1]

    def __len__(self) -> int:
        return len(self.line_number)

    def batch(self, source: str) -> pa.RecordBatch:
        schema = ARROW_SCHEMA if self.typed else HEADER_SCHEMA
        n = len(self.line_number)
        cols: dict[str, pa.Array] = {
            "source_file": pa.repeat(pa.scalar(source, pa.string()), n),
            "line_number": pa.array(self.line_number, pa.int64()),
            "command": pa.array(self.command, pa.string()),
            "stream": _array(self.stream, pa.string()),
            "instance": _array(self.instance, pa.string()),
            "token": pa.array(self.token, pa.int64()),
            "row": _array(self.row, pa.string()),
        }
        for name in ("ts_text", "direction", "channel", "prev_token", "data", "error", "raw"):
            typ = schema.field(name).type
            sparse = getattr(self, name)
            if not sparse:
                cols[name] = pa.nulls(n, typ)
            else:
                dense: list[Any] = [None] * n
                for i, v in sparse.items():
                    dense[i] = v
                cols[name] = _array(dense, typ)
        if self.typed:
            _typed_columns(cols, n, self.ev, self.cache)
        return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


def _array(values: list[Any], typ: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([_coerce(v, typ) for v in values], typ)


def _coerce(value: Any, typ: pa.DataType) -> Any:
    """Make a decoded JSON value fit a column, or null (rows of unexpected shape)."""
    if value is None:
        return None
    if typ == pa.string():
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value if type(value) is str else None
    if typ == pa.bool_():
        return value if type(value) is bool else None
    if typ == pa.int64():
        return value if type(value) is int and -(2**63) <= value < 2**63 else None
    if isinstance(value, list):  # cache keys
        return value
    return None


def _key_text(key: Any) -> str:
    return key if type(key) is str else json.dumps(key, separators=(",", ":"))


_EV_NONE = (None,) * 10


def _ev_fields(row: Any) -> tuple[Any, ...]:
    """(kind, event_id, room_id, type, state_key, redacts, relates_to, membership, rejected, outlier)."""
    if type(row) is list and len(row) == 2:
        kind, data = row
        if type(data) is list:
            if kind == "ev" and len(data) == 9:
                return (kind, *data)
            if kind == "state" and len(data) == 4:
                return (kind, data[3], data[0], data[1], data[2], None, None, None, None, None)
            if kind == "state-all" and len(data) == 1:
                return (kind, None, data[0], None, None, None, None, None, None, None)
            return (kind if type(kind) is str else None,) + _EV_NONE[1:]
    return _EV_NONE


def _cache_fields(row: Any) -> tuple[Any, Any, Any]:
    """(cache_func, keys as strings or None, invalidation_ts)."""
    if type(row) is list and len(row) == 3:
        keys = row[1]
        if type(keys) is list:
            keys = [_key_text(k) for k in keys]
        elif keys is not None:
            keys = None
        return (row[0], keys, row[2])
    return (None, None, None)


_EV_COLUMNS = ("ev_kind", "ev_event_id", "ev_room_id", "ev_type", "ev_state_key", "ev_redacts",
               "ev_relates_to", "ev_membership", "ev_rejected", "ev_outlier")
_CACHE_COLUMNS = ("cache_func", "cache_keys", "cache_invalidation_ts")


def _scatter_index(n: int, positions: list[int]) -> pa.Array:
    """Length-n indices: k where positions[k] is, null elsewhere (for ``take``)."""
    ix: list[int | None] = [None] * n
    for k, i in enumerate(positions):
        ix[i] = k
    return pa.array(ix, pa.int32())


def _typed_columns(cols: dict[str, pa.Array], n: int, ev: list[tuple[int, Any]], cache: list[tuple[int, Any]]) -> None:
    """Decode events/caches rows into their columns: transpose with zip, scatter with Arrow ``take``."""
    for items, fields, names in ((ev, _ev_fields, _EV_COLUMNS), (cache, _cache_fields, _CACHE_COLUMNS)):
        if not items:
            for name in names:
                cols[name] = pa.nulls(n, ARROW_SCHEMA.field(name).type)
            continue
        positions = [i for i, _ in items]
        columns = list(zip(*[fields(r) for _, r in items]))
        index = _scatter_index(n, positions)
        for name, values in zip(names, columns):
            cols[name] = _array(list(values), ARROW_SCHEMA.field(name).type).take(index)


def _row_text(cmd: RdataCommand, line: bytes) -> bytes:
    raw = cmd.raw_row
    if raw is not None:
        return raw
    return line.split(b" ", 4)[4]


# ------------------------------------------------------------------ parsing


def _payloads(lines: Iterable[bytes], first_line: int, fmt: str) -> Iterator[tuple[int, bytes, Any, Any, Any, str | None]]:
    """(line number, protocol line, ts_text, direction, channel, error) per payload-bearing line."""
    number = first_line - 1
    if fmt == "lines":
        match = _PREFIX.match
        for line in lines:
            number += 1
            if not line:
                continue
            c = line[0]
            if 65 <= c <= 90:  # starts with a command name: no prefix
                yield number, line, None, None, None, None
                continue
            m = match(line)
            assert m is not None  # every group of _PREFIX is optional: it always matches
            ts = m.group(1)
            d = m.group(2)
            body = line[m.end():] if m.end() else line
            if not body.strip():
                if ts is None and d is None:
                    continue  # blank line
                yield number, body, ts, d, None, "prefix without a replication line"
                continue
            yield number, body, ts, d, None, None
    elif fmt == "monitor":
        for line in lines:
            number += 1
            if not line.strip() or line == b"OK":
                continue
            m = _MONITOR.match(line)
            fields = _quoted_fields(m.group(2)) if m else None
            if not fields:
                yield number, line, None, None, None, "not a redis-cli MONITOR line"
                continue
            assert m is not None  # fields is None when m is None
            verb = fields[0].upper()
            if verb not in (b"PUBLISH", b"SPUBLISH"):
                continue  # other Redis traffic: not replication data
            if len(fields) != 3:
                yield number, line, m.group(1), None, None, "PUBLISH without channel and payload"
                continue
            yield number, fields[2], m.group(1), None, fields[1], None
    elif fmt == "redis-csv":
        for line in lines:
            number += 1
            if not line.strip() or line.startswith(b"Reading messages"):
                continue
            fields = _quoted_fields(line)
            if not fields:
                yield number, line, None, None, None, "not a redis-cli --csv line"
                continue
            kind = fields[0]
            if kind in (b"message", b"smessage") and len(fields) == 3:
                yield number, fields[2], None, None, fields[1], None
            elif kind == b"pmessage" and len(fields) == 4:
                yield number, fields[3], None, None, fields[2], None
            elif kind in (b"subscribe", b"psubscribe", b"ssubscribe", b"unsubscribe", b"punsubscribe"):
                continue
            else:
                yield number, line, None, None, None, "not a redis-cli --csv message"
    elif fmt == "redis-raw":
        it = iter(lines)
        for line in it:
            number += 1
            if not line.strip():
                continue
            if line in (b"message", b"smessage", b"pmessage"):
                extra = 2 if line == b"pmessage" else 1
                parts = []
                for _ in range(extra + 1):
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    number += 1
                    parts.append(nxt)
                if len(parts) != extra + 1:
                    yield number, line, None, None, None, "redis-cli message record cut short"
                    continue
                yield number, parts[-1], None, None, parts[-2], None
            elif line in (b"subscribe", b"psubscribe", b"ssubscribe", b"unsubscribe", b"punsubscribe"):
                for _ in range(2):
                    if next(it, None) is not None:
                        number += 1
            else:
                yield number, line, None, None, None, "not part of a redis-cli message record"
    else:
        raise ValueError(f"cannot parse format {fmt!r} here; detect it first")


def parse_block(
    lines: Iterable[bytes],
    *,
    source: str,
    first_line: int = 1,
    fmt: str = "lines",
    typed: bool = True,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Parse archive ``lines`` (without newlines) numbered from ``first_line``.

    Yields record batches of ``ARROW_SCHEMA`` (``HEADER_SCHEMA`` when not
    ``typed``) with at most ``batch_rows`` rows. The codec runs once per line;
    columns most lines lack are kept sparse, and typed columns are built per
    column (transposed with ``zip``, placed with Arrow ``take``).
    """
    parse = wire.parse_line
    cols = _Columns(typed)
    if fmt == "lines":
        # The common case inline: a line that starts with a command name has no prefix.
        match = _PREFIX.match
        number = first_line - 1
        add_cmd = cols.add_cmd
        for line in lines:
            number += 1
            if line and 65 <= line[0] <= 90:
                payload = line
            else:
                m = match(line)
                assert m is not None  # every group of _PREFIX is optional: it always matches
                ts, d = m.group(1), m.group(2)
                payload = line[m.end():] if m.end() else line
                if not payload.strip():
                    if ts is None and d is None:
                        continue  # blank line
                    i = len(cols)
                    cols.add_bad(number, "prefix without a replication line", payload)
                    _mark(cols, i, ts, d)
                    if len(cols) >= batch_rows:
                        yield cols.batch(source)
                        cols = _Columns(typed)
                        add_cmd = cols.add_cmd
                    continue
                if ts is not None or d is not None:
                    _mark(cols, len(cols), ts, d)
            try:
                add_cmd(number, parse(payload), payload)
            except ProtocolError as err:
                cols.add_bad(number, str(err), payload)
            if len(cols) >= batch_rows:
                yield cols.batch(source)
                cols = _Columns(typed)
                add_cmd = cols.add_cmd
    else:
        for number, payload, ts, direction, channel, problem in _payloads(lines, first_line, fmt):
            i = len(cols)
            if problem is None:
                try:
                    cols.add_cmd(number, parse(payload), payload)
                except ProtocolError as err:
                    cols.add_bad(number, str(err), payload)
            else:
                cols.add_bad(number, problem, payload)
            _mark(cols, i, ts, direction)
            if channel is not None:
                cols.channel[i] = channel
            if len(cols) >= batch_rows:
                yield cols.batch(source)
                cols = _Columns(typed)
    if len(cols):
        yield cols.batch(source)


def _mark(cols: _Columns, i: int, ts: bytes | None, direction: bytes | None) -> None:
    if ts is not None:
        cols.ts_text[i] = ts
    if direction is not None:
        cols.direction[i] = direction
