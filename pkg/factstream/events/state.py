"""Room state: state groups before and after events, resolution, current state and extremities.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import FactstreamError
from .core import StoreCore
from .event_json import EventFields
from .records import _HV_KEY, EventNotFound, StateUnknown, _Batch, _Prev, _TxnEffects
from .resolver import StateKey, StateMap, conflicted_events
from .visibility import MEMBER, normalise_visibility


class CurrentState(StoreCore):
    """State before/after events and a room's current state: computed while persisting, read by queries."""

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
