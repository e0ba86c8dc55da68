"""Persisting events: ids reserved, rows buffered per batch, state, redactions and visibility written once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..errors import FactstreamError
from .event_json import EventFields, InvalidEvent, event_bytes, parse_event
from .records import _MISSING, OPEN_HI, OPEN_LO, NewEvent, PersistedEvent, _Batch, _Prev, _TxnEffects
from .state import CurrentState
from .visibility import HISTORY_VISIBILITY, MEMBER, effective_visibility, membership_at, normalise_visibility


class Persisting(CurrentState):
    """The writer's path: persist events in batches, one transaction per batch (see the store's module doc)."""

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
        """Persist a batch in one transaction (its own: not inside an open ``db.transaction()``).

        Results come back in the order given. Within the batch, events are
        persisted parents first (an event whose prev_event comes later in the
        batch waits for it), so its state is computed from them.
        """
        if not self.writer:
            raise FactstreamError("this EventStore is a reader (writer=False); persist on the writer")
        self._check_open()
        open_txn = getattr(self.db, "_open_txn", None)
        if open_txn is not None and open_txn() is not None:
            # Joined to the caller's transaction, the ids would complete (and the events stream
            # announce them) before that transaction commits: a reader fetching meanwhile would
            # pass over them for good.
            raise FactstreamError(
                "persist_events runs its own transaction and cannot join an open 'async with "
                "db.transaction()': call it outside, after that transaction ends"
            )
        given = _new_events(events)
        if not given:
            return []
        parsed_given = [parse_event(e.raw, e.event_id) for e in given]
        order = _parents_first(parsed_given)
        items = [given[i] for i in order]
        parsed = [parsed_given[i] for i in order]
        self._persisting += 1
        self._persists_done.clear()
        try:  # a locked SQLite file is the Database's DatabaseUnavailable, naming it, like an outage
            results = await self._persist_batch(items, parsed)
        finally:
            self._persisting -= 1
            if not self._persisting:
                self._persists_done.set()
        by_input = [res for _, res in sorted(zip(order, results), key=lambda pair: pair[0])]
        for fn in self._listeners:
            res = fn(by_input)
            if asyncio.iscoroutine(res):
                await res
        return by_input

    def _check_open(self) -> None:
        if self._closed:
            raise FactstreamError("this EventStore is closed; EventStore.open() it again to persist")

    async def _persist_batch(self, items: list[NewEvent], parsed: list[EventFields]) -> list[PersistedEvent]:
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
                    # A commit cut off may still have committed (the error only says the answer was
                    # lost): the change caches are told either way, as a room marked changed that
                    # did not costs one query, and one left unmarked hides its events from users.
                    txn.call_after_rollback(self._mark_changed, effects)
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
        self._mark_changed(effects)
        return res

    def _mark_changed(self, effects: _TxnEffects) -> None:
        for room, pos in effects.rooms.items():
            self.room_changes.entity_has_changed(room, pos)
        for user, pos in effects.users.items():
            self.membership_changes.entity_has_changed(user, pos)
            self._rooms_for_user.pop(user, None)

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



@asynccontextmanager
async def _reserve(gen: Any, n: int) -> AsyncIterator[list[int]]:
    if n == 0:
        yield []
        return
    async with gen.get_next_mult(n) as ids:
        yield list(ids)


def _new_events(events: Iterable[NewEvent | bytes]) -> list[NewEvent]:
    """The batch as NewEvents with bytes and real flags; a mistake named before anything is reserved."""
    if isinstance(events, (bytes, bytearray, memoryview, str, NewEvent)):
        raise TypeError(
            f"persist_events takes a list of events, got one {type(events).__name__}; "
            "pass [event] or call persist_event(event)"
        )
    out = []
    for e in events:
        if not isinstance(e, NewEvent):
            e = NewEvent(event_bytes(e))
        else:
            for flag in ("backfilled", "outlier", "rejected"):
                value = getattr(e, flag)
                if not isinstance(value, (bool, int)) or value not in (0, 1):
                    raise TypeError(f"NewEvent.{flag} must be True or False, got {value!r}")
            raw = event_bytes(e.raw)
            if raw is not e.raw:
                e = NewEvent(raw, bool(e.backfilled), bool(e.outlier), bool(e.rejected), e.event_id)
        out.append(e)
    return out


def _parents_first(parsed: Sequence[EventFields]) -> list[int]:
    """Indexes of ``parsed`` in the order to persist them: each after its prev_events in the batch.

    Stable: a batch already parents first keeps its order. Before, a child given
    before its parent was persisted as if that parent were unknown (empty state,
    invisible to the room's members) without a word.
    """
    first: dict[str, int] = {}
    for i, f in enumerate(parsed):
        first.setdefault(f.event_id, i)
    deps = [
        [j for p in dict.fromkeys(f.prev_events) if (j := first.get(p, i)) != i]
        for i, f in enumerate(parsed)
    ]
    if all(j < i for i, ds in enumerate(deps) for j in ds):
        return list(range(len(parsed)))
    order: list[int] = []
    state = [0] * len(parsed)  # 0: not seen, 1: waiting for its parents, 2: placed
    for start in range(len(parsed)):
        if state[start]:
            continue
        stack = [(start, iter(deps[start]))]
        state[start] = 1
        while stack:
            i, it = stack[-1]
            j = next(it, -1)
            if j < 0:
                stack.pop()
                state[i] = 2
                order.append(i)
            elif state[j] == 0:
                state[j] = 1
                stack.append((j, iter(deps[j])))
            elif state[j] == 1:
                raise InvalidEvent(
                    f"prev_events form a cycle in this batch (through {parsed[i].event_id!r:.100} and "
                    f"{parsed[j].event_id!r:.100}); an event cannot follow its own descendant"
                )
    return order

