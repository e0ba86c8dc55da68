"""The readers' change cache: the latest position at which each entity changed.

Why: a reader asked "did room R / user U change since token T?" can usually
answer from memory instead of querying the stream table. The cache is bounded
by the number of distinct positions it remembers; evicting the oldest position
raises the *earliest known* position E. The cache knows every change after E,
so a question about any T >= E is answered exactly, and for T < E the answer
is "changed / unknown" (True, every entity, or a miss), never a wrong "no".
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamChangeCache", "AllEntitiesChangedResult"]


@dataclass(frozen=True)
class AllEntitiesChangedResult:
    """Answer of :meth:`StreamChangeCache.get_all_entities_changed`.

    ``hit`` is False when the cache cannot know (the position is older than
    what it remembers); then ``entities`` is None and the caller must query
    the database. On a hit, ``entities`` lists the changed entities in the
    order of their latest change.
    """

    entities: list[Any] | None

    @property
    def hit(self) -> bool:
        """Whether ``entities`` is a complete answer."""
        return self.entities is not None


class StreamChangeCache:
    """Latest change position per entity for one stream, bounded by ``max_size`` positions."""

    def __init__(
        self,
        name: str,
        current_stream_pos: int,
        max_size: int = 10000,
        prefilled_cache: Mapping[Hashable, int] | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._earliest_known = current_stream_pos
        self._max_pos = current_stream_pos
        self._entity_pos: dict[Hashable, int] = {}
        self._by_pos: dict[int, set[Hashable]] = {}
        self._order: list[int] = []  # distinct positions, ascending
        for entity, pos in (prefilled_cache or {}).items():
            self.entity_has_changed(entity, pos)

    # -- questions

    @property
    def earliest_known_position(self) -> int:
        """Every change after this position is known."""
        return self._earliest_known

    def has_entity_changed(self, entity: Hashable, since: int) -> bool:
        """Whether ``entity`` may have changed after ``since`` (True when unknown)."""
        if since < self._earliest_known:
            return True
        latest = self._entity_pos.get(entity)
        return latest is not None and latest > since

    def get_entities_changed(self, entities: Collection[Hashable], since: int) -> set[Hashable]:
        """The subset of ``entities`` that may have changed after ``since`` (all of them when unknown)."""
        if since < self._earliest_known:
            return set(entities)
        pos_of = self._entity_pos
        return {e for e in entities if pos_of.get(e, since) > since}

    def has_any_entity_changed(self, since: int) -> bool:
        """Whether anything may have changed after ``since`` (True when unknown)."""
        return since < self._earliest_known or self._max_pos > since

    def get_all_entities_changed(self, since: int) -> AllEntitiesChangedResult:
        """Every entity changed after ``since``, or a miss if the cache cannot know."""
        if since < self._earliest_known:
            return AllEntitiesChangedResult(None)
        out: list[Any] = []
        start = bisect.bisect_right(self._order, since)
        for pos in self._order[start:]:
            out.extend(self._by_pos[pos])
        return AllEntitiesChangedResult(out)

    def get_max_pos_of_last_change(self, entity: Hashable) -> int:
        """The position of ``entity``'s latest change, or the earliest known position if none is remembered."""
        return self._entity_pos.get(entity, self._earliest_known)

    def __len__(self) -> int:
        """How many distinct positions are remembered."""
        return len(self._order)

    # -- updates

    def entity_has_changed(self, entity: Hashable, pos: int) -> None:
        """Record that ``entity`` changed at ``pos`` (ignored at or before the earliest known position)."""
        if pos <= self._earliest_known:
            return
        old = self._entity_pos.get(entity)
        if old is not None:
            if old >= pos:
                return
            self._discard(entity, old)
        self._entity_pos[entity] = pos
        bucket = self._by_pos.get(pos)
        if bucket is None:
            self._by_pos[pos] = {entity}
            if not self._order or pos > self._order[-1]:
                self._order.append(pos)
            else:
                bisect.insort(self._order, pos)
        else:
            bucket.add(entity)
        if pos > self._max_pos:
            self._max_pos = pos
        while len(self._order) > self.max_size:
            self._evict_oldest()

    def all_entities_changed(self, pos: int) -> None:
        """Forget everything up to ``pos``: every entity may have changed there."""
        while self._order and self._order[0] <= pos:
            self._evict_oldest()
        self._earliest_known = max(self._earliest_known, pos)
        self._max_pos = max(self._max_pos, pos)

    def _discard(self, entity: Hashable, pos: int) -> None:
        bucket = self._by_pos[pos]
        bucket.discard(entity)
        if not bucket:
            del self._by_pos[pos]
            del self._order[bisect.bisect_left(self._order, pos)]

    def _evict_oldest(self) -> None:
        pos = self._order.pop(0)
        for entity in self._by_pos.pop(pos):
            del self._entity_pos[entity]
        self._earliest_known = max(self._earliest_known, pos)
