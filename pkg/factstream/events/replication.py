"""Wiring the event store into replication: the events stream and cache invalidation.

Writer: :func:`attach_writer` publishes the events stream from the store's
tables whenever the events id generator's position advances, and (optionally)
sends ``cs_cache_fake`` invalidations on the caches stream when a room's
current state changes. Reader: :func:`attach_reader` lets the follower catch
up from the shared database, feeds events rows into the store's
stream-change caches, makes the store answer only up to the follower's
position, and registers the store's membership cache for invalidation.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from .source import EventsStreamSource
from .store import EventStore

__all__ = ["attach_writer", "attach_reader", "RoomsForUserCache", "EVENTS_STREAM"]

EVENTS_STREAM = "events"


def attach_writer(store: EventStore, publisher: Any, *, cache_invalidator: Any = None) -> EventsStreamSource:
    """Publish ``store``'s events stream through ``publisher`` (a ``replication.Publisher``)."""
    source = EventsStreamSource(store.db)
    publisher.add_stream(EVENTS_STREAM, source, store.current_token())
    store.stream_id_gen.add_listener(publisher.notify)
    if cache_invalidator is not None:
        store.cache_invalidator = cache_invalidator
    return source


class RoomsForUserCache:
    """Adapter so a ``CacheRegistry`` can invalidate the store's per-user membership cache."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    def invalidate(self, key: Hashable) -> None:
        self._store.invalidate_rooms_for_user(key)

    def invalidate_all(self) -> None:
        self._store._rooms_for_user.clear()


def attach_reader(store: EventStore, follower: Any, *, caches: Any = None, writers: tuple[str, ...] = ("master",)) -> None:
    """Make reader ``store`` follow the events stream of ``writers`` through ``follower``."""
    follower.sources.setdefault(EVENTS_STREAM, EventsStreamSource(store.db))

    def on_rows(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        store.on_events_rows(writer, token, rows)

    follower.add_handler(on_rows, EVENTS_STREAM)

    def position() -> int | None:
        known = [follower.position(EVENTS_STREAM, w) for w in writers]
        if any(p is None for p in known):
            return 0
        return min(int(p) for p in known if p is not None)

    store.position_fn = position
    if caches is not None:
        caches.register("get_rooms_for_user", RoomsForUserCache(store))
        caches.register_current_state(per_room=[], per_member=["get_rooms_for_user"])
