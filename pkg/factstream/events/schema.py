"""Schema of the room event store (component ``events``), registered with migrations.

Tables and why they exist:

* ``events``: one row per event; ``json`` holds the bytes exactly as received,
  the other columns are parsed copies for queries. ``stream_ordering`` is the
  events stream id (negative for backfilled events), ``topological_ordering``
  the event's depth.
* ``event_edges``: the room DAG (prev_events).
* ``state_groups`` / ``state_group_deltas``: state as delta chains. A group
  stores only the entries that differ from its ``base_group``; bases are chosen
  so chains stay logarithmically short (see ``state_groups.py``).
* ``forward_extremities``, ``current_state_events``: a room's heads and the
  resolved state at them; ``current_state_delta_stream`` records every change
  of current state at the stream id of the event that caused it (the source of
  the events stream's ``state`` rows and of "membership as of a token").
* ``membership_spans``: the per-user visibility table. A row says ``user_id``
  had ``membership`` (join or invite) at every event of the room whose stream
  ordering lies in ``[lo, hi]``; it is written when persisting, from the state
  at each event.
* ``redactions``: redaction events and their targets (which may arrive first).
* ``room_cursors``: the last event per room and direction (forward/backfill),
  the reference for incremental visibility spans.
* ``event_store_counters``: id allocation for state groups.
"""

from __future__ import annotations

from ..store.migrations import register

__all__ = ["COMPONENT", "STEPS", "OPEN_HI", "OPEN_LO"]

COMPONENT = "events"

#: Sentinels for open-ended spans (cheaper to index than NULLs).
OPEN_HI = 1 << 62
OPEN_LO = -(1 << 62)

STEPS = [
    """
    CREATE TABLE events (
        stream_ordering BIGINT PRIMARY KEY,
        topological_ordering BIGINT NOT NULL,
        event_id TEXT NOT NULL UNIQUE,
        room_id TEXT NOT NULL,
        type TEXT NOT NULL,
        state_key TEXT,
        sender TEXT NOT NULL,
        membership TEXT,
        redacts TEXT,
        relates_to TEXT,
        instance_name TEXT NOT NULL,
        outlier SMALLINT NOT NULL,
        rejected SMALLINT NOT NULL,
        redacted SMALLINT NOT NULL,
        history_visibility TEXT,
        state_group_before BIGINT,
        state_group BIGINT,
        json {bytes} NOT NULL
    );
    CREATE INDEX events_room_stream ON events (room_id, stream_ordering);
    CREATE INDEX events_room_topo ON events (room_id, topological_ordering, stream_ordering);
    CREATE INDEX events_member_key ON events (state_key, type, stream_ordering);
    CREATE INDEX events_instance_stream ON events (instance_name, stream_ordering);
    CREATE TABLE event_edges (
        event_id TEXT NOT NULL,
        prev_event_id TEXT NOT NULL,
        room_id TEXT NOT NULL,
        PRIMARY KEY (event_id, prev_event_id)
    );
    CREATE INDEX event_edges_prev ON event_edges (prev_event_id);
    CREATE TABLE state_groups (
        id BIGINT PRIMARY KEY,
        room_id TEXT NOT NULL,
        base_group BIGINT,
        height BIGINT NOT NULL,
        history_visibility TEXT NOT NULL
    );
    CREATE TABLE state_group_deltas (
        state_group BIGINT NOT NULL,
        type TEXT NOT NULL,
        state_key TEXT NOT NULL,
        event_id TEXT NOT NULL,
        PRIMARY KEY (state_group, type, state_key)
    );
    CREATE TABLE forward_extremities (
        room_id TEXT NOT NULL,
        event_id TEXT NOT NULL,
        PRIMARY KEY (room_id, event_id)
    );
    CREATE TABLE current_state_events (
        room_id TEXT NOT NULL,
        type TEXT NOT NULL,
        state_key TEXT NOT NULL,
        event_id TEXT NOT NULL,
        membership TEXT,
        PRIMARY KEY (room_id, type, state_key)
    );
    CREATE TABLE current_state_delta_stream (
        stream_id BIGINT NOT NULL,
        instance_name TEXT NOT NULL,
        room_id TEXT NOT NULL,
        type TEXT NOT NULL,
        state_key TEXT NOT NULL,
        event_id TEXT,
        prev_event_id TEXT,
        membership TEXT
    );
    CREATE INDEX csds_stream ON current_state_delta_stream (stream_id);
    CREATE INDEX csds_member ON current_state_delta_stream (state_key, type, stream_id);
    CREATE TABLE membership_spans (
        room_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        membership TEXT NOT NULL,
        lo BIGINT NOT NULL,
        hi BIGINT NOT NULL
    );
    CREATE INDEX membership_spans_key ON membership_spans (room_id, user_id, lo);
    CREATE TABLE redactions (
        event_id TEXT PRIMARY KEY,
        redacts TEXT NOT NULL,
        room_id TEXT NOT NULL
    );
    CREATE INDEX redactions_redacts ON redactions (redacts);
    CREATE TABLE room_cursors (
        room_id TEXT NOT NULL,
        direction TEXT NOT NULL,
        event_id TEXT NOT NULL,
        group_before BIGINT,
        group_after BIGINT,
        target TEXT,
        PRIMARY KEY (room_id, direction)
    );
    CREATE TABLE event_store_counters (
        name TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );
    INSERT INTO event_store_counters (name, value) VALUES ('state_group', 0)
    """,
]

register(COMPONENT, STEPS)
