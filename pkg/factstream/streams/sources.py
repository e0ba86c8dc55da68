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

- :class:`MemoryUpdateSource`: facts held in a writer's memory (typing,
  benchmarks, tests); bounded, answers only for what it still holds.
- :class:`TableUpdateSource`: facts in a backing table, read through
  ``factstream.store.database`` (SQLite or PostgreSQL).
- ``factstream.transport.tcp.RemoteUpdateSource``: asks the writer process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ..errors import FactstreamError

__all__ = ["UpdateSource", "Updates", "MemoryUpdateSource", "TableUpdateSource", "UpdatesUnavailable"]

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


def page(updates: Sequence[tuple[int, Any]], upto_token: int, limit: int) -> Updates:
    """Cut sorted ``updates`` to about ``limit`` rows without splitting a token.

    Returns Synapse's triple; when cut, ``upto_token`` becomes the last token
    kept. A single token with more than ``limit`` rows is returned whole.
    """
    if len(updates) <= limit:
        return list(updates), upto_token, False
    last = updates[limit - 1][0]
    end = limit
    while end < len(updates) and updates[end][0] == last:
        end += 1
    if end == len(updates):
        return list(updates), upto_token, False
    return list(updates[:end]), last, True


class MemoryUpdateSource:
    """The recent facts of in-memory streams, kept by the writer (bounded per stream).

    The writer calls ``add(instance_name, token, row)`` for each row *before*
    completing its token; rows older than ``capacity`` are forgotten, and a
    request reaching below the window raises :class:`UpdatesUnavailable` so a
    reader knows it lost facts instead of silently skipping them. Holes
    (tokens without rows) need no record. ``get_updates_now`` is the
    synchronous :meth:`get_updates` (the writer's hot path).

    The rows live in a :class:`factstream._relay.RowWindow` (compiled in a
    compiled build; ``relay`` picks the twin, default the active one), whose
    ``add`` and ``get_updates_now`` are this source's, without a Python call
    in between.
    """

    #: ``add(instance_name, token, row)``: record a row (tokens non-decreasing, except out-of-order completions).
    add: Callable[[str, int, Any], None]
    #: ``get_updates_now(instance_name, from_token, upto_token, limit)``: :meth:`get_updates`, synchronously.
    get_updates_now: Callable[[str, int, int, int], Updates]

    def __init__(self, capacity: int = 100_000, *, relay: ModuleType | None = None) -> None:
        if relay is None:
            from .. import _relay  # not at import time: the relay imports this module

            relay = _relay
        self.window = relay.RowWindow(capacity)
        self.add = self.window.add
        self.get_updates_now = self.window.get_updates_now

    @property
    def capacity(self) -> int:
        """Rows kept per writer instance (up to twice as many before the oldest are dropped)."""
        return int(self.window.capacity)

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.window.capacity = value

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        return self.get_updates_now(instance_name, from_token, upto_token, limit)


class TableUpdateSource:
    """Facts read from a backing table through ``factstream.store.database``.

    ``columns`` are the row's fields in wire order; ``instance_column`` may be
    None for single-writer tables. ``to_row`` turns a result tuple (without the
    token) into the wire row (default: a list). The query pages by token so a
    token's rows are never split.
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
    ) -> None:
        self.db = db
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
        self._sql = f"SELECT {cols} FROM {table} WHERE {cond} ORDER BY {order} LIMIT ?"

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        params: list[Any] = [from_token, upto_token]
        if self.instance_column:
            params.append(instance_name)
        # One extra row tells whether the page ended inside a token.
        result = await _fetchall(self.db, self._sql, (*params, limit + 1))
        updates = [(int(t[0]), self.to_row(tuple(t[1:]))) for t in result]
        if len(updates) <= limit:
            return updates, upto_token, False
        last = updates[limit - 1][0]
        if updates[limit][0] != last:
            return updates[:limit], last, True
        # The page ends inside a token: fetch that whole token, keep it, stop after it.
        rest = await _fetchall(
            self.db, self._sql, (last - 1, last, *params[2:], 1_000_000_000)
        )
        head = [u for u in updates if u[0] < last]
        return head + [(int(t[0]), self.to_row(tuple(t[1:]))) for t in rest], last, True


async def _fetchall(db: Any, sql: str, params: Sequence[Any]) -> list[Any]:
    result = db.fetchall(sql, tuple(params))
    if hasattr(result, "__await__"):
        result = await result
    return list(result)
