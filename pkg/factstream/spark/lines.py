"""Archived lines -> Arrow record batches, through factstream's own codec.

This module is what Spark executors run; it needs pyarrow but not pyspark, so
it can be tested and benchmarked on its own. One archive line becomes at most
one output row: the replication command parsed by :func:`factstream.wire.parse_line`
(the compiled codec when it is built), plus where it came from (file, line
number, timestamp, direction, Redis channel). A line the codec refuses comes
out with the codec's message in ``error`` and the line itself in ``raw``;
lines are never dropped, except blank lines (the protocol ignores them) and
Redis capture chatter that carries no payload (subscribe confirmations,
MONITOR entries other than PUBLISH). A line may end in CRLF (an archive
that went through Windows tools): the ``\r`` is part of the line ending, not
of the line. A recorder note
(``<ts> # disconnected <reason>``) is no wire line: its row has command
``#disconnected`` (``#`` and the note's first word), direction ``#`` and the
rest of the note in ``data``. A file's last line without a newline (the file
was cut, or is still being written) is never parsed: a token cut short can
look valid, so it comes out malformed, with ``ENDS_MID_LINE`` in ``error``
(:func:`parse_file_blocks`).

Archive formats (``FORMATS``) and their detection: :mod:`.formats`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .. import wire
from ._archive_py import HEADER_COLUMNS
from .._compat import load
from ..commands import FederationAckCommand, PositionCommand, RdataCommand
from ..errors import ProtocolError
from .formats import (
    ENDS_MID_LINE, FORMATS, NOTE, SPLITTERS, detect_format, payloads, redis_unquote, split_csv, split_line, split_monitor,
)
from .timestamps import TS_TYPE, timestamp_columns

__all__ = [
    "FORMATS",
    "ParseOptions",
    "ARROW_SCHEMA",
    "SPARK_DDL",
    "TYPED_COLUMNS",
    "detect_format",
    "line_values",
    "monitor_values",
    "csv_values",
    "ROW_FUNCTIONS",
    "command_values",
    "parse_block",
    "parse_blocks",
    "parse_file_blocks",
    "cut_line_values",
    "redis_unquote",
]


#: Output columns, in order: exactly what the Spark job's DataFrame holds
#: (``ts`` and ``date`` in the session time zone, see :mod:`.timestamps`).
ARROW_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("line_number", pa.int64()),
        ("ts", TS_TYPE),
        ("date", pa.date32()),
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

_SPARK_TYPES = {
    pa.string(): "string",
    pa.int64(): "bigint",
    pa.bool_(): "boolean",
    pa.list_(pa.string()): "array<string>",
    TS_TYPE: "timestamp",
    pa.date32(): "date",
}
#: The same schema as a Spark DDL string (for ``mapInArrow``).
SPARK_DDL: str = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in ARROW_SCHEMA)
#: The typed events/caches columns (null after a header-only parse).
TYPED_COLUMNS: tuple[str, ...] = tuple(f.name for f in list(ARROW_SCHEMA)[15:])
_TYPED_NULLS = tuple((f.name, f.type) for f in list(ARROW_SCHEMA)[15:])


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


# --------------------------------------------------------------- row values
#
# ``line_values`` is the specification of what one archive line becomes; the
# column builders (factstream.spark._archive_py / _archive_c) only collect its rows,
# and the compiled one computes the common lines' rows itself, identically.


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _str_or_none(value: Any) -> str | None:
    return value if type(value) is str else None


def _bool_or_none(value: Any) -> bool | None:
    return value if type(value) is bool else None


def _i64_or_none(value: Any) -> int | None:
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


def _key_text(key: Any) -> str:
    return key if type(key) is str else json.dumps(key, separators=(",", ":"))


_EV_NONE: tuple[Any, ...] = (None,) * 10
_CACHE_NONE: tuple[Any, ...] = (None,) * 3
_TYPED_NONE = _EV_NONE + _CACHE_NONE


def _ev_fields(row: Any) -> tuple[Any, ...]:
    """(kind, event_id, room_id, type, state_key, redacts, relates_to, membership, rejected, outlier)."""
    if type(row) is list and len(row) == 2:
        kind, data = row
        if type(data) is list:
            if type(kind) is not str:
                return _EV_NONE
            if kind == "ev" and len(data) == 9:
                return (kind, *map(_str_or_none, data[:7]), _bool_or_none(data[7]), _bool_or_none(data[8]))
            if kind == "state" and len(data) == 4:
                room, typ, key, event = map(_str_or_none, data)
                return (kind, event, room, typ, key, None, None, None, None, None)
            if kind == "state-all" and len(data) == 1:
                return (kind, None, _str_or_none(data[0]), None, None, None, None, None, None, None)
            return (kind,) + _EV_NONE[1:]
    return _EV_NONE


def _cache_fields(row: Any) -> tuple[Any, Any, Any]:
    """(cache_func, keys as strings or None, invalidation_ts)."""
    if type(row) is list and len(row) == 3:
        keys = row[1]
        return (
            _str_or_none(row[0]),
            [_key_text(k) for k in keys] if type(keys) is list else None,
            _i64_or_none(row[2]),
        )
    return _CACHE_NONE


def command_values(
    number: int,
    payload: bytes,
    typed: bool,
    ts: bytes | None = None,
    direction: bytes | None = None,
    channel: bytes | None = None,
    problem: str | None = None,
) -> tuple[Any, ...]:
    """The column values (builder order) of one protocol line, parsed by the codec.

    ``problem`` marks a line refused before the codec saw it (a bad prefix or
    capture record); a line the codec refuses gets the codec's message.
    """
    where = (number, _text(ts), _text(direction), _text(channel))
    cmd: Any = None
    head: tuple[Any, ...]
    if direction == NOTE and problem is None:  # a recorder note: "#<word>" and its text
        note = payload.split(b" ", 1)
        text = note[1].decode("utf-8", "replace") if len(note) == 2 else None
        head = ("#" + note[0].decode("utf-8", "replace"), None, None, None, None, None, text, None, None)
        return where + head + _TYPED_NONE if typed else where + head
    if problem is None:
        try:
            cmd = wire.parse_line(payload)
        except ProtocolError as err:
            problem = str(err)
    if cmd is None:
        head = (None, None, None, None, None, None, None, problem, payload.decode("utf-8", "replace"))
        return where + head + _TYPED_NONE if typed else where + head
    cls = type(cmd)
    typed_values = _TYPED_NONE
    if cls is RdataCommand:
        stream = cmd.stream_name
        raw = cmd.raw_row
        row_text = raw.decode() if raw is not None else payload.split(b" ", 4)[4].decode()
        head = ("RDATA", stream, cmd.instance_name, cmd.token, None, row_text, None, None, None)
        if typed:
            if stream == "events":
                typed_values = _ev_fields(cmd.row) + _CACHE_NONE
            elif stream == "caches":
                typed_values = _EV_NONE + _cache_fields(cmd.row)
    elif cls is PositionCommand:
        head = ("POSITION", cmd.stream_name, cmd.instance_name, cmd.new_token, cmd.prev_token, None, None, None, None)
    elif cls is FederationAckCommand:
        head = (cls.NAME, None, cmd.instance_name, cmd.token, None, None, None, None, None)
    else:
        body = payload.split(b" ", 1)
        head = (cls.NAME, None, None, None, None, None, body[1].decode() if len(body) == 2 else None, None, None)
    return where + head + typed_values if typed else where + head


def _split_values(split: Callable[[bytes], Any], number: int, line: bytes, typed: bool) -> tuple[Any, ...] | None:
    parts = split(line)
    if parts is None:
        return None
    ts, direction, channel, payload, problem = parts
    return command_values(number, payload, typed, ts, direction, channel, problem)


def line_values(number: int, line: bytes, typed: bool) -> tuple[Any, ...] | None:
    """The column values of one line of a ``lines`` archive (None for a blank line)."""
    if line and 65 <= line[0] <= 90:  # starts with a command name: no prefix
        return command_values(number, line, typed)
    return _split_values(split_line, number, line, typed)


def monitor_values(number: int, line: bytes, typed: bool) -> tuple[Any, ...] | None:
    """The column values of one line of ``redis-cli MONITOR`` output (None: no payload)."""
    return _split_values(split_monitor, number, line, typed)


def csv_values(number: int, line: bytes, typed: bool) -> tuple[Any, ...] | None:
    """The column values of one line of ``redis-cli --csv`` output (None: no payload)."""
    return _split_values(split_csv, number, line, typed)


#: The row function of each format whose records are single lines (the others: ``payloads``).
ROW_FUNCTIONS: dict[str, Callable[[int, bytes, bool], "tuple[Any, ...] | None"]] = {
    "lines": line_values,
    "monitor": monitor_values,
    "redis-csv": csv_values,
}
assert set(ROW_FUNCTIONS) == set(SPLITTERS)


# ------------------------------------------------------------------ parsing


def _without_cr(data: bytes) -> bytes:
    """Lines joined by newlines with CRLF endings made LF: a ``\r`` before a newline (or at the end) ends a line.

    Wire lines never end in ``\r`` (JSON and redis-cli quote it): one there
    comes from a CRLF file, and left in it would fail every integer at the
    end of a line (POSITION, USER_SYNC ...) and end up in text columns.
    """
    if b"\r" not in data:
        return data
    data = data.replace(b"\r\n", b"\n")
    return data[:-1] if data.endswith(b"\r") else data


def _line_without_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def _batch(columns: Any, source: str, session_time_zone: str, impl: str | None) -> pa.RecordBatch:
    """One output batch from the builder's columns (see ``_archive_py.COLUMNS`` for their order)."""
    arrays = columns.take()
    n = len(arrays[0])
    ts, date = timestamp_columns(arrays[1], session_time_zone, impl)
    out = [pa.repeat(pa.scalar(source, pa.string()), n), arrays[0], ts, date, *arrays[2:]]
    if len(arrays) == HEADER_COLUMNS:  # header-only: the typed columns are null
        out.extend(pa.nulls(n, typ) for _, typ in _TYPED_NULLS)
    return pa.RecordBatch.from_arrays(out, schema=ARROW_SCHEMA)


def _builder(typed: bool, impl: str | None) -> Any:
    return load("spark._archive", impl).ArchiveColumns(typed)


def parse_blocks(
    blocks: Iterable[bytes],
    *,
    source: str,
    first_line: int = 1,
    fmt: str = "lines",
    typed: bool = True,
    batch_rows: int = 65536,
    session_time_zone: str = "UTC",
    impl: str | None = None,
    newline_terminated: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Parse an archive of one-line records (``ROW_FUNCTIONS``) given as blocks of whole lines.

    Lines are numbered on from ``first_line``. The fast path: the column
    builder walks the bytes itself (the compiled twin computes the columns of
    the common lines of every such format without Python objects) and calls
    the format's row function for the rest. Yields batches of at most
    ``batch_rows`` rows. ``newline_terminated``: the blocks are a file's
    bytes as read, where a newline ends every line; bytes after the last one
    are a line the file ends in the middle of, which becomes a malformed row
    (:func:`cut_line_values`) and is not parsed. Without it, the end of the
    last block ends a line too.
    """
    values = ROW_FUNCTIONS.get(fmt)
    if values is None:
        raise ValueError(f"format {fmt!r} has records spanning lines; use parse_block")
    columns = _builder(typed, impl)

    def row_function(number: int, line: bytes) -> tuple[Any, ...] | None:
        return values(number, line, typed)

    number = first_line - 1
    tail = b""
    for data in blocks:
        if newline_terminated and not data.endswith(b"\n"):  # only a file's last block can (sources._line_blocks)
            cut = data.rfind(b"\n") + 1
            data, tail = data[:cut], data[cut:]
        data = _without_cr(data)  # (a block ends at a newline, so no CRLF is cut in two)
        pos = 0
        while pos < len(data):
            pos, number = columns.feed(data, pos, number, batch_rows, row_function, fmt)
            if pos >= len(data):
                break
            yield _batch(columns, source, session_time_zone, impl)  # full: max rows, or the compiled twin's byte cap
    if tail:
        if len(columns) >= batch_rows:
            yield _batch(columns, source, session_time_zone, impl)
        columns.append(cut_line_values(number + 1, tail, typed))
    if len(columns):
        yield _batch(columns, source, session_time_zone, impl)


def cut_line_values(number: int, line: bytes, typed: bool) -> tuple[Any, ...]:
    """The row of a file's last line when no newline ends it: malformed (``ENDS_MID_LINE``), its bytes in ``raw``.

    Not parsed at all, whatever the format: cut short, a token or a prefix can look valid.
    """
    return command_values(number, line, typed, problem=ENDS_MID_LINE)


def parse_file_blocks(
    blocks: Iterable[bytes],
    *,
    source: str,
    first_line: int = 1,
    fmt: str = "lines",
    typed: bool = True,
    batch_rows: int = 65536,
    session_time_zone: str = "UTC",
    impl: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Parse a file's bytes as read, in any format but "auto": blocks ending at newlines (sources.read_chunk_blocks).

    Lines are numbered from ``first_line``. Yields record batches of
    ``ARROW_SCHEMA`` (typed columns null when not ``typed``) with at most
    ``batch_rows`` rows; ``ts``/``date`` are computed as Spark would in
    ``session_time_zone``. ``impl`` picks the column builder twin ("c" or
    "python"; default: the active one).

    A newline ends every line of such blocks, except a last line the file
    ends in the middle of (a copy cut short, a recorder killed, a file still
    being written): that one is a malformed row with ``ENDS_MID_LINE`` in
    ``error`` and its bytes in ``raw``, never parsed (the wire has a line only
    once its newline arrives).
    """
    if fmt in ROW_FUNCTIONS:
        yield from parse_blocks(
            blocks, source=source, first_line=first_line, fmt=fmt, typed=typed, batch_rows=batch_rows,
            session_time_zone=session_time_zone, impl=impl, newline_terminated=True,
        )
        return
    given = [first_line - 1]  # the number of the last whole line given out
    cut: list[bytes] = []

    def whole_lines() -> Iterator[bytes]:
        for data in blocks:
            lines = data.split(b"\n")
            tail = lines.pop()
            if tail:
                cut.append(tail)  # only a file's last block can end without a newline
            given[0] += len(lines)
            yield from lines

    def rows() -> Iterator[tuple[Any, ...] | None]:
        yield from _record_rows(whole_lines(), fmt, first_line, typed)
        if cut:
            yield cut_line_values(given[0] + 1, cut[0], typed)

    yield from _collect(rows(), source=source, typed=typed, batch_rows=batch_rows, session_time_zone=session_time_zone,
                        impl=impl)


def parse_block(
    lines: Iterable[bytes],
    *,
    source: str,
    first_line: int = 1,
    fmt: str = "lines",
    typed: bool = True,
    batch_rows: int = 65536,
    session_time_zone: str = "UTC",
    impl: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Parse archive ``lines`` (without newlines) as :func:`parse_file_blocks` parses a file of them.

    The options are :func:`parse_file_blocks`'; every line is whole (a file
    of these lines ends in a newline). A line that holds a newline itself (a
    message from a column, not a line of a file) stays one line.
    """
    if not isinstance(lines, list):
        lines = list(lines)
    data = b"\n".join([*lines, b""])
    if data.count(b"\n") == len(lines):  # no line holds a newline: the bytes of a file of these lines
        yield from parse_file_blocks(
            [data], source=source, first_line=first_line, fmt=fmt, typed=typed, batch_rows=batch_rows,
            session_time_zone=session_time_zone, impl=impl,
        )
        return
    row_values = ROW_FUNCTIONS.get(fmt)
    rows: Iterator[tuple[Any, ...] | None] = (
        (row_values(n, _line_without_cr(line), typed) for n, line in enumerate(lines, first_line))
        if row_values is not None else _record_rows(lines, fmt, first_line, typed)
    )
    yield from _collect(rows, source=source, typed=typed, batch_rows=batch_rows, session_time_zone=session_time_zone,
                        impl=impl)


def _record_rows(lines: Iterable[bytes], fmt: str, first_line: int, typed: bool) -> Iterator[tuple[Any, ...]]:
    """The rows of ``lines`` (without newlines) of a format whose records may span lines (``payloads``)."""
    for n, payload, ts, direction, channel, problem in payloads(map(_line_without_cr, lines), fmt, first_line):
        yield command_values(n, payload, typed, ts, direction, channel, problem)


def _collect(
    rows: Iterable[tuple[Any, ...] | None], *, source: str, typed: bool, batch_rows: int, session_time_zone: str,
    impl: str | None,
) -> Iterator[pa.RecordBatch]:
    """Batches of at most ``batch_rows`` of ``rows`` (None: no row)."""
    columns = _builder(typed, impl)
    for values in rows:
        if values is None:
            continue
        columns.append(values)
        if len(columns) >= batch_rows:
            yield _batch(columns, source, session_time_zone, impl)
    if len(columns):
        yield _batch(columns, source, session_time_zone, impl)
