"""Update sources: how to fetch the facts of a stream between two positions.

Every source answers Synapse's question::

    await source.get_updates(instance_name, from_token, upto_token, limit)
        -> (updates, upto_token, limited)

``updates`` is a list of ``(token, row)`` in token order with
``from_token < token <= upto_token``; when ``limited`` is true the returned
``upto_token`` is where this page stopped (a token boundary: all rows of that
token are included) and the caller asks again from there. A writer uses its
source to turn "position moved old -> new" into rows; a reader uses one to
repair gaps (catch-up).

- ``factstream.replication.MemoryUpdateSource``: facts held in a writer's
  memory (typing, benchmarks, tests); bounded, answers only for what it
  still holds. It lives with the replication relay, whose window it is.
- :class:`TableUpdateSource`: facts in a backing table, read through
  ``factstream.store.database`` (SQLite or PostgreSQL).
- ``factstream.transport.fetch.RemoteUpdateSource``: asks the writer process
  (its ``FetchServer``), for streams that live only in its memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .._checks import whole
from ..errors import FactstreamError

__all__ = [
    "UpdateSource",
    "HeadSource",
    "Updates",
    "TableUpdateSource",
    "UpdatesUnavailable",
]

#: ``(updates, upto_token, limited)``.
Updates = tuple[list[tuple[int, Any]], int, bool]


class UpdatesUnavailable(FactstreamError):
    """The source no longer holds the facts asked for (e.g. a memory source's window moved on)."""


@runtime_checkable
class UpdateSource(Protocol):
    """Anything that can list a stream's facts between two positions (see module doc)."""

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        """Rows of ``instance_name`` in ``(from_token, upto_token]``, at most about ``limit``."""
        ...


@runtime_checkable
class HeadSource(Protocol):
    """A source that can also say how far the stream can possibly have got.

    A reader uses :meth:`stream_head` to check a writer's claim (a POSITION, an
    RDATA token) against its database before moving past rows it has not seen:
    an honest writer's position never exceeds the head, because ids are handed
    out (and rows committed) before they are announced.
    """

    async def stream_head(self) -> int:
        """The highest token handed out for the stream by any writer, as the database shows it."""
        ...


def page(updates: Sequence[tuple[int, Any]], upto_token: int, limit: int) -> Updates:
    """Cut sorted ``updates`` to about ``limit`` rows without splitting a token.

    Returns Synapse's triple; when cut, ``upto_token`` becomes the last token
    kept. A single token with more than ``limit`` rows is returned whole.
    ``limit`` must be at least 1: a page of 0 rows would say "cut" with no
    rows and a caller would jump over the facts it never got.
    """
    whole("page limit", limit)
    if len(updates) <= limit:
        return list(updates), upto_token, False
    last = updates[limit - 1][0]
    end = limit
    while end < len(updates) and updates[end][0] == last:
        end += 1
    if end == len(updates):
        return list(updates), upto_token, False
    return list(updates[:end]), last, True


async def fetch_page(
    fetch: Callable[[int, int, int], Awaitable[Sequence[Sequence[Any]]]],
    from_token: int,
    upto_token: int,
    limit: int,
) -> tuple[list[Sequence[Any]], int, bool]:
    """Rows in ``(from_token, upto_token]``, about ``limit`` of them, never splitting a token.

    ``fetch(from_token, upto_token, n)`` returns at most ``n`` rows ordered by
    token, the token first in each row. One extra row tells whether the page
    ended inside a token; if it did, that whole token is fetched and kept (a
    single token larger than the page is returned whole) and the page stops
    after it. Returns ``(rows, upto, limited)`` as Synapse's update functions.
    ``limit`` must be at least 1 (see :func:`page`).
    """
    whole("page limit", limit)
    rows = list(await fetch(from_token, upto_token, limit + 1))
    if len(rows) <= limit:
        return rows, upto_token, False
    last = int(rows[limit - 1][0])
    if int(rows[limit][0]) != last:
        return rows[:limit], last, True
    last_rows = await fetch(last - 1, last, 1_000_000_000)
    return [r for r in rows if int(r[0]) < last] + list(last_rows), last, True


class TableUpdateSource:
    """Facts read from a backing table through ``factstream.store.database``.

    ``columns`` are the row's fields in wire order; ``instance_column`` may be
    None for single-writer tables. ``to_row`` turns a result tuple (without the
    token) into the wire row (default: a list). The query pages by token so a
    token's rows are never split.

    ``tiebreak`` orders the rows of one token (SQL after ``ORDER BY id,``):
    the order they were inserted in, which is the order the writer wrote
    them (``rowid`` on SQLite, an identity column on PostgreSQL, whose heap
    order is not stable). Without it PostgreSQL may return a multi-row
    token's rows in a different order on every query.

    ``stream_name`` (and ``sequence_name`` on PostgreSQL) let
    :meth:`stream_head` also read ``stream_positions`` and the stream's id
    sequence, so ids handed out for rows that were rolled back count too.
    """

    def __init__(
        self,
        db: Any,
        table: str,
        columns: Sequence[str],
        *,
        id_column: str = "stream_id",
        instance_column: str | None = "instance_name",
        to_row: Callable[[tuple[Any, ...]], Any] | None = None,
        where: str = "",
        backwards: bool = False,
        tiebreak: str | None = None,
        stream_name: str | None = None,
        sequence_name: str | None = None,
    ) -> None:
        self.db = db
        self.stream_name = stream_name
        self.sequence_name = sequence_name
        self.backwards = backwards
        self.table = table
        self.columns = list(columns)
        self.id_column = id_column
        self.instance_column = instance_column
        self.to_row = to_row or list
        # Backwards ids: token t is id -t, so (from, upto] is ids in [-upto, -from).
        token_expr = f"-{id_column}" if backwards else id_column
        cols = ", ".join([token_expr, *self.columns])
        cond = f"{token_expr} > ? AND {token_expr} <= ?"
        if instance_column:
            cond += f" AND {instance_column} = ?"
        if where:
            cond += f" AND ({where})"
        order = f"{id_column} DESC" if backwards else id_column
        if tiebreak:
            order += f", {tiebreak}"
        self._sql = f"SELECT {cols} FROM {table} WHERE {cond} ORDER BY {order} LIMIT ?"
        self._head_sql = f"SELECT MAX({token_expr}) FROM {table}"

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        extra: tuple[Any, ...] = (instance_name,) if self.instance_column else ()

        def fetch(lo: int, hi: int, n: int) -> Awaitable[list[Any]]:
            return _fetchall(self.db, self._sql, (lo, hi, *extra, n))

        rows, upto, limited = await fetch_page(fetch, from_token, upto_token, limit)
        return [(int(t[0]), self.to_row(tuple(t[1:]))) for t in rows], upto, limited

    async def stream_head(self) -> int:
        """The highest token handed out for the stream, as far as this database shows (see :class:`HeadSource`).

        The most of: the table's highest token (any writer), the stream's
        ``stream_positions`` (when ``stream_name`` is set and the table
        exists) and, on PostgreSQL, the id sequence (``sequence_name``).
        """
        head = 0
        row = (await _fetchall(self.db, self._head_sql, ()))[0]
        if row[0] is not None:
            head = int(row[0])
        if self.stream_name is not None:
            try:
                rows = await _fetchall(
                    self.db, "SELECT MAX(stream_id) FROM stream_positions WHERE stream_name = ?", (self.stream_name,)
                )
            except Exception as err:  # noqa: BLE001 - the table is optional (a database no generator opened)
                if "stream_positions" not in str(err):
                    raise
            else:
                if rows and rows[0][0] is not None:
                    head = max(head, int(rows[0][0]))
        if self.sequence_name is not None and getattr(self.db, "engine", "") == "postgres":
            # pg_sequences, not the sequence itself: a missing sequence is no row, not an error.
            rows = await _fetchall(
                self.db, "SELECT last_value FROM pg_sequences WHERE sequencename = ?", (self.sequence_name,)
            )
            if rows and rows[0][0] is not None:
                head = max(head, int(rows[0][0]))
        # A stream's position starts at 1 (its first id is 2, as in Synapse): a fresh writer's
        # announced 1 is backed by nothing written yet and must not be held as unbacked.
        return max(head, 1)


async def _fetchall(db: Any, sql: str, params: Sequence[Any]) -> list[Any]:
    result = db.fetchall(sql, tuple(params))
    if hasattr(result, "__await__"):
        result = await result
    return list(result)
