"""Positions of one stream as seen by one process: pure bookkeeping, no I/O.

Why separate from the generator: every rule about positions (per-writer,
linear, idle writers, the fetch window, listeners) lives here and can be
tested exhaustively without a database; the generator only adds id
allocation and persistence around it.

All positions are in *token orientation*: they only grow. (A backwards stream
negates ids at the generator's edge; see ``factstream.ids.generators``.)

Rules:

* The local writer's position comes from its :class:`PendingHeap`: the largest
  id such that every id it reserved at or below it has completed.
* ``begin_fetch()`` must be called before asking the database for ids and
  ``end_fetch(handle, ids)`` once they arrive: while a fetch is in flight the
  local position stays at or below the largest id known when it started (the
  id on its way is larger than that, but may be smaller than ids registered
  or positions reached meanwhile), and the writer does not count as idle.
* An idle local writer (nothing pending, nothing being fetched) takes the
  largest position known for any writer: its next id will come from the
  shared sequence, so it will be larger than all of them.
* ``current_token()`` (linear) is the minimum over the configured writers,
  ``max_token()`` the maximum; ``persisted_upto()`` may pass the minimum when
  positions reported by writers form an unbroken run above it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._checks import text
from ._heap import PendingHeap
from .errors import IdGeneratorError

__all__ = ["PositionTracker", "Listener"]

logger = logging.getLogger(__name__)

#: ``cb(stream_name, instance_name, old, new)``
Listener = Callable[[str, str, int, int], Any]


def check_names(stream_name: object, instance_name: object, writers: object) -> tuple[str, ...]:
    """Check a stream's identity; returns the writers without duplicates, in order.

    Why strict: a str of writers would be split into one writer per letter,
    and a None or non-str name would be written to the tables as such.
    """
    stream = text("stream_name", stream_name)
    text("instance_name", instance_name)
    if isinstance(writers, (str, bytes)) or not isinstance(writers, Iterable):
        raise TypeError(
            f"stream {stream!r}: writers must be a sequence of instance names such as ('master',) or "
            f"['w1', 'w2'], got {type(writers).__name__} {writers!r}"
        )
    names = tuple(dict.fromkeys(writers))
    for name in names:
        text(f"stream {stream!r}: each writer", name)
    if not names:
        raise IdGeneratorError(f"stream {stream!r} needs at least one writer; name it in writers=, e.g. ('master',)")
    return names


class PositionTracker:
    """Per-writer and linear positions of one stream in one process."""

    def __init__(
        self,
        stream_name: str,
        instance_name: str,
        writers: Sequence[str],
        positions: Mapping[str, int],
        *,
        heap_class: type[PendingHeap] | None = None,
    ) -> None:
        self.writers: tuple[str, ...] = check_names(stream_name, instance_name, writers)
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.is_writer = instance_name in self.writers
        start = min(positions.values(), default=1)
        self._positions: dict[str, int] = {w: int(positions.get(w, start)) for w in self.writers}
        for name, pos in positions.items():
            self._positions.setdefault(name, int(pos))
        cls = heap_class or PendingHeap
        self._heap = cls(self._positions[instance_name]) if self.is_writer else None
        self._max_own_id = self._positions[instance_name] if self.is_writer else 0
        self._listeners: list[Listener] = []
        #: called for every position change of any writer: (instance, old, new)
        self.on_change: Callable[[str, int, int], None] | None = None
        self._known: list[int] = []
        self._persisted_upto = self.current_token()
        self._bump_if_idle()

    # -- reading

    def current_token(self) -> int:
        """Linear position: every fact of every writer at or below it has completed."""
        return min(self._positions[w] for w in self.writers)

    def max_token(self) -> int:
        """The largest position of any writer (readers may peek this far per writer)."""
        return max(self._positions.values())

    def current_token_for_writer(self, name: str) -> int:
        """The position of writer ``name`` (the linear position for an unknown name)."""
        return self._positions.get(name, self.current_token())

    def positions(self) -> dict[str, int]:
        """Every known writer's position (a copy)."""
        return dict(self._positions)

    def persisted_upto(self) -> int:
        """Largest position known to have every fact at or below it completed."""
        return self._persisted_upto

    @property
    def pending(self) -> int:
        """How many local ids are reserved and not completed."""
        return self._heap.pending if self._heap is not None else 0

    def lowest_pending(self) -> int | None:
        """The lowest local id still in flight, or None."""
        return self._heap.lowest_pending() if self._heap is not None else None

    # -- listeners

    def add_listener(self, cb: Listener) -> None:
        """Call ``cb(stream_name, instance_name, old, new)`` when the local position advances."""
        if not callable(cb):
            raise TypeError(f"a listener must be callable as cb(stream_name, instance_name, old, new), got {cb!r}")
        self._listeners.append(cb)

    def remove_listener(self, cb: Listener) -> None:
        """Stop calling ``cb``; ValueError if it is not a listener (never added, or already removed)."""
        try:
            self._listeners.remove(cb)
        except ValueError:
            raise ValueError(
                f"stream {self.stream_name}: {cb!r} is not a listener (never added with add_listener, or already "
                "removed)"
            ) from None

    # -- writing (local writer)

    def _local_heap(self) -> PendingHeap:
        if self._heap is None:
            raise IdGeneratorError(
                f"instance {self.instance_name!r} is not a writer of stream {self.stream_name!r} "
                f"(writers: {', '.join(self.writers)}); only writers reserve ids"
            )
        return self._heap

    def begin_fetch(self) -> int:
        """Mark that an id request to the database is in flight; returns a handle for ``end_fetch``.

        The id that comes back is larger than every id allocated when the
        request was sent, so larger than the largest id known here now (the
        handle). Until ``end_fetch`` the local position stays at or below it.
        """
        heap = self._local_heap()
        bound = max(self._max_own_id, self.max_token())
        heap.hold(bound)
        return bound

    def end_fetch(self, handle: int, ids: Iterable[int] | None) -> None:
        """The fetch ``handle`` finished: register ``ids`` as reserved (None or empty: it failed)."""
        heap = self._local_heap()
        try:
            if ids:
                ids = list(ids)
                heap.reserve_many(ids)
                self._max_own_id = max(self._max_own_id, max(ids))
        finally:
            try:
                heap.release(handle)
            except ValueError:
                raise IdGeneratorError("end_fetch() without a matching begin_fetch()") from None
        self._refresh_local()
        self._bump_if_idle()

    @property
    def fetching(self) -> int:
        """How many id fetches are in flight."""
        return self._heap.holds if self._heap is not None else 0

    def reserve(self, ids: Iterable[int]) -> None:
        """Register ids obtained without a fetch window (an in-process counter)."""
        ids = list(ids)
        self._local_heap().reserve_many(ids)
        if ids:
            self._max_own_id = max(self._max_own_id, max(ids))

    def complete(self, ids: Iterable[int]) -> int | None:
        """Mark local ids finished (committed or failed); the new local position or None."""
        heap = self._local_heap()
        old = self._positions[self.instance_name]
        heap.complete_many(ids)
        self._refresh_local()
        self._bump_if_idle()
        new = self._positions[self.instance_name]
        return new if new != old else None

    def _refresh_local(self) -> None:
        heap = self._heap
        assert heap is not None
        pos = heap.position
        old = self._positions[self.instance_name]
        if pos > old:
            self._set_local(old, pos)

    # -- learning (any writer)

    def advance(self, instance_name: str, new_position: int) -> bool:
        """Record that ``instance_name`` reached ``new_position``; True if anything moved.

        Positions of the local writer are its own business and are ignored here
        (e.g. our own POSITION echoed back by Redis). Unknown writers are
        tracked but do not hold the linear position back.
        """
        new_position = int(new_position)
        if self.is_writer and instance_name == self.instance_name:
            return False
        old = self._positions.get(instance_name)
        if old is not None and new_position <= old:
            return False
        self._positions[instance_name] = new_position
        heapq.heappush(self._known, new_position)
        self._changed(instance_name, self.current_token() if old is None else old, new_position)
        self._bump_if_idle()
        self._update_persisted()
        return True

    # -- internals

    def _bump_if_idle(self) -> None:
        heap = self._heap
        if heap is None or not heap.is_idle():
            return
        target = max(self._positions.values())
        old = self._positions[self.instance_name]
        if heap.advance(target) is not None and target > old:
            self._set_local(old, target)

    def _set_local(self, old: int, new: int) -> None:
        self._positions[self.instance_name] = new
        heapq.heappush(self._known, new)
        self._update_persisted()
        self._changed(self.instance_name, old, new)
        for cb in list(self._listeners):
            try:
                cb(self.stream_name, self.instance_name, old, new)
            except Exception:  # noqa: BLE001 - one bad listener must not stop the writer
                logger.exception("stream %s: position listener %r failed", self.stream_name, cb)

    def _changed(self, instance_name: str, old: int, new: int) -> None:
        if self.on_change is not None:
            self.on_change(instance_name, old, new)

    def _update_persisted(self) -> None:
        upto = max(self._persisted_upto, self.current_token())
        known = self._known
        while known and known[0] <= upto + 1:
            upto = max(upto, heapq.heappop(known))
        self._persisted_upto = upto
