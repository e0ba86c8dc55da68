"""The recent facts of in-memory streams, kept by their writer.

It lives here, not in :mod:`factstream.streams.sources` with the other
sources, because its rows are kept by the replication relay's window
(:class:`factstream.replication._relay.RowWindow`), compiled in a compiled build.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..streams.sources import Updates
from . import _relay

__all__ = ["MemoryUpdateSource"]


class MemoryUpdateSource:
    """The recent facts of in-memory streams, kept by the writer (bounded per stream).

    The writer calls ``add(instance_name, token, row)`` for each row *before*
    completing its token; rows older than ``capacity`` are forgotten, and a
    request reaching below the window raises :class:`UpdatesUnavailable` so a
    reader knows it lost facts instead of silently skipping them. Holes
    (tokens without rows) need no record. ``get_updates_now`` is the
    synchronous :meth:`get_updates` (the writer's hot path).

    The rows live in a :class:`factstream.replication._relay.RowWindow` (compiled in a
    compiled build; ``relay`` picks the twin, default the active one), whose
    ``add`` and ``get_updates_now`` are this source's, without a Python call
    in between.
    """

    #: ``add(instance_name, token, row)``: record a row (tokens non-decreasing, except out-of-order completions).
    add: Callable[[str, int, Any], None]
    #: ``get_updates_now(instance_name, from_token, upto_token, limit)``: :meth:`get_updates`, synchronously.
    get_updates_now: Callable[[str, int, int, int], Updates]

    def __init__(self, capacity: int = 100_000, *, relay: ModuleType | None = None) -> None:
        if relay is None:
            relay = _relay
        self.window = relay.RowWindow(capacity)
        self.add = self.window.add
        self.get_updates_now = self.window.get_updates_now

    @property
    def capacity(self) -> int:
        """Rows kept per writer instance (up to twice as many before the oldest are dropped)."""
        return int(self.window.capacity)

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.window.capacity = value

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        return self.get_updates_now(instance_name, from_token, upto_token, limit)
