"""The pending-completion heap, pure-Python twin (the readable specification).

One :class:`PendingHeap` belongs to one writer. It holds the stream ids the
writer has reserved and not yet absorbed into its *position*: the largest id
such that every id the writer reserved at or below it has completed (a failed
or rolled-back write counts as completed; it leaves a hole that the position
moves past).

Ids are plain integers growing upwards (a backwards stream is handled by the
caller negating ids, see ``factstream.ids``). Invariant kept after every call:
the smallest tracked id is still pending, so everything below it is settled
and the position is the last id absorbed. Completing an id therefore costs one
hash lookup plus O(log n) per id absorbed, each id being absorbed once.

The compiled twin ``factstream.ids._heap_c`` has the same names and behaviour,
including error types and messages.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterable

__all__ = ["PendingHeap", "INT64_MIN", "INT64_MAX"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _check(value: int) -> int:
    value = operator.index(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError("stream id out of the signed 64-bit range")
    return value


class PendingHeap:
    """Reserved-but-incomplete ids of one writer, and its position.

    ``reserve(id)`` registers an id the writer obtained (it must lie above the
    position and not be tracked already). ``complete(id)`` marks it finished
    and returns the new position when the position moved, else ``None``.
    ``advance(p)`` moves the position of an *idle* writer (nothing tracked,
    no hold) up to ``p``; a busy writer is held back by its lowest pending id,
    so then it returns ``None`` and changes nothing. ``hold(b)`` / ``release(b)``
    bracket an id on its way (larger than ``b``): meanwhile the position does
    not pass ``b``.
    """

    __slots__ = ("_position", "_heap", "_done", "_pending", "_holds")

    def __init__(self, position: int = 1) -> None:
        self._position = _check(position)
        self._heap: list[int] = []
        #: tracked id -> completed?
        self._done: dict[int, bool] = {}
        self._pending = 0
        #: bounds of ids on their way (see ``hold``); few at a time, so a plain list
        self._holds: list[int] = []

    @property
    def position(self) -> int:
        """The writer's current position."""
        return self._position

    @property
    def pending(self) -> int:
        """How many reserved ids have not completed."""
        return self._pending

    def __len__(self) -> int:
        """How many ids are tracked (pending, or completed above a pending one)."""
        return len(self._heap)

    @property
    def holds(self) -> int:
        """How many holds (ids on their way) are in place."""
        return len(self._holds)

    def is_idle(self) -> bool:
        """True when nothing is in flight (the position may then jump)."""
        return not self._heap and not self._holds

    def hold(self, bound: int) -> None:
        """An id is on its way and will be larger than ``bound``: keep the position at or below it.

        This covers the window between asking a sequence for an id and
        reserving it. Release with ``release(bound)`` once the id is reserved
        (or the request failed).
        """
        _check(bound)
        if bound < self._position:
            raise ValueError(f"hold bound {bound} is below the position {self._position}")
        self._holds.append(bound)

    def release(self, bound: int) -> int | None:
        """Drop one hold at ``bound``; the new position, or None."""
        _check(bound)
        try:
            self._holds.remove(bound)
        except ValueError:
            raise ValueError(f"no hold at {bound}") from None
        return self._absorb()

    def lowest_pending(self) -> int | None:
        """The smallest pending id (which holds the position back), or None."""
        return self._heap[0] if self._heap else None

    def is_pending(self, stream_id: int) -> bool:
        """Whether ``stream_id`` is reserved and not completed."""
        return self._done.get(stream_id) is False

    def pending_ids(self) -> list[int]:
        """The pending ids, ascending."""
        return sorted(i for i, done in self._done.items() if not done)

    def reserve(self, stream_id: int) -> None:
        """Register ``stream_id`` as reserved by this writer."""
        _check(stream_id)
        if stream_id <= self._position:
            raise ValueError(f"stream id {stream_id} is at or below the position {self._position}")
        if stream_id in self._done:
            raise ValueError(f"stream id {stream_id} is already reserved")
        self._done[stream_id] = False
        self._pending += 1
        heapq.heappush(self._heap, stream_id)

    def reserve_many(self, stream_ids: Iterable[int]) -> None:
        """Reserve several ids (all checked first: on error nothing is reserved)."""
        ids = list(stream_ids)
        seen: set[int] = set()
        for stream_id in ids:
            _check(stream_id)
            if stream_id <= self._position:
                raise ValueError(f"stream id {stream_id} is at or below the position {self._position}")
            if stream_id in self._done or stream_id in seen:
                raise ValueError(f"stream id {stream_id} is already reserved")
            seen.add(stream_id)
        for stream_id in ids:
            self._done[stream_id] = False
            heapq.heappush(self._heap, stream_id)
        self._pending += len(ids)

    def complete(self, stream_id: int) -> int | None:
        """Mark ``stream_id`` finished (committed or failed); the new position, or None."""
        _check(stream_id)
        if self._done.get(stream_id) is not False:
            if stream_id in self._done:
                raise ValueError(f"stream id {stream_id} is already completed")
            raise ValueError(f"stream id {stream_id} was not reserved")
        self._done[stream_id] = True
        self._pending -= 1
        return self._absorb()

    def complete_many(self, stream_ids: Iterable[int]) -> int | None:
        """Complete several ids (all checked first); the new position, or None."""
        ids = list(stream_ids)
        seen: set[int] = set()
        for stream_id in ids:
            _check(stream_id)
            if self._done.get(stream_id) is not False or stream_id in seen:
                if stream_id in self._done:
                    raise ValueError(f"stream id {stream_id} is already completed")
                raise ValueError(f"stream id {stream_id} was not reserved")
            seen.add(stream_id)
        for stream_id in ids:
            self._done[stream_id] = True
        self._pending -= len(ids)
        return self._absorb()

    def _absorb(self) -> int | None:
        heap = self._heap
        done = self._done
        moved = False
        limit = min(self._holds) if self._holds else None
        while heap and done[heap[0]] and (limit is None or heap[0] <= limit):
            stream_id = heapq.heappop(heap)
            del done[stream_id]
            self._position = stream_id
            moved = True
        return self._position if moved else None

    def advance(self, new_position: int) -> int | None:
        """Move an idle writer's position up to ``new_position``; the new position, or None."""
        _check(new_position)
        if self._heap or self._holds or new_position <= self._position:
            return None
        self._position = new_position
        return new_position

    def __repr__(self) -> str:
        return (
            f"PendingHeap(position={self._position}, pending={self._pending}, tracked={len(self._heap)}, "
            f"holds={len(self._holds)})"
        )
