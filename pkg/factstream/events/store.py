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
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import FactstreamError
from ..ids import StreamChangeCache, create_id_generator
from ..store.migrations import migrate
from . import schema
from .event_json import EventFields, parse_event, prune_event_json
from .resolver import DepthResolver, StateKey, StateMap, StateResolver, conflicted_events
from .state_groups import StateGroupStore
from .tokens import RoomsToken, TopologicalToken
from .visibility import HISTORY_VISIBILITY, MEMBER, effective_visibility, membership_at, normalise_visibility

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

logger = logging.getLogger(__name__)

OPEN_HI = schema.OPEN_HI
OPEN_LO = schema.OPEN_LO
_HV_KEY: StateKey = (HISTORY_VISIBILITY, "")


class EventNotFound(FactstreamError, LookupError):
    """No event with that id is stored (persist it first, or check the id)."""


class StateUnknown(FactstreamError, LookupError):
    """The event is an outlier: its state is not known to this server."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to persist: the exact received bytes and how it arrived."""

    raw: bytes
    backfilled: bool = False
    outlier: bool = False
    rejected: bool = False
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class PersistedEvent:
    """Where a persisted event landed."""

    event_id: str
    room_id: str
    stream_ordering: int
    depth: int
    state_group_before: int | None
    state_group: int | None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReturnedEvent:
    """An event as returned to a client: its JSON (pruned if redacted) and orderings."""

    event_id: str
    stream_ordering: int
    depth: int
    json: bytes
    redacted: bool

    @property
    def token(self) -> TopologicalToken:
        return TopologicalToken(self.depth, self.stream_ordering)


@dataclass(slots=True)
class RoomEvents:
    """Events of one room for a user, oldest first; ``limited`` when more were left out."""

    events: list[ReturnedEvent]
    limited: bool
    prev_batch: TopologicalToken | None = None

    @property
    def event_ids(self) -> list[str]:
        return [e.event_id for e in self.events]


@dataclass(slots=True)
class _Prev:
    event_id: str
    depth: int
    state_group: int | None
    outlier: bool
    rejected: bool


@dataclass(slots=True)
class _TxnEffects:
    """What to tell the change caches once the transaction commits."""

    rooms: dict[str, int] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)
    state_changed: dict[str, set[str]] = field(default_factory=dict)

    def room(self, room_id: str, pos: int) -> None:
        self.rooms[room_id] = max(pos, self.rooms.get(room_id, pos))

    def user(self, user_id: str, pos: int) -> None:
        self.users[user_id] = max(pos, self.users.get(user_id, pos))


_MISSING = object()


@dataclass(slots=True)
class _Batch:
    """Rows of one persist batch, buffered so each table is written once per batch."""

    known: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    memberships: dict[str, str | None] = field(default_factory=dict)
    event_rows: list[list[Any]] = field(default_factory=list)
    row_index: dict[str, int] = field(default_factory=dict)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    redactions: list[tuple[str, str, str]] = field(default_factory=list)
    redaction_targets: set[tuple[str, str]] = field(default_factory=set)
    redact_updates: list[tuple[str, str]] = field(default_factory=list)
    extremities: dict[str, set[str]] = field(default_factory=dict)
    ext_orig: dict[str, set[str]] = field(default_factory=dict)
    cursors: dict[tuple[str, str], Any] = field(default_factory=dict)
    cursors_dirty: set[tuple[str, str]] = field(default_factory=set)


def _make_change_cache(name: str, pos: int, size: int) -> Any:
    return StreamChangeCache(name, pos, max_size=size)


_EVENT_COLS = "event_id, stream_ordering, topological_ordering, redacted, json"
_VISIBLE = (
    "((e.type = 'm.room.member' AND e.state_key = ?)"
    " OR (e.outlier = 0 AND (e.history_visibility = 'world_readable' OR s.membership = 'join'"
    " OR (s.membership = 'invite' AND e.history_visibility = 'invited')"
    " OR (e.history_visibility = 'shared' AND ? = 1))))"
)
_SPAN_JOIN = (
    "LEFT JOIN membership_spans s ON s.room_id = e.room_id AND s.user_id = ?"
    " AND s.lo <= e.stream_ordering AND s.hi >= e.stream_ordering"
)


class EventStore:
    """Persists room events and answers the read paths (see module doc)."""

    def __init__(
        self,
        db: Any,
        *,
        instance_name: str = "master",
        writer: bool = True,
        resolver: StateResolver | None = None,
        stream_id_gen: Any = None,
        backfill_id_gen: Any = None,
        change_cache_size: int = 100_000,
    ) -> None:
        self.db = db
        self.instance_name = instance_name
        self.writer = writer
        self.resolver: StateResolver = resolver or DepthResolver()
        self.stream_id_gen = stream_id_gen
        self.backfill_id_gen = backfill_id_gen
        self.groups = StateGroupStore()
        self._room_locks: dict[str, asyncio.Lock] = {}
        self._membership_cache: dict[str, str | None] = {}
        self._change_cache_size = change_cache_size
        self.room_changes: Any = None
        self.membership_changes: Any = None
        self._reader_positions: dict[str, int] = {}
        self._rooms_for_user: dict[str, tuple[int, dict[str, tuple[str | None, int]]]] = {}
        self._listeners: list[Callable[[list[PersistedEvent]], Any]] = []
        self._own_gens: list[Any] = []
        # Writer-owned rooms: committed extremities and visibility cursors, so a
        # persist need not read them back (dropped wholesale on any rollback).
        self._ext_cache: dict[str, frozenset[str]] = {}
        self._cursor_cache: dict[tuple[str, str], Any] = {}
        #: Writer: a ``CacheInvalidator`` told about current-state changes (``cs_cache_fake``).
        self.cache_invalidator: Any = None
        #: Reader: returns the events stream position this process has been told about.
        self.position_fn: Callable[[], int | None] | None = None

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
        """Close the id generators this store created (the database stays open)."""
        for gen in self._own_gens:
            close = getattr(gen, "close", None)
            if close is not None:
                res = close()
                if asyncio.iscoroutine(res):
                    await res
        self._own_gens = []

    def current_token(self) -> int:
        """Stream position up to which this process answers (writer: all completed)."""
        if self.writer:
            gen = self.stream_id_gen
            tok = gen.current_token() if hasattr(gen, "current_token") else gen.get_current_token()
            return int(tok)
        if self.position_fn is not None:
            pos = self.position_fn()
            if pos is not None:
                return pos
        return min(self._reader_positions.values()) if self._reader_positions else 0

    def add_persist_listener(self, fn: Callable[[list[PersistedEvent]], Any]) -> None:
        """Call ``fn(persisted)`` after each committed persist batch (in the writer)."""
        self._listeners.append(fn)

    # ------------------------------------------------------------ persisting

    async def persist_event(
        self,
        raw: bytes,
        *,
        backfilled: bool = False,
        outlier: bool = False,
        rejected: bool = False,
        event_id: str | None = None,
    ) -> PersistedEvent:
        """Persist one event (idempotent: a known event_id returns its existing place)."""
        return (await self.persist_events([NewEvent(raw, backfilled, outlier, rejected, event_id)]))[0]

    async def persist_events(self, events: Sequence[NewEvent | bytes]) -> list[PersistedEvent]:
        """Persist a batch in one transaction; prev_events must come before their children."""
        if not self.writer:
            raise FactstreamError("this EventStore is a reader (writer=False); persist on the writer")
        items = [e if isinstance(e, NewEvent) else NewEvent(e) for e in events]
        if not items:
            return []
        parsed = [parse_event(e.raw, e.event_id) for e in items]
        rooms = sorted({f.room_id for f in parsed})
        locks = [self._room_locks.setdefault(r, asyncio.Lock()) for r in rooms]
        for lock in locks:
            await lock.acquire()
        try:
            n_fwd = sum(1 for e in items if not e.backfilled)
            n_back = len(items) - n_fwd
            async with _reserve(self.stream_id_gen, n_fwd) as fwd_ids, \
                    _reserve(self.backfill_id_gen, n_back) as back_ids:
                fwd = iter(fwd_ids)
                back = iter(back_ids)
                effects = _TxnEffects()
                results: list[PersistedEvent] = []
                async with self.db.transaction() as txn:
                    txn.call_after_rollback(self._forget_uncommitted)
                    batch = await self._prefetch(txn, parsed)
                    for item, f in zip(items, parsed):
                        sid = next(back) if item.backfilled else next(fwd)
                        results.append(await self._persist_one(txn, batch, item, f, sid, effects))
                    await self._flush(txn, batch)
                    txn.call_after_commit(self._remember_batch, batch)
                    txn.call_after_commit(self._apply_effects, effects)
                # Unused reservations (duplicates) complete empty, like a rolled-back fact.
        finally:
            for lock in locks:
                lock.release()
        for fn in self._listeners:
            res = fn(results)
            if asyncio.iscoroutine(res):
                await res
        return results

    def _forget_uncommitted(self) -> None:
        self.groups.forget()
        self._ext_cache.clear()
        self._cursor_cache.clear()

    def _remember_batch(self, batch: _Batch) -> None:
        if len(self._ext_cache) > 100_000:
            self._ext_cache.clear()
            self._cursor_cache.clear()
        for room, ext in batch.extremities.items():
            self._ext_cache[room] = frozenset(ext)
        for key in batch.cursors_dirty:
            self._cursor_cache[key] = batch.cursors[key]

    def _apply_effects(self, effects: _TxnEffects) -> Any:
        if self.cache_invalidator is not None and effects.state_changed:
            # Synapse's cs_cache_fake: [room_id, *members whose membership changed]
            res = self.cache_invalidator.invalidate_many(
                [("cs_cache_fake", [room, *sorted(members)]) for room, members in sorted(effects.state_changed.items())]
            )
        else:
            res = None
        for room, pos in effects.rooms.items():
            self.room_changes.entity_has_changed(room, pos)
        for user, pos in effects.users.items():
            self.membership_changes.entity_has_changed(user, pos)
            self._rooms_for_user.pop(user, None)
        return res

    async def _prefetch(self, txn: Any, parsed: Sequence[EventFields]) -> _Batch:
        batch = _Batch()
        wanted = sorted({f.event_id for f in parsed} | {p for f in parsed for p in f.prev_events})
        own = {f.event_id for f in parsed}
        for i in range(0, len(wanted), 400):
            chunk = wanted[i : i + 400]
            mine = [e for e in chunk if e in own] or [""]
            # One round trip: the rows of known events and redactions aimed at this batch.
            rows = await txn.fetchall(
                "SELECT 'e', event_id, topological_ordering, state_group, outlier, rejected, stream_ordering,"
                f" state_group_before, room_id FROM events WHERE event_id IN ({','.join('?' * len(chunk))})"
                " UNION ALL SELECT 'r', redacts, NULL, NULL, NULL, NULL, NULL, NULL, room_id FROM redactions"
                f" WHERE redacts IN ({','.join('?' * len(mine))})",
                (*chunk, *mine),
            )
            for r in rows:
                if r[0] == "e":
                    batch.known[r[1]] = tuple(r[1:])
                else:
                    batch.redaction_targets.add((r[1], r[8]))
        return batch

    async def _flush(self, txn: Any, batch: _Batch) -> None:
        if batch.event_rows:
            await txn.executemany(
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type, state_key,"
                " sender, membership, redacts, relates_to, instance_name, outlier, rejected, redacted,"
                " history_visibility, state_group_before, state_group, json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                batch.event_rows,
            )
        if batch.edges:
            await txn.executemany(
                "INSERT INTO event_edges (event_id, prev_event_id, room_id) VALUES (?, ?, ?)", batch.edges
            )
        if batch.redactions:
            await txn.executemany(
                "INSERT INTO redactions (event_id, redacts, room_id) VALUES (?, ?, ?)", batch.redactions
            )
        if batch.redact_updates:
            await txn.executemany(
                "UPDATE events SET redacted = 1 WHERE event_id = ? AND room_id = ?", batch.redact_updates
            )
        for room, now in batch.extremities.items():
            orig = batch.ext_orig[room]
            gone, new = orig - now, now - orig
            if gone:
                await txn.executemany(
                    "DELETE FROM forward_extremities WHERE room_id = ? AND event_id = ?",
                    [(room, e) for e in sorted(gone)],
                )
            if new:
                await txn.executemany(
                    "INSERT INTO forward_extremities (room_id, event_id) VALUES (?, ?)",
                    [(room, e) for e in sorted(new)],
                )
        if batch.cursors_dirty:
            await txn.executemany(
                "INSERT INTO room_cursors (room_id, direction, event_id, group_before, group_after, target)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (room_id, direction) DO UPDATE SET"
                " event_id = excluded.event_id, group_before = excluded.group_before,"
                " group_after = excluded.group_after, target = excluded.target",
                [(room, d, *batch.cursors[(room, d)]) for room, d in sorted(batch.cursors_dirty)],
            )

    async def _persist_one(
        self, txn: Any, batch: _Batch, item: NewEvent, f: EventFields, sid: int, effects: _TxnEffects
    ) -> PersistedEvent:
        known = batch.known
        r: tuple[Any, ...] | None
        if f.event_id in known:
            r = known[f.event_id]
            return PersistedEvent(f.event_id, r[7], int(r[5]), int(r[1]), r[6], r[2], duplicate=True)
        prevs = [
            _Prev(r[0], int(r[1]), r[2], bool(r[3]), bool(r[4]))
            for eid in dict.fromkeys(f.prev_events)
            if (r := known.get(eid)) is not None and r[7] == f.room_id
        ]
        outlier, rejected, forward = item.outlier, item.rejected, sid > 0
        room = f.room_id

        # --- state before / after
        before: int | None = None
        after: int | None = None
        vis_before = vis_after = "shared"
        if not outlier:
            before = await self._state_before(txn, batch, room, [p.state_group for p in prevs if not p.outlier])
            if before is not None:
                vis_before = (await self.groups.meta(txn, before))[1]
            vis_after = vis_before
            if f.is_state and not rejected:
                if f.type == HISTORY_VISIBILITY and f.state_key == "":
                    vis_after = normalise_visibility(f.history_visibility)
                after = await self.groups.create(txn, room, before, {f.state_key_pair: f.event_id}, vis_after)
            else:
                after = before
        visibility = None if outlier else effective_visibility(vis_before, vis_after)

        # --- redactions (either order of arrival)
        redacted = 1 if (f.event_id, room) in batch.redaction_targets else 0
        batch.row_index[f.event_id] = len(batch.event_rows)
        batch.event_rows.append([
            sid, f.depth, f.event_id, room, f.type, f.state_key, f.sender, f.membership, f.redacts,
            f.relates_to, self.instance_name, int(outlier), int(rejected), redacted, visibility,
            before, after, item.raw,
        ])
        known[f.event_id] = (f.event_id, f.depth, after, int(outlier), int(rejected), sid, before, room)
        batch.raw[f.event_id] = item.raw
        if f.membership is not None:
            batch.memberships[f.event_id] = f.membership
        batch.edges.extend((f.event_id, p, room) for p in dict.fromkeys(f.prev_events))
        if f.redacts is not None and not rejected:
            batch.redactions.append((f.event_id, f.redacts, room))
            batch.redaction_targets.add((f.redacts, room))
            idx = batch.row_index.get(f.redacts)
            if idx is not None and batch.event_rows[idx][3] == room:
                batch.event_rows[idx][13] = 1
            else:
                batch.redact_updates.append((f.redacts, room))

        if forward:
            effects.room(room, sid)
            if f.type == MEMBER and f.state_key is not None and not rejected:
                effects.user(f.state_key, sid)
        if not outlier and not rejected:
            if forward:
                await self._update_current_state(txn, batch, room, f, prevs, after, sid, effects)
            await self._update_visibility(txn, batch, room, f, before, after, sid)
        return PersistedEvent(f.event_id, room, sid, f.depth, before, after)

    async def _state_before(self, txn: Any, batch: _Batch, room: str, prev_groups: list[int | None]) -> int | None:
        distinct = list(dict.fromkeys(prev_groups))
        if not distinct:
            return None
        if len(distinct) == 1:
            return distinct[0]
        states = [await self.groups.full_state(txn, g) for g in distinct]
        resolved = await self._resolve(txn, batch, room, states)
        for g, s in zip(distinct, states):
            if s == resolved:
                return g
        return await self._group_for_state(txn, batch, room, distinct, resolved)

    async def _resolve(self, txn: Any, batch: _Batch, room: str, states: Sequence[Mapping[StateKey, str]]) -> StateMap:
        depths: dict[str, int] = {}
        ids = []
        for e in sorted(conflicted_events(states)):
            r = batch.known.get(e)
            if r is not None:
                depths[e] = int(r[1])
            else:
                ids.append(e)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = await txn.fetchall(
                "SELECT event_id, topological_ordering FROM events WHERE event_id IN"
                f" ({','.join('?' * len(chunk))})",
                chunk,
            )
            depths.update((r[0], int(r[1])) for r in rows)
        return self.resolver(room, states, depths)

    async def _group_for_state(
        self, txn: Any, batch: _Batch, room: str, candidates: list[int | None], state: StateMap
    ) -> int:
        parents = [g for g in candidates if g is not None]
        heights = [(await self.groups.meta(txn, g))[0] for g in parents]
        parent = parents[max(range(len(parents)), key=heights.__getitem__)] if parents else None
        pstate = await self.groups.full_state(txn, parent)
        missing = [k for k in pstate if k not in state]
        if missing:
            raise FactstreamError(
                f"state resolver dropped state keys {missing[:3]}...; resolvers must keep every key"
            )
        changes = {k: v for k, v in state.items() if pstate.get(k) != v}
        vis = "shared"
        hv = state.get(_HV_KEY)
        if hv is not None:
            raw = batch.raw.get(hv)
            if raw is None:
                row = await txn.fetchone("SELECT json FROM events WHERE event_id = ?", (hv,))
                raw = bytes(row[0]) if row is not None else None
            if raw is not None:
                content = json.loads(raw).get("content") or {}
                vis = normalise_visibility(content.get("history_visibility"))
        return await self.groups.create(txn, room, parent, changes, vis)

    async def _update_current_state(
        self,
        txn: Any,
        batch: _Batch,
        room: str,
        f: EventFields,
        prevs: list[_Prev],
        after: int | None,
        sid: int,
        effects: _TxnEffects,
    ) -> None:
        old_x = batch.extremities.get(room)
        if old_x is None:
            cached = self._ext_cache.get(room)
            if cached is not None:
                old_x = set(cached)
            else:
                rows = await txn.fetchall("SELECT event_id FROM forward_extremities WHERE room_id = ?", (room,))
                old_x = {r[0] for r in rows}
            batch.ext_orig[room] = set(old_x)
        new_x = (old_x - set(f.prev_events)) | {f.event_id}
        batch.extremities[room] = new_x
        state_inputs = {p.event_id for p in prevs if not p.outlier}
        changes: dict[StateKey, str] = {}
        if old_x == state_inputs:
            # Linear case: current state was exactly the state before this event.
            if f.is_state:
                changes[f.state_key_pair] = f.event_id
            old_rows = await txn.fetchall(
                "SELECT type, state_key, event_id FROM current_state_events"
                " WHERE room_id = ? AND type = ? AND state_key = ?",
                (room, f.type, f.state_key or ""),
            ) if f.is_state else []
            old = {(r[0], r[1]): r[2] for r in old_rows}
        else:
            groups: dict[str, Any] = {}
            missing = []
            for x in new_x:
                r = batch.known.get(x)
                if r is not None:
                    groups[x] = r[2]
                else:
                    missing.append(x)
            if missing:
                xr = await txn.fetchall(
                    f"SELECT event_id, state_group FROM events WHERE event_id IN ({','.join('?' * len(missing))})",
                    missing,
                )
                groups.update((r[0], r[1]) for r in xr)
            groups[f.event_id] = after
            distinct = list(dict.fromkeys(groups[x] for x in sorted(new_x)))
            states = [await self.groups.full_state(txn, g) for g in distinct]
            new_state = states[0] if len(states) == 1 else await self._resolve(txn, batch, room, states)
            old_rows = await txn.fetchall(
                "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?", (room,)
            )
            old = {(r[0], r[1]): r[2] for r in old_rows}
            changes = {k: v for k, v in new_state.items() if old.get(k) != v}
        changes = {k: v for k, v in changes.items() if old.get(k) != v}
        if not changes:
            return
        members = await self._memberships(txn, batch, [v for k, v in changes.items() if k[0] == MEMBER])
        await txn.executemany(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key)"
            " DO UPDATE SET event_id = excluded.event_id, membership = excluded.membership",
            [(room, t, sk, ev, members.get(ev)) for (t, sk), ev in changes.items()],
        )
        await txn.executemany(
            "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type, state_key,"
            " event_id, prev_event_id, membership) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (sid, self.instance_name, room, t, sk, ev, old.get((t, sk)), members.get(ev))
                for (t, sk), ev in sorted(changes.items())
            ],
        )
        changed_members = effects.state_changed.setdefault(room, set())
        for (t, sk) in changes:
            if t == MEMBER:
                effects.user(sk, sid)
                changed_members.add(sk)

    async def _memberships(self, txn: Any, batch: _Batch, event_ids: Iterable[str]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        missing = []
        for e in event_ids:
            if e in batch.memberships:
                out[e] = batch.memberships[e]
            elif e in self._membership_cache:
                out[e] = self._membership_cache[e]
            else:
                missing.append(e)
        for i in range(0, len(missing), 500):
            chunk = missing[i : i + 500]
            rows = await txn.fetchall(
                f"SELECT event_id, membership FROM events WHERE event_id IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            for eid, m in rows:
                out[eid] = m
                self._membership_cache[eid] = m
        if len(self._membership_cache) > 200_000:
            self._membership_cache.clear()
        return out

    async def _update_visibility(
        self, txn: Any, batch: _Batch, room: str, f: EventFields, before: int | None, after: int | None, sid: int
    ) -> None:
        """Keep ``membership_spans`` equal to each user's membership at each event."""
        direction = "f" if sid > 0 else "b"
        ckey = (room, direction)
        cur = batch.cursors.get(ckey, _MISSING)
        if cur is _MISSING:
            cur = self._cursor_cache.get(ckey, _MISSING)
        if cur is _MISSING:
            row = await txn.fetchone(
                "SELECT event_id, group_before, group_after, target FROM room_cursors"
                " WHERE room_id = ? AND direction = ?",
                ckey,
            )
            cur = None if row is None else tuple(row)
            batch.cursors[ckey] = cur
        target = f.state_key if f.type == MEMBER else None
        candidates: set[str] = set()
        if cur is None:
            state = await self.groups.full_state(txn, before)
            candidates = {sk for (t, sk) in state if t == MEMBER}
        else:
            _, p_before, p_after, p_target = cur
            if p_target is not None:
                candidates.add(p_target)
            if before == p_after:
                pass  # only the previous event's own key changed (covered by p_target)
            elif before != p_before:
                a = await self.groups.full_state(txn, before)
                b = await self.groups.full_state(txn, p_before)
                for key in set(a) | set(b):
                    if key[0] == MEMBER and a.get(key) != b.get(key):
                        candidates.add(key[1])
        if target is not None:
            candidates.add(target)
        if candidates:
            keys = [(MEMBER, u) for u in sorted(candidates)]
            found = await self.groups.lookup(txn, before, keys)
            mships = await self._memberships(txn, batch, found.values())
            desired: dict[str, str | None] = {}
            for u in candidates:
                ev = found.get((MEMBER, u))
                m_before = mships.get(ev) if ev is not None else None
                m_after = f.membership if u == target else m_before
                desired[u] = membership_at(m_before, m_after)
            open_col = "hi" if direction == "f" else "lo"
            open_val = OPEN_HI if direction == "f" else OPEN_LO
            users = sorted(candidates)
            open_rows: list[Any] = []
            for i in range(0, len(users), 500):
                chunk = users[i : i + 500]
                open_rows += await txn.fetchall(
                    f"SELECT user_id, membership FROM membership_spans WHERE room_id = ? AND {open_col} = ?"
                    f" AND user_id IN ({','.join('?' * len(chunk))})",
                    (room, open_val, *chunk),
                )
            current = {r[0]: r[1] for r in open_rows}
            close, new = [], []
            for u in users:
                if current.get(u) != desired[u]:
                    if u in current:
                        close.append(u)
                    if desired[u] is not None:
                        new.append(u)
            if close:
                edge = sid - 1 if direction == "f" else sid + 1
                await txn.executemany(
                    f"UPDATE membership_spans SET {open_col} = ? WHERE room_id = ? AND user_id = ? AND {open_col} = ?",
                    [(edge, room, u, open_val) for u in close],
                )
            if new:
                lo, hi = (sid, OPEN_HI) if direction == "f" else (OPEN_LO, sid)
                await txn.executemany(
                    "INSERT INTO membership_spans (room_id, user_id, membership, lo, hi) VALUES (?, ?, ?, ?, ?)",
                    [(room, u, desired[u], lo, hi) for u in new],
                )
        batch.cursors[ckey] = (f.event_id, before, after, target)
        batch.cursors_dirty.add(ckey)

    # ------------------------------------------------------------ reading: single events and state

    async def get_event_json(self, event_id: str, *, prune_redacted: bool = True) -> bytes:
        """The stored bytes of ``event_id`` (its pruned form if redacted, unless told not to)."""
        row = await self.db.fetchone("SELECT json, redacted FROM events WHERE event_id = ?", (event_id,))
        if row is None:
            raise EventNotFound(f"event {event_id} is not stored")
        raw = bytes(row[0])
        return prune_event_json(raw) if prune_redacted and row[1] else raw

    async def _event_groups(self, event_id: str) -> tuple[int | None, int | None]:
        row = await self.db.fetchone(
            "SELECT state_group_before, state_group, outlier FROM events WHERE event_id = ?", (event_id,)
        )
        if row is None:
            raise EventNotFound(f"event {event_id} is not stored")
        if row[2]:
            raise StateUnknown(f"event {event_id} is an outlier; its room state is not known")
        return row[0], row[1]

    async def get_state_at(self, event_id: str, *, after: bool = True) -> StateMap:
        """Full state after (or before) ``event_id``: {(type, state_key): event_id}."""
        before_g, after_g = await self._event_groups(event_id)
        g = after_g if after else before_g
        # Committed groups never change: a plain read (no write lock on SQLite) is enough.
        return dict(await self.groups.full_state(self.db, g))

    async def get_state_group(self, event_id: str, *, after: bool = True) -> int | None:
        """The state group after (or before) ``event_id`` (None: empty state)."""
        before_g, after_g = await self._event_groups(event_id)
        return after_g if after else before_g

    async def get_current_state(self, room_id: str) -> StateMap:
        """The room's current state (resolved over its forward extremities)."""
        rows = await self.db.fetchall(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?", (room_id,)
        )
        return {(r[0], r[1]): r[2] for r in rows}

    async def get_forward_extremities(self, room_id: str) -> set[str]:
        """The room's forward extremities."""
        rows = await self.db.fetchall("SELECT event_id FROM forward_extremities WHERE room_id = ?", (room_id,))
        return {r[0] for r in rows}

    # ------------------------------------------------------------ reading: topological order

    async def get_events_topological(
        self,
        room_id: str,
        from_token: TopologicalToken | None = None,
        direction: str = "f",
        limit: int = 100,
    ) -> tuple[list[str], TopologicalToken | None]:
        """Room events (non-outlier, non-rejected) in topological order, strictly after
        (``"f"``) or before (``"b"``) ``from_token``; returns ids and the token to continue."""
        params: list[Any] = [room_id]
        cond = ""
        if from_token is not None:
            op = ">" if direction == "f" else "<"
            cond = (
                f" AND (topological_ordering {op} ? OR (topological_ordering = ? AND stream_ordering {op} ?))"
            )
            params += [from_token.depth, from_token.depth, from_token.stream]
        order = "ASC" if direction == "f" else "DESC"
        rows = await self.db.fetchall(
            "SELECT event_id, topological_ordering, stream_ordering FROM events"
            f" WHERE room_id = ? AND outlier = 0 AND rejected = 0{cond}"
            f" ORDER BY topological_ordering {order}, stream_ordering {order} LIMIT ?",
            (*params, limit),
        )
        token = TopologicalToken(int(rows[-1][1]), int(rows[-1][2])) if rows else from_token
        return [r[0] for r in rows], token

    # ------------------------------------------------------------ reading: per-user paths

    def _upto(self, to_token: int | None) -> int:
        cur = self.current_token()
        if to_token is None:
            return cur
        if to_token > cur:
            raise FactstreamError(
                f"token {to_token} is beyond this process's known position {cur}; wait for replication"
            )
        return to_token

    async def user_memberships(self, user_id: str, upto: int) -> dict[str, tuple[str | None, int]]:
        """``room -> (membership, stream of that change)`` for ``user_id`` in current state as of ``upto``."""
        cached = self._rooms_for_user.get(user_id)
        if (
            cached is not None
            and cached[0] == upto
        ):
            return cached[1]
        rows = await self.db.fetchall(
            "SELECT room_id, membership, stream_id FROM current_state_delta_stream"
            " WHERE type = 'm.room.member' AND state_key = ? AND stream_id <= ? ORDER BY stream_id",
            (user_id, upto),
        )
        out = {r[0]: (r[1], int(r[2])) for r in rows}
        self._rooms_for_user[user_id] = (upto, out)
        if len(self._rooms_for_user) > 100_000:
            self._rooms_for_user.clear()
        return out

    async def _room_events_for_user(
        self, room_id: str, user_id: str, lo: int, hi: int, limit: int, joined_now: bool
    ) -> RoomEvents:
        rows = await self.db.fetchall(
            "SELECT e.event_id, e.stream_ordering, e.topological_ordering, e.redacted, e.json FROM events e "
            + _SPAN_JOIN
            + " WHERE e.room_id = ? AND e.stream_ordering > ? AND e.stream_ordering <= ? AND e.rejected = 0 AND "
            + _VISIBLE
            + " ORDER BY e.stream_ordering DESC LIMIT ?",
            (user_id, room_id, lo, hi, user_id, int(joined_now), limit + 1),
        )
        limited = len(rows) > limit
        events = [_returned(r) for r in reversed(rows[:limit])]
        prev = events[0].token if events else None
        return RoomEvents(events, limited, prev)

    async def get_new_events_for_user(
        self,
        user_id: str,
        from_token: int,
        to_token: int | None = None,
        *,
        limit: int = 50,
        use_caches: bool = True,
    ) -> dict[str, RoomEvents]:
        """Events in ``(from_token, to_token]`` for ``user_id``: its rooms' visible events and its
        own membership changes anywhere (invites included), at most ``limit`` per room (newest)."""
        upto = self._upto(to_token)
        if upto <= from_token:
            return {}
        members = await self.user_memberships(user_id, upto)
        joined = {r for r, (m, _) in members.items() if m == "join"}
        rooms = set(joined)
        if not use_caches or self.membership_changes.has_entity_changed(user_id, from_token):
            rooms |= {r for r, (_, pos) in members.items() if pos > from_token}
            own = await self.db.fetchall(
                "SELECT DISTINCT room_id FROM events WHERE state_key = ? AND type = 'm.room.member'"
                " AND stream_ordering > ? AND stream_ordering <= ? AND rejected = 0",
                (user_id, from_token, upto),
            )
            rooms |= {r[0] for r in own}
        if use_caches:
            rooms = set(self.room_changes.get_entities_changed(rooms, from_token))
        out: dict[str, RoomEvents] = {}
        for room in sorted(rooms):
            got = await self._room_events_for_user(room, user_id, from_token, upto, limit, room in joined)
            if got.events:
                out[room] = got
        return out

    async def get_recent_rooms_for_user(
        self,
        user_id: str,
        n_events: int,
        m_rooms: int,
        from_token: RoomsToken | None = None,
        to_token: int | None = None,
    ) -> tuple[dict[str, RoomEvents], RoomsToken | None]:
        """The ``n_events`` most recent visible events in each of the ``m_rooms`` most recently
        active rooms the user is joined to or invited to (as of the token); a token for the next page."""
        upto = from_token.upto if from_token is not None else self._upto(to_token)
        members = await self.user_memberships(user_id, upto)
        rooms = sorted(r for r, (m, _) in members.items() if m in ("join", "invite"))
        activity: dict[str, int] = {r: 0 for r in rooms}
        for i in range(0, len(rooms), 500):
            chunk = rooms[i : i + 500]
            rows = await self.db.fetchall(
                "SELECT room_id, MAX(stream_ordering) FROM events WHERE stream_ordering > 0"
                f" AND stream_ordering <= ? AND outlier = 0 AND rejected = 0 AND room_id IN ({','.join('?' * len(chunk))})"
                " GROUP BY room_id",
                (upto, *chunk),
            )
            activity.update((r[0], int(r[1])) for r in rows)
        order = sorted(rooms, key=lambda r: (-activity[r], r))
        if from_token is not None:
            after = (-from_token.activity, from_token.room_id)
            order = [r for r in order if (-activity[r], r) > after]
        page, rest = order[:m_rooms], order[m_rooms:]
        out: dict[str, RoomEvents] = {}
        for room in page:
            joined_now = members[room][0] == "join"
            out[room] = await self._room_events_for_user(room, user_id, 0, upto, n_events, joined_now)
        token = RoomsToken(upto, activity[page[-1]], page[-1]) if rest and page else None
        return out, token

    async def paginate_backwards(
        self,
        room_id: str,
        user_id: str,
        from_token: TopologicalToken | None,
        limit: int,
        to_token: int | None = None,
    ) -> tuple[list[ReturnedEvent], TopologicalToken | None]:
        """Events visible to ``user_id`` strictly before ``from_token`` (None: the room's end), in
        reverse topological order; returns them (newest first) and the token to continue, or None."""
        upto = self._upto(to_token)
        members = await self.user_memberships(user_id, upto)
        joined_now = members.get(room_id, (None, 0))[0] == "join"
        params: list[Any] = [user_id, room_id, upto]
        cond = ""
        if from_token is not None:
            cond = (
                " AND (e.topological_ordering < ? OR (e.topological_ordering = ? AND e.stream_ordering < ?))"
            )
            params += [from_token.depth, from_token.depth, from_token.stream]
        rows = await self.db.fetchall(
            "SELECT e.event_id, e.stream_ordering, e.topological_ordering, e.redacted, e.json FROM events e "
            + _SPAN_JOIN
            + " WHERE e.room_id = ? AND e.stream_ordering <= ? AND e.outlier = 0 AND e.rejected = 0"
            + cond
            + " AND "
            + _VISIBLE
            + " ORDER BY e.topological_ordering DESC, e.stream_ordering DESC LIMIT ?",
            (*params, user_id, int(joined_now), limit),
        )
        events = [_returned(r) for r in rows]
        token = events[-1].token if len(events) == limit and events else None
        return events, token

    # ------------------------------------------------------------ replication (reader side)

    def on_events_rows(self, instance_name: str, token: int, rows: Iterable[Any]) -> None:
        """Reader: apply events-stream rows (wire lists or typed rows) at ``token`` from ``instance_name``."""
        for row in rows:
            kind, data = _row_parts(row)
            if kind == "ev":
                event_id, room_id, etype, state_key = data[0], data[1], data[2], data[3]
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


@asynccontextmanager
async def _reserve(gen: Any, n: int) -> AsyncIterator[list[int]]:
    if n == 0:
        yield []
        return
    async with gen.get_next_mult(n) as ids:
        yield list(ids)


def _returned(r: Sequence[Any]) -> ReturnedEvent:
    raw = bytes(r[4])
    redacted = bool(r[3])
    return ReturnedEvent(r[0], int(r[1]), int(r[2]), prune_event_json(raw) if redacted else raw, redacted)


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


