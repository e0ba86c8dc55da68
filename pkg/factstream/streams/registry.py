"""The stream registry: which streams exist, their row types and update sources.

A :class:`StreamDefinition` names a stream and its row type; an update source
(anything with ``get_updates``, see :mod:`factstream.streams.sources`) is
attached per process, because the same stream is read from a database on one
process and from a writer's memory on another.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import FactstreamError, ProtocolError
from . import rows as r

__all__ = ["StreamDefinition", "StreamRegistry", "UnknownStreamError", "SYNAPSE_STREAMS", "default_registry"]


class UnknownStreamError(FactstreamError, KeyError):
    """A stream name nobody registered; register it (``StreamRegistry.register``) or ignore it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown stream"


@dataclass(frozen=True, slots=True)
class StreamDefinition:
    """One stream: its wire name, its row type and whether facts live only in a writer's memory.

    ``in_memory`` streams (typing, presence_federation, federation) have no
    backing table: a reader fetches missed facts from the writer itself.
    """

    name: str
    row_type: type[r.Row]
    in_memory: bool = False
    description: str = ""

    def parse_row(self, row: Any) -> r.Row:
        """The typed row of a decoded JSON array (ProtocolError if malformed)."""
        return self.row_type.from_wire(row)


class StreamRegistry:
    """Streams by name; lookups of an unknown name raise :class:`UnknownStreamError`."""

    def __init__(self, definitions: Iterable[StreamDefinition] = ()) -> None:
        self._streams: dict[str, StreamDefinition] = {}
        for d in definitions:
            self.register(d)

    def register(self, definition: StreamDefinition, *, replace: bool = False) -> StreamDefinition:
        """Add a stream; registering a name twice is an error unless ``replace``."""
        if definition.name in self._streams and not replace:
            raise ValueError(f"stream {definition.name!r} is already registered; pass replace=True to override")
        self._streams[definition.name] = definition
        return definition

    def get(self, name: str) -> StreamDefinition:
        """The definition of ``name``, or UnknownStreamError saying which streams exist."""
        try:
            return self._streams[name]
        except KeyError:
            raise UnknownStreamError(
                f"unknown stream {name!r}; known streams: {', '.join(sorted(self._streams))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._streams

    def __iter__(self) -> Iterator[StreamDefinition]:
        return iter(self._streams.values())

    def __len__(self) -> int:
        return len(self._streams)

    def names(self) -> list[str]:
        """Registered stream names, sorted."""
        return sorted(self._streams)

    def parse_row(self, stream_name: str, row: Any) -> r.Row:
        """Typed row for ``row`` of ``stream_name`` (UnknownStreamError / ProtocolError)."""
        return self.get(stream_name).parse_row(row)

    def copy(self) -> StreamRegistry:
        """An independent registry with the same definitions (to add private streams)."""
        return StreamRegistry(self._streams.values())


def _d(row_type: type[r.Row], description: str, in_memory: bool = False) -> StreamDefinition:
    return StreamDefinition(row_type.STREAM, row_type, in_memory, description)


#: Every stream of Synapse 1.163's ``synapse/replication/tcp/streams``.
SYNAPSE_STREAMS: tuple[StreamDefinition, ...] = (
    _d(r.EventsRow, "new events and current-state changes (kinds ev, state, state-all)"),
    _d(r.BackfillRow, "backfilled events (negative tokens)"),
    _d(r.PresenceRow, "presence changes"),
    _d(r.PresenceFederationRow, "presence to send to remote servers", in_memory=True),
    _d(r.TypingRow, "who is typing in a room", in_memory=True),
    _d(r.ReceiptsRow, "read receipts"),
    _d(r.PushRulesRow, "push rule changes"),
    _d(r.PushersRow, "pusher changes"),
    _d(r.CachesRow, "cache invalidations"),
    _d(r.DeviceListsRow, "device list and signature changes"),
    _d(r.ToDeviceRow, "new to-device messages"),
    _d(r.AccountDataRow, "account data and tag changes"),
    _d(r.ThreadSubscriptionsRow, "thread subscription changes"),
    _d(r.ProfileUpdatesRow, "profile updates"),
    _d(r.StickyEventsRow, "sticky event changes"),
    _d(r.QuarantinedMediaRow, "media quarantine changes"),
    _d(r.FederationRow, "federation sender queue", in_memory=True),
    _d(r.UnPartialStatedRoomRow, "rooms that gained full state"),
    _d(r.UnPartialStatedEventRow, "events that gained full state"),
)


def default_registry() -> StreamRegistry:
    """A fresh registry holding Synapse's streams (add your own with ``register``)."""
    return StreamRegistry(SYNAPSE_STREAMS)


# Keep the row-shape error importable from here for callers catching parse failures.
RowError = ProtocolError
