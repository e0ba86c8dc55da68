"""A deliberately simple reference model of the room event store (no database).

It keeps every persisted event in a dict and answers each question by
replaying from scratch: state by recursion over prev_events, current state by
folding the forward events in stream order, visibility by applying the rules
to the state before and after each event. Slow and obviously right is the
point; the store's answers must equal these.

The rules (the same ones docs/event_store.md states for the store):
state before = resolve(states after the known non-outlier prev_events in the
same room); rejected events change nothing; conflicts go to the deepest event,
then the greatest event_id; visibility uses the laxer of before/after for both
history_visibility and the user's own membership; shared also admits users
joined at the query position; users always see their own membership events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MEMBER = "m.room.member"
HV = "m.room.history_visibility"
VIS_ORDER = ["world_readable", "shared", "invited", "joined"]

Key = tuple[str, str]
State = dict[Key, str]


@dataclass
class MEvent:
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    depth: int
    prevs: list[str]
    content: dict[str, Any]
    redacts: str | None
    raw: bytes
    stream: int
    backfilled: bool
    outlier: bool
    rejected: bool
    order: int  # persist order
    known_prevs: list[str] = field(default_factory=list)

    @property
    def membership(self) -> str | None:
        if self.type == MEMBER and self.state_key is not None:
            m = self.content.get("membership")
            return m if isinstance(m, str) else None
        return None


class Model:
    """Every persisted event, and answers computed from scratch."""

    def __init__(self) -> None:
        self.events: dict[str, MEvent] = {}
        self.order: list[str] = []
        self._after: dict[str, State] = {}
        self._history: dict[str, list[tuple[int, State]]] = {}

    # ------------------------------------------------------------------ input

    def persist(self, raw: bytes, stream: int, *, backfilled: bool, outlier: bool, rejected: bool) -> None:
        d = json.loads(raw)
        eid = d["event_id"]
        if eid in self.events:
            return
        prevs = [p if isinstance(p, str) else p[0] for p in d.get("prev_events", [])]
        redacts = d.get("redacts", d.get("content", {}).get("redacts")) if d["type"] == "m.room.redaction" else None
        ev = MEvent(
            eid, d["room_id"], d["type"], d.get("state_key"), d.get("depth", 0), prevs,
            d.get("content", {}), redacts if isinstance(redacts, str) else None, raw, stream,
            backfilled, outlier, rejected, len(self.order),
        )
        ev.known_prevs = [
            p for p in dict.fromkeys(prevs)
            if p in self.events and self.events[p].room_id == ev.room_id
        ]
        self.events[eid] = ev
        self.order.append(eid)
        self._history.clear()

    # ------------------------------------------------------------------ state

    def resolve(self, states: list[State]) -> State:
        out: State = {}
        keys = {k for s in states for k in s}
        for k in keys:
            cands = {s[k] for s in states if k in s}
            out[k] = max(cands, key=lambda e: (self.events[e].depth, e))
        return out

    def state_before(self, eid: str) -> State:
        ev = self.events[eid]
        assert not ev.outlier
        states = [self.state_after(p) for p in ev.known_prevs if not self.events[p].outlier]
        return self.resolve(states)

    def state_after(self, eid: str) -> State:
        if eid in self._after:
            return self._after[eid]
        ev = self.events[eid]
        s = dict(self.state_before(eid))
        if ev.state_key is not None and not ev.rejected:
            s[(ev.type, ev.state_key)] = eid
        self._after[eid] = s
        return s

    def current_state_history(self, room: str) -> list[tuple[int, State]]:
        """(stream, current state after it) for each forward event that was applied."""
        if room in self._history:
            return self._history[room]
        x: set[str] = set()
        out: list[tuple[int, State]] = []
        for eid in self.order:
            ev = self.events[eid]
            if ev.room_id != room or ev.backfilled or ev.outlier or ev.rejected:
                continue
            x = (x - set(ev.prevs)) | {eid}
            out.append((ev.stream, self.resolve([self.state_after(e) for e in x])))
        self._history[room] = out
        return out

    def current_state(self, room: str, upto: int | None = None) -> State:
        cur: State = {}
        for stream, state in self.current_state_history(room):
            if upto is not None and stream > upto:
                break
            cur = state
        return cur

    def extremities(self, room: str) -> set[str]:
        x: set[str] = set()
        for eid in self.order:
            ev = self.events[eid]
            if ev.room_id == room and not (ev.backfilled or ev.outlier or ev.rejected):
                x = (x - set(ev.prevs)) | {eid}
        return x

    def state_deltas(self) -> list[tuple[int, str, str, str, str]]:
        """(stream, room, type, state_key, event_id) for every current-state change."""
        out = []
        for room in self.rooms():
            prev: State = {}
            for stream, state in self.current_state_history(room):
                for k in sorted(state):
                    if prev.get(k) != state[k]:
                        out.append((stream, room, k[0], k[1], state[k]))
                prev = state
        return sorted(out)

    def rooms(self) -> list[str]:
        return sorted({e.room_id for e in self.events.values()})

    # ------------------------------------------------------------------ visibility

    def _membership_of(self, state: State, user: str) -> str | None:
        e = state.get((MEMBER, user))
        return self.events[e].membership if e else None

    def _vis_of(self, state: State) -> str:
        e = state.get((HV, ""))
        v = self.events[e].content.get("history_visibility") if e else None
        return v if v in VIS_ORDER else "shared"

    def membership_as_of(self, user: str, room: str, upto: int) -> str | None:
        return self._membership_of(self.current_state(room, upto), user)

    def visible(self, user: str, eid: str, joined_now: bool) -> bool:
        ev = self.events[eid]
        if ev.rejected:
            return False
        if ev.type == MEMBER and ev.state_key == user:
            return True
        if ev.outlier:
            return False
        before, after = self.state_before(eid), self.state_after(eid)
        vis = min(self._vis_of(before), self._vis_of(after), key=VIS_ORDER.index)
        rank = {"join": 2, "invite": 1}
        mb, ma = self._membership_of(before, user), self._membership_of(after, user)
        m = mb if rank.get(mb or "", 0) >= rank.get(ma or "", 0) else ma
        if vis == "world_readable" or m == "join":
            return True
        if vis == "invited":
            return m == "invite"
        if vis == "shared":
            return joined_now
        return False

    def redacted(self, eid: str) -> bool:
        ev = self.events[eid]
        return any(
            r.redacts == eid and r.room_id == ev.room_id and not r.rejected for r in self.events.values()
        )

    # ------------------------------------------------------------------ queries

    def topological(self, room: str) -> list[str]:
        evs = [e for e in self.events.values() if e.room_id == room and not e.outlier and not e.rejected]
        return [e.event_id for e in sorted(evs, key=lambda e: (e.depth, e.stream))]

    def new_events_for_user(
        self, user: str, since: int, upto: int, limit: int, rooms_filter: set[str] | None = None
    ) -> dict[str, tuple[list[str], bool]]:
        out: dict[str, tuple[list[str], bool]] = {}
        for room in self.rooms():
            if rooms_filter is not None and room not in rooms_filter:
                continue
            joined_now = self.membership_as_of(user, room, upto) == "join"
            hist = self.current_state_history(room)
            changed = any(
                since < s <= upto and st.get((MEMBER, user)) != prev.get((MEMBER, user))
                for (s, st), prev in zip(hist, [{}] + [h[1] for h in hist])
            )
            own = any(
                e.room_id == room and e.type == MEMBER and e.state_key == user and not e.rejected
                and since < e.stream <= upto
                for e in self.events.values()
            )
            if not (joined_now or changed or own):
                continue
            evs = sorted(
                (e for e in self.events.values()
                 if e.room_id == room and since < e.stream <= upto and self.visible(user, e.event_id, joined_now)),
                key=lambda e: e.stream,
            )
            if evs:
                out[room] = ([e.event_id for e in evs[-limit:]], len(evs) > limit)
        return out

    def room_activity(self, room: str, upto: int) -> int:
        return max(
            (e.stream for e in self.events.values()
             if e.room_id == room and 0 < e.stream <= upto and not e.outlier and not e.rejected),
            default=0,
        )

    def recent_rooms(
        self, user: str, n: int, upto: int, rooms_filter: set[str]
    ) -> list[tuple[str, list[str], bool]]:
        """All pages concatenated: (room, last n visible event ids, limited) by activity."""
        rooms = [
            r for r in self.rooms()
            if r in rooms_filter and self.membership_as_of(user, r, upto) in ("join", "invite")
        ]
        rooms.sort(key=lambda r: (-self.room_activity(r, upto), r))
        out = []
        for room in rooms:
            joined_now = self.membership_as_of(user, room, upto) == "join"
            evs = sorted(
                (e for e in self.events.values()
                 if e.room_id == room and 0 < e.stream <= upto and self.visible(user, e.event_id, joined_now)),
                key=lambda e: e.stream,
            )
            out.append((room, [e.event_id for e in evs[-n:]], len(evs) > n))
        return out

    def back_pagination(self, room: str, user: str, upto: int) -> list[str]:
        """Every event the user may see in the room, newest first in topological order."""
        joined_now = self.membership_as_of(user, room, upto) == "join"
        evs = [
            e for e in self.events.values()
            if e.room_id == room and e.stream <= upto and not e.outlier
            and self.visible(user, e.event_id, joined_now)
        ]
        return [e.event_id for e in sorted(evs, key=lambda e: (e.depth, e.stream), reverse=True)]

    def ev_rows(self, since: int, upto: int) -> list[tuple[int, list[Any]]]:
        out = []
        for e in self.events.values():
            if since < e.stream <= upto:
                out.append((e.stream, ["ev", [
                    e.event_id, e.room_id, e.type, e.state_key, e.redacts,
                    (e.content.get("m.relates_to") or {}).get("event_id")
                    if isinstance(e.content.get("m.relates_to"), dict) else None,
                    e.membership, e.rejected, e.outlier,
                ]]))
        return sorted(out, key=lambda r: r[0])
