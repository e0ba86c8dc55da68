"""The room event store: persisting events and answering the read paths.

One :class:`EventStore` per process. A writer (``writer=True``) persists events
(reserving stream orderings from the events id generator, negative ones from
the backfill generator) and answers every query at its own current token. A
reader shares the database, learns positions and facts from the events stream
(:meth:`EventStore.on_events_rows`) and answers queries only up to the
position it has been told about.

Rules chosen here (the reference model in ``tests/event_model.py`` encodes the
same ones independently):

* state before an event = the resolver applied to the states after its known,
  non-outlier prev_events (unknown prev_events are ignored; none known means
  the empty state); state after = before plus the event itself if it is a
  state event that is not rejected. Rejected events never change state.
* outliers have no state (:class:`StateUnknown`), no place in the DAG
  traversal and are never returned to clients, except a user's own
  (out-of-band) membership events.
* forward extremities: a forward, non-outlier, non-rejected event removes its
  prev_events from the room's extremities and becomes one; current state is
  the resolver applied to the states after the extremities. Backfilled events
  never move extremities or current state.
* a room is written by one writer at a time (events of one room are
  serialised by a per-room lock inside the writer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..ids import create_id_generator
from ..store.migrations import migrate
from . import schema
from .core import _make_change_cache
from .persist import Persisting
from .queries import Queries
from .records import EventNotFound, NewEvent, PersistedEvent, ReturnedEvent, RoomEvents, StateUnknown
from .visibility import MEMBER

if TYPE_CHECKING:
    from ..ids import IdGenerator

__all__ = [
    "EventStore",
    "NewEvent",
    "PersistedEvent",
    "ReturnedEvent",
    "RoomEvents",
    "StateUnknown",
    "EventNotFound",
]



class EventStore(Persisting, Queries):
    """Persists room events and answers the read paths (see module doc).

    Thin by design: the work lives in its parts, one job each: :mod:`.persist`
    (the writer's path), :mod:`.state` (state groups and current state),
    :mod:`.queries` (the read paths); :mod:`.core` holds the state they share.
    """

    # ------------------------------------------------------------------ setup

    @classmethod
    async def open(cls, db: Any, **kwargs: Any) -> EventStore:
        """Migrate the schema, create missing id generators and the change caches."""
        store = cls(db, **kwargs)
        await migrate(db, [schema.COMPONENT])
        if store.writer:
            if store.stream_id_gen is None:
                store.stream_id_gen = await _default_id_gen(db, store.instance_name, backwards=False)
                store._own_gens.append(store.stream_id_gen)
            if store.backfill_id_gen is None:
                store.backfill_id_gen = await _default_id_gen(db, store.instance_name, backwards=True)
                store._own_gens.append(store.backfill_id_gen)
            pos = store.current_token()
        else:
            row = await db.fetchone("SELECT MAX(stream_ordering) FROM events")
            pos = int(row[0]) if row and row[0] is not None else 0
            pos = max(pos, 0)
            store._reader_positions[""] = pos
        store.room_changes = _make_change_cache("room_events", pos, store._change_cache_size)
        store.membership_changes = _make_change_cache("membership", pos, store._change_cache_size)
        return store

    async def close(self) -> None:
        """Close the id generators this store created (the database stays open).

        Persists still running are waited for (each commits or fails on its own);
        later ones are refused. Before, close() returned while they ran, and
        closing the database next cut them off with "lost the connection".
        """
        self._closed = True
        await self._persists_done.wait()
        for gen in self._own_gens:
            close = getattr(gen, "close", None)
            if close is not None:
                res = close()
                if asyncio.iscoroutine(res):
                    await res
        self._own_gens = []

    # ------------------------------------------------------------ replication (reader side)

    def on_events_rows(self, instance_name: str, token: int, rows: Iterable[Any]) -> None:
        """Reader: apply events-stream rows (wire lists or typed rows) at ``token`` from ``instance_name``."""
        for row in rows:
            kind, data = _row_parts(row)
            if kind == "ev":
                room_id, etype, state_key = data[1], data[2], data[3]
                rejected = bool(data[7])
                if token > 0:
                    self.room_changes.entity_has_changed(room_id, token)
                    if etype == MEMBER and state_key is not None and not rejected:
                        self.membership_changes.entity_has_changed(state_key, token)
                        self._rooms_for_user.pop(state_key, None)
            elif kind == "state":
                room_id, etype, state_key = data[0], data[1], data[2]
                if etype == MEMBER:
                    self.membership_changes.entity_has_changed(state_key, token)
                    self._rooms_for_user.pop(state_key, None)
            elif kind == "state-all":
                # Every member may have changed: forget cached memberships.
                self._rooms_for_user.clear()
        self.advance_reader(instance_name, token)

    def invalidate_rooms_for_user(self, key: Any) -> None:
        """Forget cached memberships of a user (``key`` is ``(user_id,)`` or a user id)."""
        user = key[0] if isinstance(key, tuple) else key
        self._rooms_for_user.pop(user, None)

    def advance_reader(self, instance_name: str, token: int) -> None:
        """Reader: the writer ``instance_name`` has completed everything up to ``token``."""
        self._reader_positions.pop("", None)
        old = self._reader_positions.get(instance_name, 0)
        if token > old:
            self._reader_positions[instance_name] = token


def _row_parts(row: Any) -> tuple[str, Sequence[Any]]:
    if hasattr(row, "to_wire"):
        row = row.to_wire()
    kind, data = row
    return kind, data


async def _default_id_gen(db: Any, instance_name: str, *, backwards: bool) -> Any:
    gen: IdGenerator | Coroutine[Any, Any, IdGenerator] = create_id_generator(
        db,
        stream_name="backfill" if backwards else "events",
        instance_name=instance_name,
        writers=(instance_name,),
        tables=(("events", "instance_name", "stream_ordering"),),
        backwards=backwards,
    )
    if asyncio.iscoroutine(gen):
        gen = await gen
    return gen
