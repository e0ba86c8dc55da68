"""Streams backed by plain tables: schema, writer and reader wiring in one place.

A :class:`StreamTable` says how one stream is stored: a table with
``stream_id`` and ``instance_name`` columns plus one column per row field
(JSON-encoded where the field is a list or an object). From it you get the
``CREATE TABLE``, the insert, the reader's :class:`TableUpdateSource` and the
writer's id generator. ``factstream serve``, ``tail --db`` and the demo use
the :data:`DEMO_TABLES` (to_device, receipts, caches with Synapse's row
shapes); applications describe their own tables the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..streams.sources import TableUpdateSource

__all__ = ["StreamTable", "TableWriter", "DEMO_TABLES", "create_tables", "open_id_generators"]


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

    @property
    def json_columns(self) -> frozenset[str]:
        """Columns stored as JSON text."""
        return frozenset(self.columns) - self.plain_columns

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

    def insert_params(self, token: int, instance_name: str, row: Sequence[Any]) -> tuple[Any, ...]:
        """Parameters for :meth:`insert_sql` of one wire row."""
        vals = [json.dumps(v) if c in self.json_columns else v for c, v in zip(self.columns, row, strict=True)]
        return (token, instance_name, *vals)

    def to_row(self, values: tuple[Any, ...]) -> list[Any]:
        """The wire row of a selected tuple (columns only)."""
        return [json.loads(v) if c in self.json_columns and v is not None else v for c, v in zip(self.columns, values)]

    def source(self, db: Any) -> TableUpdateSource:
        """The update source reading this table."""
        return TableUpdateSource(db, self.table, self.columns, to_row=self.to_row)

    def id_tables(self) -> tuple[tuple[str, str, str], ...]:
        """``tables=`` argument of ``factstream.ids.create_id_generator``."""
        return ((self.table, "instance_name", "stream_id"),)


#: Three Synapse streams stored as plain tables (rows exactly as on the wire).
DEMO_TABLES: tuple[StreamTable, ...] = (
    StreamTable("to_device", "demo_to_device", ("entity",), frozenset({"entity"})),
    StreamTable("receipts", "demo_receipts", ("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data")),
    StreamTable("caches", "demo_caches", ("cache_func", "keys", "invalidation_ts")),
)


async def create_tables(db: Any, tables: Sequence[StreamTable] = DEMO_TABLES) -> None:
    """Create the tables (idempotent)."""
    for t in tables:
        for sql in t.create_sql():
            await db.execute(sql)


async def open_id_generators(
    db: Any, instance_name: str, tables: Sequence[StreamTable] = DEMO_TABLES, writers: Sequence[str] | None = None
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
