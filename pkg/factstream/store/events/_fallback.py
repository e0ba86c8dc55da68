"""Stand-ins used only while ``factstream.ids`` is not importable (single writer).

Same call shapes as the real id generator and StreamChangeCache, deliberately
minimal: one process, one writer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any


class LocalIdGenerator:
    """Sequential ids from the max (or min, backwards) of ``events.stream_ordering``."""

    def __init__(self, start: int, backwards: bool) -> None:
        self._sign = -1 if backwards else 1
        self._last = abs(start)
        self._current = abs(start)
        self._pending: set[int] = set()
        self._done: set[int] = set()

    @classmethod
    async def create(cls, db: Any, backwards: bool) -> LocalIdGenerator:
        agg = "MIN" if backwards else "MAX"
        row = await db.fetchone(f"SELECT {agg}(stream_ordering) FROM events")
        value = int(row[0]) if row and row[0] is not None else 0
        if backwards:
            value = min(value, 0)
        else:
            value = max(value, 0)
        return cls(value, backwards)

    def _complete(self, n: int) -> None:
        self._pending.discard(n)
        self._done.add(n)
        while self._current + 1 in self._done:
            self._current += 1
            self._done.discard(self._current)

    @asynccontextmanager
    async def get_next(self) -> AsyncIterator[int]:
        self._last += 1
        n = self._last
        self._pending.add(n)
        try:
            yield n * self._sign
        finally:
            self._complete(n)

    @asynccontextmanager
    async def get_next_mult(self, count: int) -> AsyncIterator[list[int]]:
        ns = list(range(self._last + 1, self._last + 1 + count))
        self._last += count
        self._pending.update(ns)
        try:
            yield [n * self._sign for n in ns]
        finally:
            for n in ns:
                self._complete(n)

    def current_token(self) -> int:
        return self._current * self._sign

    def get_current_token(self) -> int:
        return self.current_token()


class LocalStreamChangeCache:
    """Entity -> last change position, trusting answers only above ``earliest``."""

    def __init__(self, name: str, current_pos: int, max_size: int = 10000) -> None:
        self.name = name
        self._earliest = current_pos
        self._last: dict[Any, int] = {}
        self._max = max_size

    def entity_has_changed(self, entity: Any, stream_pos: int) -> None:
        if stream_pos <= self._earliest:
            return
        old = self._last.get(entity, self._earliest)
        if stream_pos > old:
            self._last[entity] = stream_pos
        if len(self._last) > self._max:
            victim = min(self._last, key=self._last.__getitem__)
            self._earliest = max(self._earliest, self._last.pop(victim))

    def has_entity_changed(self, entity: Any, stream_pos: int) -> bool:
        if stream_pos < self._earliest:
            return True
        return self._last.get(entity, self._earliest) > stream_pos

    def get_entities_changed(self, entities: Iterable[Any], stream_pos: int) -> set[Any]:
        return {e for e in entities if self.has_entity_changed(e, stream_pos)}
