"""Pagination tokens of the event store.

Why strings: clients and other processes hand tokens back verbatim, so each
has one textual form that round-trips exactly.

* ``s<stream>``: a position in the global stream ordering (new events since).
* ``t<depth>-<stream>``: a point in a room's topological order (depth, then
  stream ordering as tie-break); back-pagination continues strictly before it,
  forward traversal strictly after it. Stream orderings may be negative
  (backfilled events), e.g. ``t5--3``.
* ``r<upto>~<activity>~<room_id>``: the next page of "recent rooms" for a user,
  pinned to stream position ``upto`` and continuing after the room whose last
  activity was ``activity``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import FactstreamError

__all__ = ["TokenError", "StreamToken", "TopologicalToken", "RoomsToken"]


class TokenError(FactstreamError, ValueError):
    """A token string that does not parse; pass back a token the store returned."""


_STREAM = re.compile(r"s(-?\d+)\Z")
_TOPO = re.compile(r"t(-?\d+)-(-?\d+)\Z")
_ROOMS = re.compile(r"r(-?\d+)~(-?\d+)~(.+)\Z", re.S)


@dataclass(frozen=True, order=True, slots=True)
class StreamToken:
    """A position in the global stream ordering."""

    stream: int

    def __str__(self) -> str:
        return f"s{self.stream}"

    @classmethod
    def parse(cls, text: str) -> StreamToken:
        """Parse ``s<stream>``."""
        m = _STREAM.match(text)
        if not m:
            raise TokenError(f"bad stream token {text!r}: expected 's<integer>'")
        return cls(int(m.group(1)))


@dataclass(frozen=True, order=True, slots=True)
class TopologicalToken:
    """A point ``(depth, stream)`` in a room's topological order."""

    depth: int
    stream: int

    def __str__(self) -> str:
        return f"t{self.depth}-{self.stream}"

    @classmethod
    def parse(cls, text: str) -> TopologicalToken:
        """Parse ``t<depth>-<stream>``."""
        m = _TOPO.match(text)
        if not m:
            raise TokenError(f"bad topological token {text!r}: expected 't<depth>-<stream>'")
        return cls(int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True, slots=True)
class RoomsToken:
    """Where the next page of a user's recent rooms starts."""

    upto: int
    activity: int
    room_id: str

    def __str__(self) -> str:
        return f"r{self.upto}~{self.activity}~{self.room_id}"

    @classmethod
    def parse(cls, text: str) -> RoomsToken:
        """Parse ``r<upto>~<activity>~<room_id>``."""
        m = _ROOMS.match(text)
        if not m:
            raise TokenError(f"bad rooms token {text!r}: expected 'r<upto>~<activity>~<room_id>'")
        return cls(int(m.group(1)), int(m.group(2)), m.group(3))
