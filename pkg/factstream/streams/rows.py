"""Typed rows of Synapse's replication streams, field for field in wire order.

A row travels as a JSON array (``RDATA <stream> <writer> <token> <row>``);
``Row.from_wire(list)`` gives the typed value and ``row.to_wire()`` the array
back, so a line from a real Synapse decodes into a typed row and re-encodes to
the same bytes. The ``events`` stream wraps one of three kinds (``ev``,
``state``, ``state-all``) as ``[kind, [fields...]]``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, dataclass_transform

from ..errors import ProtocolError

__all__ = [
    "Row",
    "BackfillRow",
    "PresenceRow",
    "PresenceFederationRow",
    "TypingRow",
    "ReceiptsRow",
    "PushRulesRow",
    "PushersRow",
    "CachesRow",
    "DeviceListsRow",
    "ToDeviceRow",
    "AccountDataRow",
    "ThreadSubscriptionsRow",
    "ProfileUpdatesRow",
    "StickyEventsRow",
    "QuarantinedMediaRow",
    "FederationRow",
    "UnPartialStatedRoomRow",
    "UnPartialStatedEventRow",
    "EventsRow",
    "EventRow",
    "CurrentStateRow",
    "AllStateRow",
    "EVENT_ROW_KINDS",
    "wire_fields",
    "wire_kinds",
]

R = TypeVar("R", bound="Row")

_FIELD_COUNTS: dict[type, int] = {}  # row class -> number of wire fields


class Row:
    """Base of the row types: a frozen dataclass whose fields are in wire order."""

    __slots__ = ()
    STREAM: ClassVar[str] = ""

    @classmethod
    def from_wire(cls: type[R], row: Any) -> R:
        """The typed row for a decoded JSON array; ProtocolError if its shape is wrong."""
        if not isinstance(row, (list, tuple)):
            raise ProtocolError(f"{cls.STREAM} row must be a JSON array, not {type(row).__name__}", repr(row))
        n = _FIELD_COUNTS.get(cls)
        if n is None:  # dataclasses.fields() per row was most of a replaying reader's CPU
            n = _FIELD_COUNTS[cls] = len(dataclasses.fields(cls))  # type: ignore[arg-type]
        if len(row) != n:
            raise ProtocolError(f"{cls.STREAM} row must have {n} fields, got {len(row)}", repr(row))
        return cls(*row)

    def to_wire(self) -> list[Any]:
        """The JSON array Synapse sends for this row."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]  # type: ignore[arg-type]


@dataclass_transform(frozen_default=True)
def _row(stream: str) -> Callable[[type[R]], type[R]]:
    def wrap(cls: type[R]) -> type[R]:
        cls.STREAM = stream
        return dataclasses.dataclass(frozen=True, slots=True)(cls)

    return wrap


@_row("backfill")
class BackfillRow(Row):
    """An old event was fetched, or stopped being an outlier (tokens are negative)."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    redacts: str | None
    relates_to: str | None


@_row("presence")
class PresenceRow(Row):
    """A user's presence changed."""

    user_id: str
    state: str
    last_active_ts: int
    last_federation_update_ts: int
    last_user_sync_ts: int
    status_msg: str | None
    currently_active: bool


@_row("presence_federation")
class PresenceFederationRow(Row):
    """A presence update to send to one remote destination."""

    destination: str
    user_id: str


@_row("typing")
class TypingRow(Row):
    """Everyone typing in a room right now (replaces the previous list)."""

    room_id: str
    user_ids: list[str]


@_row("receipts")
class ReceiptsRow(Row):
    """A read receipt."""

    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: dict[str, Any]


@_row("push_rules")
class PushRulesRow(Row):
    """A user changed their push rules."""

    user_id: str


@_row("pushers")
class PushersRow(Row):
    """A pusher was added, changed or removed."""

    user_id: str
    app_id: str
    pushkey: str
    deleted: bool


@_row("caches")
class CachesRow(Row):
    """Invalidate ``keys`` of ``cache_func`` (the whole cache when ``keys`` is None)."""

    cache_func: str
    keys: list[Any] | None
    invalidation_ts: int


@_row("device_lists")
class DeviceListsRow(Row):
    """A user's devices or cross-signing signatures changed."""

    user_id: str
    is_signature: bool
    hosts_calculated: bool


@_row("to_device")
class ToDeviceRow(Row):
    """New to-device messages for a user or a remote server (``entity``)."""

    entity: str


@_row("account_data")
class AccountDataRow(Row):
    """Global (room_id None) or per-room account data changed."""

    user_id: str
    room_id: str | None
    data_type: str


@_row("thread_subscriptions")
class ThreadSubscriptionsRow(Row):
    """A thread subscription changed."""

    user_id: str
    room_id: str
    event_id: str


@_row("profile_updates")
class ProfileUpdatesRow(Row):
    """A profile changed (``affected_fields`` only for action ``update``)."""

    user_id: str
    action: str
    affected_fields: list[str] | None


@_row("sticky_events")
class StickyEventsRow(Row):
    """A sticky event changed."""

    room_id: str
    event_id: str


@_row("quarantined_media")
class QuarantinedMediaRow(Row):
    """Media was quarantined or released."""

    origin: str
    media_id: str
    quarantined: bool


@_row("federation")
class FederationRow(Row):
    """Data for the federation sender (``type`` names the kind of ``data``)."""

    type: str
    data: Any


@_row("un_partial_stated_room")
class UnPartialStatedRoomRow(Row):
    """A room now has full state."""

    room_id: str


@_row("un_partial_stated_event")
class UnPartialStatedEventRow(Row):
    """An event now has full state."""

    event_id: str
    rejection_status_changed: bool


# ----------------------------------------------------------------- events


@_row("events")
class EventRow(Row):
    """Events-stream kind ``ev``: a new event (or an ex-outlier)."""

    KIND: ClassVar[str] = "ev"
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    redacts: str | None
    relates_to: str | None
    membership: str | None
    rejected: bool
    outlier: bool


@_row("events")
class CurrentStateRow(Row):
    """Events-stream kind ``state``: one current-state entry changed (event_id None = removed)."""

    KIND: ClassVar[str] = "state"
    room_id: str
    type: str
    state_key: str
    event_id: str | None


@_row("events")
class AllStateRow(Row):
    """Events-stream kind ``state-all``: all of a room's current state changed."""

    KIND: ClassVar[str] = "state-all"
    room_id: str


#: Events-stream kind -> its row type.
EVENT_ROW_KINDS: dict[str, type[Row]] = {cls.KIND: cls for cls in (EventRow, CurrentStateRow, AllStateRow)}


@dataclasses.dataclass(frozen=True, slots=True)
class EventsRow(Row):
    """A row of the ``events`` stream: ``[kind, data]`` with ``data`` one of the kinds above."""

    STREAM: ClassVar[str] = "events"
    type: str
    data: Row

    @classmethod
    def from_wire(cls, row: Any) -> EventsRow:
        if not isinstance(row, (list, tuple)) or len(row) != 2:
            raise ProtocolError("events row must be a JSON array [kind, fields]", repr(row))
        kind, data = row
        try:
            kind_cls = EVENT_ROW_KINDS[kind]
        except (KeyError, TypeError):
            raise ProtocolError(
                f"events row kind {kind!r} is unknown (expected one of {', '.join(EVENT_ROW_KINDS)})", repr(row)
            ) from None
        return cls(kind, kind_cls.from_wire(data))

    @classmethod
    def of(cls, data: Row) -> EventsRow:
        """Wrap an EventRow / CurrentStateRow / AllStateRow for sending."""
        return cls(data.KIND, data)  # type: ignore[attr-defined]

    def to_wire(self) -> list[Any]:
        return [self.type, self.data.to_wire()]


# ----------------------------------------------------------------- building rows without from_wire

_BASE_FROM_WIRE: Any = Row.__dict__["from_wire"].__func__
_EVENTS_FROM_WIRE: Any = EventsRow.__dict__["from_wire"].__func__


def _init_fields(cls: Any) -> tuple[str, ...] | None:
    """The fields ``cls(*values)`` does nothing but store, in order, each in its slot; else None.

    True of a frozen dataclass with slots, its generated ``__init__`` taking
    exactly its fields, no ``__post_init__``, no ``__new__`` of its own and
    no metaclass: building one is allocating it and filling those slots.
    """
    if not isinstance(cls, type) or type(cls) is not type or getattr(cls, "__new__") is not object.__new__:
        return None
    params = cls.__dict__.get("__dataclass_params__")
    if params is None or not params.init or not params.frozen or hasattr(cls, "__post_init__"):
        return None
    if getattr(cls, "__abstractmethods__", None):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    init = cls.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    # The generated __init__ is compiled from a string; one written in the class body is not.
    if (
        code is None
        or code.co_filename != "<string>"
        or code.co_argcount != len(names) + 1
        or code.co_kwonlyargcount
        or code.co_flags & (0x04 | 0x08)  # *args, **kwargs
        or code.co_varnames[1 : len(names) + 1] != names  # (an InitVar would be a parameter too)
    ):
        return None
    for name in names:
        for klass in cls.__mro__:
            if name in klass.__dict__:
                if type(klass.__dict__[name]) is not types.MemberDescriptorType:
                    return None
                break
        else:
            return None
    return names


def wire_fields(cls: Any) -> tuple[str, ...] | None:
    """The slots ``cls.from_wire`` fills from an array of that length, when filling them is all it does; else None.

    That is a row class whose ``from_wire`` is :meth:`Row.from_wire` and whose
    ``cls(*row)`` only stores the values (see ``_init_fields``). The
    replication relay's :class:`~factstream.replication._relay.RowParser`
    then builds such rows itself, without a Python call per row; a class
    with anything of its own (``from_wire``, ``__init__``,
    ``__post_init__``) gets None and is built by its ``from_wire``.
    """
    if getattr(getattr(cls, "from_wire", None), "__func__", None) is not _BASE_FROM_WIRE:
        return None
    return _init_fields(cls)


def wire_kinds(cls: Any) -> Mapping[str, type[Row]] | None:
    """For a row sent as ``[kind, fields]``: the kinds by name, when ``cls.from_wire`` is :class:`EventsRow`'s.

    Only when ``cls(kind, data)`` only stores its two fields (``type``,
    ``data``); the mapping is the live :data:`EVENT_ROW_KINDS`, so a kind
    added later is seen. Else None.
    """
    if getattr(getattr(cls, "from_wire", None), "__func__", None) is not _EVENTS_FROM_WIRE:
        return None
    if _init_fields(cls) != ("type", "data"):
        return None
    return EVENT_ROW_KINDS
