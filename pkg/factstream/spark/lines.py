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

_TYPED = [f.name for f in ARROW_SCHEMA][14:]
_EV_STR = ["ev_event_id", "ev_room_id", "ev_type", "ev_state_key", "ev_redacts", "ev_relates_to", "ev_membership"]


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
    """Column lists for one record batch."""

    __slots__ = tuple(f.name for f in ARROW_SCHEMA) + ("typed", "n")

    def __init__(self, typed: bool) -> None:
        for f in ARROW_SCHEMA:
            setattr(self, f.name, [])
        self.typed = typed
        self.n = 0

    def batch(self, source: str) -> pa.RecordBatch:
        schema = ARROW_SCHEMA if self.typed else HEADER_SCHEMA
        n = self.n
        arrays: list[pa.Array] = [pa.array([source] * n, pa.string()) if n else pa.array([], pa.string())]
        for f in schema:
            if f.name == "source_file":
                continue
            values = getattr(self, f.name)
            if not values:
                arrays.append(pa.nulls(n, f.type))
                continue
            try:
                arrays.append(pa.array(values, f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                arrays.append(pa.array([_coerce(v, f.type) for v in values], f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


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


def _fill_typed(cols: _Columns, stream: str, row: Any) -> None:
    """Append the typed columns of one RDATA row (nulls where the row has another shape)."""
    ev = (None,) * 10
    cache = (None, None, None)
    if stream == "events":
        if type(row) is list and len(row) == 2:
            kind, data = row
            if type(data) is list:
                if kind == "ev" and len(data) == 9:
                    ev = (kind, *data)
                elif kind == "state" and len(data) == 4:
                    ev = (kind, data[3], data[0], data[1], data[2], None, None, None, None, None)
                elif kind == "state-all" and len(data) == 1:
                    ev = (kind, None, data[0], None, None, None, None, None, None, None)
                else:
                    ev = (kind if type(kind) is str else None,) + (None,) * 9
    elif stream == "caches":
        if type(row) is list and len(row) == 3:
            keys = row[1]
            if type(keys) is list:
                keys = [_key_text(k) for k in keys]
            elif keys is not None:
                keys = None
            cache = (row[0], keys, row[2])
    cols.ev_kind.append(ev[0])
    cols.ev_event_id.append(ev[1])
    cols.ev_room_id.append(ev[2])
    cols.ev_type.append(ev[3])
    cols.ev_state_key.append(ev[4])
    cols.ev_redacts.append(ev[5])
    cols.ev_relates_to.append(ev[6])
    cols.ev_membership.append(ev[7])
    cols.ev_rejected.append(ev[8])
    cols.ev_outlier.append(ev[9])
    cols.cache_func.append(cache[0])
    cols.cache_keys.append(cache[1])
    cols.cache_invalidation_ts.append(cache[2])


def _fill_typed_null(cols: _Columns) -> None:
    for name in _TYPED:
        getattr(cols, name).append(None)


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
    ``typed``) with at most ``batch_rows`` rows. One plain loop over the
    lines: with the compiled codec, a column-at-a-time variant (parse all,
    gather with attrgetter, scatter with Arrow ``take``) measured slower.
    """
    parse = wire.parse_line
    cols = _Columns(typed)
    (
        a_line, a_ts, a_dir, a_chan, a_cmd, a_stream, a_inst, a_tok, a_prev, a_row, a_data, a_err, a_raw
    ) = (
        cols.line_number, cols.ts_text, cols.direction, cols.channel, cols.command, cols.stream,
        cols.instance, cols.token, cols.prev_token, cols.row, cols.data, cols.error, cols.raw,
    )
    n = 0
    for number, payload, ts, direction, channel, problem in _payloads(lines, first_line, fmt):
        cmd = None
        if problem is None:
            try:
                cmd = parse(payload)
            except ProtocolError as err:
                problem = str(err)
        a_line.append(number)
        a_ts.append(ts)
        a_dir.append(direction)
        a_chan.append(channel)
        if cmd is None:
            a_cmd.append(None)
            a_stream.append(None)
            a_inst.append(None)
            a_tok.append(None)
            a_prev.append(None)
            a_row.append(None)
            a_data.append(None)
            a_err.append(problem)
            a_raw.append(payload.decode("utf-8", "replace"))
            if typed:
                _fill_typed_null(cols)
        else:
            a_err.append(None)
            a_raw.append(None)
            cls = type(cmd)
            a_cmd.append(cls.NAME)
            if cls is RdataCommand:
                stream = cmd.stream_name
                a_stream.append(stream)
                a_inst.append(cmd.instance_name)
                a_tok.append(cmd.token)
                a_prev.append(None)
                a_row.append(_row_text(cmd, payload))
                a_data.append(None)
                if typed:
                    _fill_typed(cols, stream, cmd.row)
            else:
                if cls is PositionCommand:
                    a_stream.append(cmd.stream_name)
                    a_inst.append(cmd.instance_name)
                    a_tok.append(cmd.new_token)
                    a_prev.append(cmd.prev_token)
                    a_data.append(None)
                elif cls is FederationAckCommand:
                    a_stream.append(None)
                    a_inst.append(cmd.instance_name)
                    a_tok.append(cmd.token)
                    a_prev.append(None)
                    a_data.append(None)
                else:
                    a_stream.append(None)
                    a_inst.append(None)
                    a_tok.append(None)
                    a_prev.append(None)
                    body = payload.split(b" ", 1)
                    a_data.append(body[1] if len(body) == 2 else None)
                a_row.append(None)
                if typed:
                    _fill_typed_null(cols)
        n += 1
        if n >= batch_rows:
            cols.n = n
            yield cols.batch(source)
            cols = _Columns(typed)
            (
                a_line, a_ts, a_dir, a_chan, a_cmd, a_stream, a_inst, a_tok, a_prev, a_row, a_data, a_err, a_raw
            ) = (
                cols.line_number, cols.ts_text, cols.direction, cols.channel, cols.command, cols.stream,
                cols.instance, cols.token, cols.prev_token, cols.row, cols.data, cols.error, cols.raw,
            )
            n = 0
    if n:
        cols.n = n
        yield cols.batch(source)
