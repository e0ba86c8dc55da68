"""State groups stored as delta chains with logarithmic length.

Why this shape: storing each group's full state costs (changes x room size);
storing each as a delta on its parent makes reading the full state walk an
unbounded chain. Here every group has a ``height`` (its parent's + 1) and is
stored as a delta against the ancestor at height ``height & (height - 1)``
(its height with the lowest set bit cleared; 0 means "against the empty
state"), the skip-list trick of binary counters. Reading a full state then
visits at most popcount(height) <= 64 groups (14 for 10,000 changes), while a
group's delta holds about ``lowbit(height)`` changes: total storage is
O(changes x log(changes)), independent of the room's size.

Groups are immutable once committed, so their full states are cached in
memory (small LRU) keyed by id.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from .resolver import StateKey, StateMap

__all__ = ["base_height", "StateGroupStore", "EMPTY"]

EMPTY: StateMap = {}

_CHAIN_SQL = (
    "WITH RECURSIVE chain(id, base, h) AS ("
    " SELECT id, base_group, height FROM state_groups WHERE id = ?"
    " UNION ALL SELECT g.id, g.base_group, g.height FROM state_groups g JOIN chain c ON g.id = c.base)"
)


def base_height(height: int) -> int:
    """Height of the ancestor a group at ``height`` is stored against."""
    return height & (height - 1)


class StateGroupStore:
    """Reads and writes state groups inside the caller's transaction."""

    def __init__(self, cache_size: int = 64) -> None:
        self._cache: OrderedDict[int, StateMap] = OrderedDict()
        self._meta: dict[int, tuple[int, str]] = {}  # id -> (height, history_visibility)
        self._chains: dict[int, list[tuple[int, int | None, int]]] = {}  # id -> its base chain
        self._cache_size = cache_size

    def forget(self) -> None:
        """Drop every cached group (after a rollback ids may be reused)."""
        self._cache.clear()
        self._meta.clear()
        self._chains.clear()

    async def meta(self, txn: Any, group: int) -> tuple[int, str]:
        """``(height, history_visibility)`` of ``group``."""
        m = self._meta.get(group)
        if m is None:
            row = await txn.fetchone("SELECT height, history_visibility FROM state_groups WHERE id = ?", (group,))
            if row is None:
                raise LookupError(f"state group {group} does not exist")
            m = (int(row[0]), str(row[1]))
            self._meta[group] = m
        return m

    async def full_state(self, txn: Any, group: int | None) -> StateMap:
        """The complete state of ``group`` (None is the empty state). Do not mutate."""
        if group is None:
            return EMPTY
        cached = self._cache.get(group)
        if cached is not None:
            self._cache.move_to_end(group)
            return cached
        chain = await self._chain(txn, group, 0)
        state = await self._deltas(txn, chain)
        self._cache[group] = state
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return state

    async def lookup(self, txn: Any, group: int | None, keys: Iterable[StateKey]) -> StateMap:
        """The entries of ``group`` for ``keys`` only (without reading the full state)."""
        keys = list(keys)
        if group is None or not keys:
            return {}
        cached = self._cache.get(group)
        if cached is not None:
            return {k: cached[k] for k in keys if k in cached}
        chain = await self._chain(txn, group, 0)
        heights = {gid: h for gid, _, h in chain}
        ids = list(heights)
        by_type: dict[str, list[str]] = {}
        for t, sk in keys:
            by_type.setdefault(t, []).append(sk)
        out: dict[StateKey, tuple[int, str]] = {}
        for t, sks in by_type.items():
            for i in range(0, len(sks), 400):
                chunk = sks[i : i + 400]
                rows = await txn.fetchall(
                    "SELECT state_group, state_key, event_id FROM state_group_deltas WHERE type = ?"
                    f" AND state_key IN ({','.join('?' * len(chunk))})"
                    f" AND state_group IN ({','.join('?' * len(ids))})",
                    (t, *chunk, *ids),
                )
                for gid, sk, ev in rows:
                    h = heights[int(gid)]
                    if (t, sk) not in out or h > out[(t, sk)][0]:
                        out[(t, sk)] = (h, ev)
        return {k: v[1] for k, v in out.items()}

    async def _chain(self, txn: Any, group: int, above: int) -> list[tuple[int, int | None, int]]:
        """``(id, base, height)`` from ``group`` down its base chain, keeping heights > ``above``."""
        chain = self._chains.get(group)
        if chain is None:
            rows = await txn.fetchall(_CHAIN_SQL + " SELECT id, base, h FROM chain", (group,))
            chain = [(int(r[0]), None if r[1] is None else int(r[1]), int(r[2])) for r in rows]
            if len(self._chains) > 50_000:
                self._chains.clear()
            self._chains[group] = chain
        return [c for c in chain if c[2] > above]

    async def _deltas(self, txn: Any, chain: list[tuple[int, int | None, int]]) -> StateMap:
        """Merge the deltas of ``chain``'s groups, the highest group winning."""
        if not chain:
            return {}
        heights = {gid: h for gid, _, h in chain}
        rows = await txn.fetchall(
            "SELECT state_group, type, state_key, event_id FROM state_group_deltas"
            f" WHERE state_group IN ({','.join('?' * len(chain))})",
            list(heights),
        )
        return _merge_by_height((heights[int(r[0])], r[1], r[2], r[3]) for r in rows)

    async def create(
        self,
        txn: Any,
        room_id: str,
        parent: int | None,
        changes: Mapping[StateKey, str],
        history_visibility: str,
    ) -> int:
        """A new group: ``parent``'s state with ``changes`` applied."""
        height = (await self.meta(txn, parent))[0] + 1 if parent is not None else 1
        target = base_height(height)
        delta: StateMap = {}
        base: int | None = None
        if parent is not None:
            # Everything that changed between the base (height == target) and
            # the parent lies on the parent's base chain above the target.
            # Only the groups strictly above the target height, plus the base
            # itself (found as the base of the lowest of them or the parent).
            chain = await self._chain(txn, parent, target)
            delta = await self._deltas(txn, chain)
            if target > 0:
                # the base is the base of the lowest group above the target (or the parent itself)
                base = min(chain, key=lambda c: c[2])[1] if chain else parent
        delta.update(changes)
        row = await txn.fetchone(
            "UPDATE event_store_counters SET value = value + 1 WHERE name = 'state_group' RETURNING value"
        )
        assert row is not None
        group = int(row[0])
        await txn.execute(
            "INSERT INTO state_groups (id, room_id, base_group, height, history_visibility) VALUES (?, ?, ?, ?, ?)",
            (group, room_id, base, height, history_visibility),
        )
        if delta:
            await txn.executemany(
                "INSERT INTO state_group_deltas (state_group, type, state_key, event_id) VALUES (?, ?, ?, ?)",
                [(group, t, sk, ev) for (t, sk), ev in delta.items()],
            )
        self._meta[group] = (height, history_visibility)
        if base is None:
            self._chains[group] = [(group, None, height)]
        elif base in self._chains:
            self._chains[group] = [(group, base, height), *self._chains[base]]
        return group


def _merge_by_height(rows: Iterable[tuple[Any, ...]]) -> StateMap:
    """Merge delta rows ``(height, type, state_key, event_id, ...)``: the highest group wins."""
    best: dict[StateKey, tuple[int, str]] = {}
    for r in rows:
        h, key, ev = int(r[0]), (r[1], r[2]), r[3]
        cur = best.get(key)
        if cur is None or h > cur[0]:
            best[key] = (h, ev)
    return {k: v[1] for k, v in best.items()}
