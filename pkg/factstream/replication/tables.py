"""Streams backed by plain tables: schema, writer and reader wiring in one place.

A :class:`StreamTable` says how one stream is stored: a table with
``stream_id`` and ``instance_name`` columns plus one column per row field
(JSON-encoded where the field is a list or an object). From it you get the
``CREATE TABLE``, the insert, the reader's :class:`TableUpdateSource` and the
writer's id generator. Applications describe their own tables this way;
``factstream serve``, ``tail --db``, ``logs stream`` and ``factstream demo`` use the three of
:data:`factstream.demo.tables.DEMO_TABLES`. :func:`tables_to_json` and
:func:`tables_from_json` carry a list of tables to another process (a Spark
source's options, ``logs stream --tables FILE``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from json.decoder import JSONDecoder
from typing import Any

from .._wire import ColumnParams, column_text
from ..streams.sources import TableUpdateSource

__all__ = ["StreamTable", "TableWriter", "create_tables", "open_id_generators", "tables_from_json", "tables_to_json"]


@dataclass(frozen=True)
class StreamTable:
    """Storage of one stream: ``table(stream_id, instance_name, *columns)``.

    Columns hold JSON text so every field type (ints, booleans, nulls, lists,
    objects) round-trips exactly on SQLite and PostgreSQL alike; name
    ``plain_columns`` to store some as bare TEXT instead.
    """

    stream: str
    table: str
    columns: tuple[str, ...]
    plain_columns: frozenset[str] = field(default_factory=frozenset)

    @cached_property
    def json_columns(self) -> frozenset[str]:
        """Columns stored as JSON text."""
        return frozenset(self.columns) - self.plain_columns

    @cached_property
    def _json_flags(self) -> tuple[bool, ...]:
        # per column, in order: stored as JSON text (computed once: it is asked for every row)
        return tuple(c not in self.plain_columns for c in self.columns)

    @cached_property
    def row_encoder(self) -> Callable[[int, str, Sequence[Any]], tuple[Any, ...]]:
        """:meth:`insert_params` as a plain function, made once per table (a writer's hot path)."""
        return ColumnParams(self.table, self._json_flags).params

    @cached_property
    def row_decoder(self) -> Callable[[tuple[Any, ...]], list[Any]]:
        """:meth:`to_row` for tuples of exactly the table's columns, made once per table (the publisher's hot path).

        Every JSON column goes through the C scanner inline; anything it does
        not take whole (a NULL, trailing text, an error) sends the row the
        column-by-column way, which gives :meth:`to_row`'s values and errors.
        """
        n = len(self.columns)
        json_cols = [i for i, j in enumerate(self._json_flags) if j]
        if not json_cols:
            scope: dict[str, Any] = {}
            exec(f"def decode(values):\n    return [{', '.join(f'values[{i}]' for i in range(n))}]\n", scope)  # noqa: S102
            return scope["decode"]  # type: ignore[no-any-return]
        scans = "".join(f"        r{i}, e{i} = _scan(values[{i}], 0)\n" for i in json_cols)
        checks = " or ".join(f"e{i} != len(values[{i}])" for i in json_cols)
        cols = ", ".join(f"r{i}" if j else f"values[{i}]" for i, j in enumerate(self._json_flags))
        src = (f"def decode(values):\n"
               f"    try:\n{scans}"
               f"    except (TypeError, ValueError, StopIteration):\n"
               f"        return _slow(values)\n"
               f"    if {checks}:\n"
               f"        return _slow(values)\n"
               f"    return [{cols}]\n")
        scope = {"_scan": _SCAN, "_slow": self.to_row}
        exec(src, scope)  # noqa: S102 - the source is built from column positions only, never from data
        return scope["decode"]  # type: ignore[no-any-return]

    def create_sql(self) -> list[str]:
        """Statements creating the table and its index (idempotent)."""
        cols = ", ".join(f"{c} TEXT" for c in self.columns)
        return [
            f"CREATE TABLE IF NOT EXISTS {self.table} (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, {cols})",
            f"CREATE INDEX IF NOT EXISTS {self.table}_sid ON {self.table} (stream_id)",
        ]

    def insert_sql(self) -> str:
        """INSERT with ``?`` placeholders: stream_id, instance_name, then the columns."""
        marks = ", ".join("?" for _ in range(len(self.columns) + 2))
        return f"INSERT INTO {self.table} (stream_id, instance_name, {', '.join(self.columns)}) VALUES ({marks})"

    def insert_rows(self, engine: str, rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """Steps writing ``rows`` (each from :meth:`insert_params`) in order: ``[(sql, [params]), ...]``.

        For ``Transaction.execute_batch`` / ``Database.run_transaction``. Few
        statements for many rows: on PostgreSQL one, ``INSERT ... SELECT FROM
        json_array_elements(?)``, taking the rows as one JSON text (one parse
        and one execution for any number of rows, the same statement text, so
        psycopg's query cache keeps it, and no per-value adaptation in
        Python); elsewhere multi-row ``VALUES`` of at most
        :data:`SQLITE_VALUES_PARAMETERS` parameters each. Values must be text
        (or None): the JSON-encoded columns are.
        """
        if not rows:
            raise ValueError("no rows to insert")
        if engine == "postgres":
            return [(self._insert_json_sql, [(json.dumps(rows, ensure_ascii=False),)])]
        per = max(1, SQLITE_VALUES_PARAMETERS // (len(self.columns) + 2))
        return [
            (self._insert_values_sql(len(chunk)), [tuple(chain.from_iterable(chunk))])
            for chunk in (rows[i:i + per] for i in range(0, len(rows), per))
        ]

    def _insert_values_sql(self, n: int) -> str:
        cache = self._values_sql
        sql = cache.get(n)
        if sql is None:
            marks = "(" + ", ".join("?" for _ in range(len(self.columns) + 2)) + ")"
            sql = cache[n] = (f"INSERT INTO {self.table} (stream_id, instance_name, {', '.join(self.columns)}) VALUES "
                              + ", ".join([marks] * n))
        return sql

    @cached_property
    def _values_sql(self) -> dict[int, str]:
        return {}

    @cached_property
    def _insert_json_sql(self) -> str:
        # The rows travel as one JSON array of arrays (encoded by the stdlib's C encoder; the
        # server splits it); WITH ORDINALITY ... ORDER BY: they reach the table, and its
        # row-order column, in the order given.
        fields = ", ".join(f"r->>{i + 2}" for i in range(len(self.columns)))
        return (
            f"INSERT INTO {self.table} (stream_id, instance_name, {', '.join(self.columns)}) "
            f"SELECT (r->>0)::bigint, r->>1, {fields} FROM json_array_elements(?::json) WITH ORDINALITY AS u(r, n) ORDER BY n"
        )

    def insert_params(self, token: int, instance_name: str, row: Sequence[Any]) -> tuple[Any, ...]:
        """Parameters for :meth:`insert_sql` of one wire row."""
        return self.row_encoder(token, instance_name, row)

    def to_row(self, values: tuple[Any, ...]) -> list[Any]:
        """The wire row of a selected tuple (columns only)."""
        return [_from_json(v) if j and v is not None else v for j, v in zip(self._json_flags, values)]

    def source(self, db: Any) -> TableUpdateSource:
        """The update source reading this table (a token's rows in the order they were written)."""
        from ..ids import default_sequence_name

        postgres = getattr(db, "engine", "") == "postgres"
        return TableUpdateSource(
            db, self.table, self.columns, to_row=self.row_decoder, tiebreak=ROW_ORDER_COLUMN if postgres else "rowid",
            stream_name=self.stream, sequence_name=default_sequence_name(self.stream) if postgres else None,
        )

    def id_tables(self) -> tuple[tuple[str, str, str], ...]:
        """``tables=`` argument of ``factstream.ids.create_id_generator``."""
        return ((self.table, "instance_name", "stream_id"),)


#: Parameters of one multi-row ``VALUES`` insert on SQLite (a few dozen rows). Short statements of
#: the same text each time: the driver's statement cache keeps them prepared, and only the last,
#: shorter one of a batch is parsed. Parsing is what long ones cost (callgrind, serve --produce's
#: database thread, instructions per row: 32,766 parameters 22,253, 999 14,190, 256 10,166, 128 9,646).
SQLITE_VALUES_PARAMETERS = 256


# The column codec runs for every row a writer writes and a publisher reads back. Writing is
# wire.column_text (json.dumps' text; compiled with the codec); reading skips json.loads' per-call
# set-up: the stdlib's C scanner, made once, gives the same values (json.loads' strictness, with
# json.loads itself raising its own error for anything the quick path does not take).
_SCAN = JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, not declared in typeshed
_to_json = column_text


def _from_json(text: str) -> Any:
    """``json.loads(text)``, faster for the texts :func:`_to_json` writes."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)  # raises json.loads' own error (or takes what the scanner alone does not)
    if end != len(text):
        return json.loads(text)
    return value


def tables_to_json(tables: Sequence[StreamTable]) -> str:
    """``tables`` as a JSON list of ``{stream, table, columns, plain_columns}`` (see :func:`tables_from_json`)."""
    return json.dumps([
        {"stream": t.stream, "table": t.table, "columns": list(t.columns), "plain_columns": sorted(t.plain_columns)}
        for t in tables
    ])


def tables_from_json(text: str) -> dict[str, StreamTable]:
    """Stream -> :class:`StreamTable` of a JSON list written by :func:`tables_to_json` (or by hand).

    Raises ``ValueError`` naming what is wrong, so a user's file gets a clear error.
    """
    try:
        specs = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(specs, list) or not specs:
        raise ValueError("expected a non-empty JSON list of {\"stream\", \"table\", \"columns\"} objects")
    out: dict[str, StreamTable] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not all(k in spec for k in ("stream", "table", "columns")):
            raise ValueError(f"entry {i}: needs \"stream\", \"table\" and \"columns\"")
        columns = spec["columns"]
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
            raise ValueError(f"entry {i}: \"columns\" must be a non-empty list of column names")
        out[str(spec["stream"])] = StreamTable(
            str(spec["stream"]), str(spec["table"]), tuple(columns), frozenset(spec.get("plain_columns", ()))
        )
    return out


#: PostgreSQL only: numbers rows in insertion order, so a token's rows come back in the order written
#: (SQLite's ``rowid`` does that already).
ROW_ORDER_COLUMN = "row_seq"


async def create_tables(db: Any, tables: Sequence[StreamTable]) -> None:
    """Create the tables (idempotent; on PostgreSQL also adds the row-order column to older tables)."""
    for t in tables:
        for sql in t.create_sql():
            await db.execute(sql)
        if getattr(db, "engine", "") == "postgres":
            await db.execute(
                f"ALTER TABLE {t.table} ADD COLUMN IF NOT EXISTS {ROW_ORDER_COLUMN} BIGINT GENERATED BY DEFAULT AS IDENTITY"
            )


async def open_id_generators(
    db: Any, instance_name: str, tables: Sequence[StreamTable], writers: Sequence[str] | None = None
) -> dict[str, Any]:
    """Stream -> id generator (recovering positions from the tables).

    ``writers`` names every writer instance of the streams; by default this
    instance is the only one, whatever its name (a writer need not be called
    ``master``). On PostgreSQL, several writers share one sequence per stream.
    """
    from ..ids import create_id_generator

    names = tuple(writers) if writers is not None else (instance_name,)
    return {
        t.stream: await create_id_generator(
            db, stream_name=t.stream, instance_name=instance_name, writers=names, tables=t.id_tables()
        )
        for t in tables
    }


class TableWriter:
    """Writes facts of one table-backed stream: one transaction, one token, its rows.

    ``await writer.write(rows) -> token``; the id generator completes the
    token after commit (or rollback), its listener (the publisher) then sends
    the rows. ``CacheInvalidator(TableWriter(db, gen, caches_table).write)``
    gives a database-backed caches stream.
    """

    def __init__(self, db: Any, id_gen: Any, table: StreamTable, instance_name: str | None = None) -> None:
        self.db = db
        self.id_gen = id_gen
        self.table = table
        self.instance_name = instance_name or id_gen.instance_name

    async def write(self, rows: Sequence[Any]) -> int:
        """Persist ``rows`` (wire rows or typed rows) at one new token; returns it."""
        from ..streams.rows import Row

        t = self.table
        async with self.db.transaction() as txn:
            token = int(await self.id_gen.get_next_txn(txn))
            params = [
                t.insert_params(token, self.instance_name, r.to_wire() if isinstance(r, Row) else r) for r in rows
            ]
            if params:
                await txn.executemany(t.insert_sql(), params)
        return token
