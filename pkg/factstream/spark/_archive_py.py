"""Pure-Python twin of the archive column builder (the specification of ``_archive_c``).

An archive parse turns lines into Arrow columns. What one line becomes is
decided in one place, ``factstream.spark.lines.line_values`` (the *row
function*); this builder only collects the rows it returns and turns them into
Arrow arrays. The compiled twin computes the common lines' rows itself, without
creating Python objects, and calls the row function for everything else, so
the two twins give the same columns by construction wherever the compiled fast
path steps aside, and the tests compare them everywhere else.

Columns, in order (``COLUMNS``): the 13 header columns, then, when typed, the
13 typed events/caches columns. ``source_file`` is not a builder column: it is
constant per batch and added by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ArchiveColumns", "COLUMNS", "HEADER_COLUMNS", "RowFunction", "timestamp_columns"]

#: (name, Arrow type name) of every builder column, in order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("line_number", "int64"),
    ("ts_text", "string"),
    ("direction", "string"),
    ("channel", "string"),
    ("command", "string"),
    ("stream", "string"),
    ("instance", "string"),
    ("token", "int64"),
    ("prev_token", "int64"),
    ("row", "string"),
    ("data", "string"),
    ("error", "string"),
    ("raw", "string"),
    ("ev_kind", "string"),
    ("ev_event_id", "string"),
    ("ev_room_id", "string"),
    ("ev_type", "string"),
    ("ev_state_key", "string"),
    ("ev_redacts", "string"),
    ("ev_relates_to", "string"),
    ("ev_membership", "string"),
    ("ev_rejected", "bool"),
    ("ev_outlier", "bool"),
    ("cache_func", "string"),
    ("cache_keys", "list<string>"),
    ("cache_invalidation_ts", "int64"),
)
_PY_TYPES: tuple[tuple[str, type], ...] = tuple(
    (name, {"int64": int, "string": str, "bool": bool, "list<string>": list}[typ]) for name, typ in COLUMNS
)
#: How many of COLUMNS a header-only parse fills.
HEADER_COLUMNS = 13

#: ``row_function(line_number, line) -> values or None``: one archive line
#: (no newline) to a tuple of column values (None: the line is skipped).
RowFunction = Callable[[int, bytes], "tuple[Any, ...] | None"]


def _arrow_type(name: str) -> pa.DataType:
    import pyarrow as pa

    return {"int64": pa.int64(), "string": pa.string(), "bool": pa.bool_(), "list<string>": pa.list_(pa.string())}[name]


def _valid_text(value: str) -> str:
    """``value`` as Arrow can store it: lone surrogates (from JSON escapes) replaced."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def _fix(value: Any) -> Any:
    if type(value) is str:
        return _valid_text(value)
    if type(value) is list:
        return [_valid_text(v) for v in value]
    return value


class ArchiveColumns:
    """Collects archive rows and hands them out as Arrow arrays, one batch at a time."""

    def __init__(self, typed: bool) -> None:
        self.typed = typed
        self._width = len(COLUMNS) if typed else HEADER_COLUMNS
        self._rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, values: tuple[Any, ...]) -> None:
        """Add one row: a tuple of column values as the row function returns them."""
        if len(values) != self._width:
            raise ValueError(f"expected {self._width} column values, got {len(values)}")
        for value, (name, typ) in zip(values, _PY_TYPES):
            if value is None:
                continue
            ok = type(value) is typ
            if ok and typ is list:
                ok = all(type(v) is str for v in cast("list[Any]", value))
            if not ok:
                raise TypeError(f"expected {typ.__name__} for column {name}, got {type(value).__name__}")
        self._rows.append(values)

    def feed(
        self, data: bytes, pos: int, number: int, max_rows: int, row_function: RowFunction, fmt: str = "lines"
    ) -> tuple[int, int]:
        """Add the lines of ``data[pos:]`` until ``max_rows`` rows are held.

        Lines end at ``\\n`` or at the end of ``data``; ``number`` is the
        number of the line before ``data[pos]``. Empty lines are skipped
        without calling ``row_function``. Returns ``(pos, number)`` to resume
        from: ``pos == len(data)`` once every line was taken. ``fmt`` names the
        archive format ``row_function`` reads (the compiled twin's fast paths
        follow it; this twin asks ``row_function`` about every line).
        """
        rows = self._rows
        size = len(data)
        while pos < size and len(rows) < max_rows:
            end = data.find(b"\n", pos)
            if end < 0:
                end = size
            number += 1
            if end > pos:
                values = row_function(number, data[pos:end])
                if values is not None:
                    self.append(values)
            pos = end + 1
        return min(pos, size), number

    def take(self) -> list[pa.Array]:
        """The held rows as one Arrow array per column (COLUMNS order); the builder is emptied."""
        import pyarrow as pa

        rows, self._rows = self._rows, []
        n = len(rows)
        arrays = []
        for k, (_, type_name) in enumerate(COLUMNS[: self._width]):
            typ = _arrow_type(type_name)
            if n == 0:
                arrays.append(pa.array([], typ))
                continue
            values = [r[k] for r in rows]
            try:
                arrays.append(pa.array(values, typ))
            except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
                arrays.append(pa.array([_fix(v) for v in values], typ))
        return arrays


_DAY_MICROS = 86_400_000_000


def timestamp_columns(
    ts_text: pa.Array, offset_seconds: int, micros_of: Callable[[str], int | None]
) -> tuple[pa.Array, pa.Array]:
    """(micros since the epoch as int64, session-zone days as int32) of timestamp texts.

    ``micros_of`` is the specification (``spark.timestamps.timestamp_micros``
    in the session zone); the zone is the fixed offset ``offset_seconds``, so
    the date is a floor division. The compiled twin parses the text itself.
    """
    import pyarrow as pa

    micros = [None if t is None else micros_of(t) for t in ts_text.to_pylist()]
    shift = offset_seconds * 1_000_000
    days = [None if m is None else (m + shift) // _DAY_MICROS for m in micros]
    return pa.array(micros, pa.int64()), pa.array(days, pa.int32())
