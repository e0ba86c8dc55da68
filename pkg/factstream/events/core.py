"""The shared state of an event store: database, id generators, caches and reader positions.

The store is split by job (``persist``, ``state``, ``queries``); each part is a mixin over
this core, and :class:`~factstream.events.store.EventStore` joins them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..ids import StreamChangeCache
from .records import PersistedEvent
from .resolver import DepthResolver, StateResolver
from .state_groups import StateGroupStore


def _make_change_cache(name: str, pos: int, size: int) -> Any:
    return StreamChangeCache(name, pos, max_size=size)


class StoreCore:
    """The state every part of :class:`~factstream.events.store.EventStore` shares (set up here, once)."""

    def __init__(
        self,
        db: Any,
        *,
        instance_name: str = "master",
        writer: bool = True,
        resolver: StateResolver | None = None,
        stream_id_gen: Any = None,
        backfill_id_gen: Any = None,
        change_cache_size: int = 100_000,
    ) -> None:
        self.db = db
        self.instance_name = instance_name
        self.writer = writer
        self.resolver: StateResolver = resolver or DepthResolver()
        self.stream_id_gen = stream_id_gen
        self.backfill_id_gen = backfill_id_gen
        self.groups = StateGroupStore()
        self._room_locks: dict[str, asyncio.Lock] = {}
        self._membership_cache: dict[str, str | None] = {}
        self._change_cache_size = change_cache_size
        self.room_changes: Any = None
        self.membership_changes: Any = None
        self._reader_positions: dict[str, int] = {}
        self._rooms_for_user: dict[str, tuple[int, dict[str, tuple[str | None, int]]]] = {}
        self._listeners: list[Callable[[list[PersistedEvent]], Any]] = []
        self._own_gens: list[Any] = []
        # close() refuses new persists and waits for those running (so their ids complete and
        # their positions are recorded before the generators close).
        self._closed = False
        self._persisting = 0
        self._persists_done = asyncio.Event()
        self._persists_done.set()
        # Writer-owned rooms: committed extremities and visibility cursors, so a
        # persist need not read them back (dropped wholesale on any rollback).
        self._ext_cache: dict[str, frozenset[str]] = {}
        self._cursor_cache: dict[tuple[str, str], Any] = {}
        #: Writer: a ``CacheInvalidator`` told about current-state changes (``cs_cache_fake``).
        self.cache_invalidator: Any = None
        #: Reader: returns the events stream position this process has been told about.
        self.position_fn: Callable[[], int | None] | None = None

    def current_token(self) -> int:
        """Stream position up to which this process answers (writer: all completed)."""
        if self.writer:
            gen = self.stream_id_gen
            tok = gen.current_token() if hasattr(gen, "current_token") else gen.get_current_token()
            return int(tok)
        if self.position_fn is not None:
            pos = self.position_fn()
            if pos is not None:
                return pos
        return min(self._reader_positions.values()) if self._reader_positions else 0
