"""The events stream's update source: ``ev``, ``state`` and ``state-all`` rows.

Rows have Synapse's shapes (``synapse.replication.tcp.streams.events``):
``["ev", [event_id, room_id, type, state_key, redacts, relates_to, membership,
rejected, outlier]]`` for each forward event, ``["state", [room_id, type,
state_key, event_id]]`` for each change of a room's current state, and
``["state-all", [room_id]]`` instead of a room's ``state`` rows when one page
holds 150 or more of them. Backfilled events (negative orderings) never appear.
As in Synapse, half of ``limit`` goes to event rows and half to state rows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..streams.sources import fetch_page

__all__ = ["EventsStreamSource", "MAX_STATE_ROWS_PER_ROOM"]

MAX_STATE_ROWS_PER_ROOM = 150

_KIND_ORDER = {"ev": 0, "state": 1, "state-all": 2}


class EventsStreamSource:
    """``get_updates(instance_name, from_token, upto_token, limit)`` over the event store tables."""

    def __init__(self, db: Any) -> None:
        self.db = db

    async def get_updates(
        self, instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[tuple[int, list[Any]]], int, bool]:
        """Rows of ``instance_name`` in ``(from_token, upto_token]``: ``(updates, upto, limited)``."""
        if from_token >= upto_token:
            return [], upto_token, False
        target = max(limit // 2, 1)
        ev_rows = await self.db.fetchall(
            "SELECT stream_ordering, event_id, room_id, type, state_key, redacts, relates_to, membership,"
            " rejected, outlier FROM events WHERE instance_name = ? AND stream_ordering > ?"
            " AND stream_ordering <= ? ORDER BY stream_ordering LIMIT ?",
            (instance_name, max(from_token, 0), upto_token, target),
        )
        limited = False
        upper = upto_token
        if len(ev_rows) == target:
            limited = True
            upper = int(ev_rows[-1][0])
        def fetch_state(lo: int, hi: int, n: int) -> Any:
            return self.db.fetchall(
                "SELECT stream_id, room_id, type, state_key, event_id FROM current_state_delta_stream"
                " WHERE instance_name = ? AND stream_id > ? AND stream_id <= ?"
                " ORDER BY stream_id, room_id, type, state_key LIMIT ?",
                (instance_name, lo, hi, n),
            )

        st_rows, st_upper, st_limited = await fetch_page(fetch_state, max(from_token, 0), upper, target)
        if st_limited:
            upper, limited = st_upper, True
        updates: list[tuple[int, list[Any]]] = []
        for r in ev_rows:
            tok = int(r[0])
            if tok <= upper:
                updates.append(
                    (tok, ["ev", [r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]), bool(r[9])]])
                )
        per_room: dict[str, list[int]] = defaultdict(list)
        for r in st_rows:
            per_room[r[1]].append(int(r[0]))
        all_rooms = {room: toks[-1] for room, toks in per_room.items() if len(toks) >= MAX_STATE_ROWS_PER_ROOM}
        for room, tok in all_rooms.items():
            updates.append((tok, ["state-all", [room]]))
        for r in st_rows:
            if r[1] not in all_rooms:
                updates.append((int(r[0]), ["state", [r[1], r[2], r[3], r[4]]]))
        updates.sort(key=lambda u: (u[0], _KIND_ORDER[u[1][0]]))
        return updates, upper, limited
