"""What the event store takes and returns: new and persisted events, returned rows, errors.

A leaf of the events package, so the store's parts (persist, state, queries) share these
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import FactstreamError
from . import schema
from .resolver import StateKey
from .tokens import TopologicalToken
from .visibility import HISTORY_VISIBILITY

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


# ------------------------------------------------------------ one persist batch (shared by persist and state)

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
