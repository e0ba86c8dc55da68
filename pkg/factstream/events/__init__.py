"""The room event store: the backing tables of the events stream.

``EventStore`` persists events losslessly with state groups, visibility spans
and both orderings, and answers the read paths (state at an event, topological
traversal, new events for a user, recent rooms, back-pagination).
``EventsStreamSource`` turns the tables into Synapse's events stream rows.
See docs/event_store.md.
"""

from __future__ import annotations

from . import schema
from .event_json import EventFields, InvalidEvent, parse_event, prune_event_json
from .resolver import DepthResolver, StateResolver
from .source import EventsStreamSource
from .store import EventNotFound, EventStore, NewEvent, PersistedEvent, ReturnedEvent, RoomEvents, StateUnknown
from .tokens import RoomsToken, StreamToken, TokenError, TopologicalToken

__all__ = [
    "schema",
    "EventStore",
    "EventsStreamSource",
    "NewEvent",
    "PersistedEvent",
    "ReturnedEvent",
    "RoomEvents",
    "EventNotFound",
    "StateUnknown",
    "EventFields",
    "InvalidEvent",
    "parse_event",
    "prune_event_json",
    "DepthResolver",
    "StateResolver",
    "RoomsToken",
    "StreamToken",
    "TopologicalToken",
    "TokenError",
]
