"""Cache invalidation over the ``caches`` stream.

Writer side: :class:`CacheInvalidator` turns ``invalidate(cache_name, keys)``
into a row of the caches stream (``[cache_func, keys, invalidation_ts]``,
``keys`` None for "the whole cache"). Reader side: :class:`CacheRegistry`
receives those rows (``follower.add_handler(registry.on_rows, "caches")``)
and invalidates caches registered by name; special names that stand for
several caches (Synapse's ``cs_cache_fake``, whose keys are ``[room_id,
*changed_members]``) expand through :meth:`CacheRegistry.register_special`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from ..streams.rows import CachesRow

__all__ = ["Invalidatable", "SimpleCache", "CacheRegistry", "CacheInvalidator", "CURRENT_STATE_CACHE_NAME"]

log = logging.getLogger(__name__)

#: Synapse's special name: invalidate the caches that depend on a room's current state.
CURRENT_STATE_CACHE_NAME = "cs_cache_fake"


class Invalidatable(Protocol):
    """What the registry needs from a cache."""

    def invalidate(self, key: Hashable) -> None: ...

    def invalidate_all(self) -> None: ...


class SimpleCache(dict[Hashable, Any]):
    """A dict with the two invalidation methods; keys are tuples like Synapse's."""

    def invalidate(self, key: Hashable) -> None:
        """Forget ``key``."""
        self.pop(key, None)

    def invalidate_all(self) -> None:
        """Forget everything."""
        self.clear()


class CacheRegistry:
    """Caches by name, invalidated from caches-stream rows."""

    def __init__(self) -> None:
        self._caches: dict[str, list[Invalidatable]] = {}
        self._special: dict[str, Callable[[Sequence[Any] | None], None]] = {}
        self.invalidations = 0

    def register(self, name: str, cache: Invalidatable) -> None:
        """Invalidate ``cache`` when rows for ``name`` arrive."""
        self._caches.setdefault(name, []).append(cache)

    def register_special(self, name: str, expand: Callable[[Sequence[Any] | None], None]) -> None:
        """``expand(keys)`` handles rows for the special ``name`` (it invalidates what it stands for)."""
        self._special[name] = expand

    def register_current_state(self, per_room: Sequence[str], per_member: Sequence[str] = ()) -> None:
        """Make ``cs_cache_fake`` invalidate caches keyed by room (and by (room, member) for changed members)."""

        def expand(keys: Sequence[Any] | None) -> None:
            if not keys:
                for name in (*per_room, *per_member):
                    self.invalidate(name, None)
                return
            room_id, members = keys[0], keys[1:]
            for name in per_room:
                self.invalidate(name, (room_id,))
            for name in per_member:
                for member in members:
                    self.invalidate(name, (member,))

        self.register_special(CURRENT_STATE_CACHE_NAME, expand)

    def invalidate(self, name: str, key: tuple[Any, ...] | None) -> None:
        """Invalidate ``key`` (None: everything) in the caches named ``name``."""
        special = self._special.get(name)
        if special is not None:
            special(None if key is None else list(key))
            return
        for cache in self._caches.get(name, ()):
            self.invalidations += 1
            if key is None:
                cache.invalidate_all()
            else:
                cache.invalidate(key)

    def on_rows(self, stream: str, writer: str, token: int, rows: list[Any]) -> None:
        """Follower handler for the ``caches`` stream."""
        for row in rows:
            if isinstance(row, CachesRow):
                name, keys = row.cache_func, row.keys
            else:
                name, keys = row[0], row[1]
            self.invalidate(name, None if keys is None else tuple(keys))


class CacheInvalidator:
    """Writer side: ``invalidate(name, keys)`` appends a caches-stream fact via ``write(rows) -> token``.

    ``write`` is whatever persists rows at one token: ``LocalStream.write``
    for an in-memory caches stream (the methods then return the token), or
    ``TableWriter(db, id_gen, caches_table).write`` for a database-backed one
    (the methods then return an awaitable of the token).
    """

    def __init__(self, write: Callable[[list[Any]], Any]) -> None:
        self._write = write

    def invalidate(self, cache_name: str, keys: Sequence[Any] | None) -> Any:
        """Invalidate ``keys`` (None: the whole cache) of ``cache_name`` on every reader."""
        return self._write([CachesRow(cache_name, None if keys is None else list(keys), int(time.time() * 1000))])

    def invalidate_many(self, items: Sequence[tuple[str, Sequence[Any] | None]]) -> Any:
        """Several invalidations as one fact (one token, batch rows on the wire)."""
        ts = int(time.time() * 1000)
        return self._write([CachesRow(n, None if k is None else list(k), ts) for n, k in items])
