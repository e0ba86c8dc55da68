"""Reading events: by id, in topological order, new events for a user, recent rooms and back-pagination.

A reader answers only up to the events stream position it has been told about (``_upto``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _checks
from ..errors import FactstreamError
from .event_json import prune_event_json
from .records import EventNotFound, ReturnedEvent, RoomEvents
from .state import CurrentState
from .tokens import RoomsToken, StreamToken, TokenError, TopologicalToken

_MAX_LIMIT = 1 << 62

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


class Queries(CurrentState):
    """The read paths: single events, topological order, per-user new events and back-pagination."""

    async def get_event_json(self, event_id: str, *, prune_redacted: bool = True) -> bytes:
        """The stored bytes of ``event_id`` (its pruned form if redacted, unless told not to)."""
        row = await self.db.fetchone("SELECT json, redacted FROM events WHERE event_id = ?", (event_id,))
        if row is None:
            raise EventNotFound(f"event {event_id} is not stored")
        raw = _blob(row[0])
        return prune_event_json(raw) if prune_redacted and row[1] else raw

    # ------------------------------------------------------------ reading: topological order

    async def get_events_topological(
        self,
        room_id: str,
        from_token: TopologicalToken | str | None = None,
        direction: str = "f",
        limit: int = 100,
    ) -> tuple[list[str], TopologicalToken | None]:
        """Room events (non-outlier, non-rejected) in topological order, strictly after
        (``"f"``) or before (``"b"``) ``from_token``; returns ids and the token to continue."""
        if direction not in ("f", "b"):
            raise ValueError(f"direction must be 'f' (forwards) or 'b' (backwards), got {direction!r}")
        limit = _limit("limit", limit)
        from_token = _topological(from_token)
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
        from_token: int | StreamToken | str,
        to_token: int | StreamToken | str | None = None,
        *,
        limit: int = 50,
        use_caches: bool = True,
    ) -> dict[str, RoomEvents]:
        """Events in ``(from_token, to_token]`` for ``user_id``: its rooms' visible events and its
        own membership changes anywhere (invites included), at most ``limit`` per room (newest).
        Tokens are stream positions: ints, :class:`StreamToken` or their ``s<n>`` strings."""
        from_token = _stream(from_token, "from_token")
        to_token = None if to_token is None else _stream(to_token, "to_token")
        limit = _limit("limit", limit)
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
        from_token: RoomsToken | str | None = None,
        to_token: int | StreamToken | str | None = None,
    ) -> tuple[dict[str, RoomEvents], RoomsToken | None]:
        """The ``n_events`` most recent visible events in each of the ``m_rooms`` most recently
        active rooms the user is joined to or invited to (as of the token); a token for the next page."""
        n_events = _limit("n_events", n_events)
        m_rooms = _limit("m_rooms", m_rooms)
        if from_token is not None and not isinstance(from_token, RoomsToken):
            from_token = RoomsToken.parse(_token_text(from_token, "rooms"))
        to_token = None if to_token is None else _stream(to_token, "to_token")
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
        from_token: TopologicalToken | str | None,
        limit: int,
        to_token: int | StreamToken | str | None = None,
    ) -> tuple[list[ReturnedEvent], TopologicalToken | None]:
        """Events visible to ``user_id`` strictly before ``from_token`` (None: the room's end), in
        reverse topological order; returns them (newest first) and the token to continue, or None."""
        limit = _limit("limit", limit)
        from_token = _topological(from_token)
        to_token = None if to_token is None else _stream(to_token, "to_token")
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


def _blob(value: Any) -> bytes:
    """A stored ``json`` value as bytes (a str stored by an older version comes back as TEXT on SQLite)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _limit(name: str, value: object) -> int:
    """A page size: a whole number >= 1 (0 returned an empty page that read as "nothing more")."""
    return min(_checks.whole(name, value, 1), _MAX_LIMIT)


def _token_text(token: object, kind: str) -> str:
    if not isinstance(token, str):
        raise TokenError(f"expected a {kind} token (or its string), got {type(token).__name__} {token!r:.100}")
    return token


def _topological(token: object) -> TopologicalToken | None:
    """A topological token given as the object or its ``t<depth>-<stream>`` string (None: the room's end)."""
    if token is None or isinstance(token, TopologicalToken):
        return token
    return TopologicalToken.parse(_token_text(token, "topological"))


def _stream(token: object, name: str) -> int:
    """A stream position given as an int, a :class:`StreamToken` or its ``s<n>`` string."""
    if isinstance(token, StreamToken):
        return token.stream
    if isinstance(token, str):
        return StreamToken.parse(token).stream
    if isinstance(token, bool) or not isinstance(token, int):
        raise TokenError(f"{name} must be a stream position (int, StreamToken or 's<n>'), got {token!r:.100}")
    return token


def _returned(r: Sequence[Any]) -> ReturnedEvent:
    raw = _blob(r[4])
    redacted = bool(r[3])
    return ReturnedEvent(r[0], int(r[1]), int(r[2]), prune_event_json(raw) if redacted else raw, redacted)
