"""Update sources: paging without splitting a token, bounded memory windows, tables."""

from __future__ import annotations

import sqlite3

import pytest

from factstream.streams import TableUpdateSource, UpdatesUnavailable

from factstream.replication import MemoryUpdateSource
from factstream.streams.sources import page


def test_page_never_splits_a_token() -> None:
    ups = [(1, "a"), (2, "b"), (2, "c"), (2, "d"), (3, "e")]
    assert page(ups, 10, 2) == ([(1, "a"), (2, "b"), (2, "c"), (2, "d")], 2, True)
    assert page(ups, 10, 5) == (ups, 10, False)
    assert page(ups, 10, 4) == (ups[:4], 2, True)
    assert page(ups, 10, 3) == (ups[:4], 2, True)


def test_page_refuses_a_limit_below_one() -> None:
    # limit 0 read updates[-1]: "cut at the last token" with no rows, and a writer jumped over them.
    ups = [(1, "a"), (2, "b"), (3, "c")]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="page limit must be at least 1"):
            page(ups, 10, bad)
    with pytest.raises(TypeError, match="page limit must be a whole number"):
        page(ups, 10, 1.5)  # type: ignore[arg-type]
    assert page(ups, 10, 1) == ([(1, "a")], 1, True)


async def test_memory_source_refuses_a_limit_below_one() -> None:
    src = MemoryUpdateSource()
    for t in range(1, 11):
        src.add("w", t, [t])
    with pytest.raises(ValueError, match="page limit must be at least 1"):
        await src.get_updates("w", 5, 10, 0)


async def test_memory_source_pages_and_window() -> None:
    src = MemoryUpdateSource(capacity=10)
    for t in range(1, 31):
        src.add("w", t, [t])
    with pytest.raises(UpdatesUnavailable, match="no longer in memory"):
        await src.get_updates("w", 0, 30, 5)
    ups, upto, limited = await src.get_updates("w", 25, 30, 3)
    assert ups == [(26, [26]), (27, [27]), (28, [28])] and upto == 28 and limited
    assert await src.get_updates("other", 0, 9, 3) == ([], 9, False)


class _SyncDb:
    """A minimal stand-in for factstream.store.database (sync fetchall with ? placeholders)."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:")

    def fetchall(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        return self.conn.execute(sql, params).fetchall()


async def test_table_source_pages_by_token() -> None:
    db = _SyncDb()
    db.conn.execute("CREATE TABLE t (stream_id INTEGER, instance_name TEXT, user_id TEXT)")
    rows = [(1, "w", "a"), (2, "w", "b"), (2, "w", "c"), (2, "w", "d"), (3, "w", "e"), (4, "x", "z"), (6, "w", "f")]
    db.conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    src = TableUpdateSource(db, "t", ["user_id"])
    ups, upto, limited = await src.get_updates("w", 0, 10, 2)
    assert ups == [(1, ["a"]), (2, ["b"]), (2, ["c"]), (2, ["d"])] and upto == 2 and limited
    ups, upto, limited = await src.get_updates("w", 2, 10, 2)
    assert ups == [(3, ["e"]), (6, ["f"])] and upto == 10 and not limited
    ups, upto, limited = await src.get_updates("w", 0, 1, 2)
    assert ups == [(1, ["a"])] and upto == 1 and not limited


async def test_table_source_backwards_ids_give_positive_tokens() -> None:
    db = _SyncDb()
    db.conn.execute("CREATE TABLE b (stream_ordering INTEGER, instance_name TEXT, event_id TEXT)")
    db.conn.executemany("INSERT INTO b VALUES (?, ?, ?)", [(-2, "w", "$a"), (-3, "w", "$b"), (-3, "w", "$c"), (-5, "w", "$d")])
    src = TableUpdateSource(db, "b", ["event_id"], id_column="stream_ordering", backwards=True)
    ups, upto, limited = await src.get_updates("w", 1, 10, 10)
    assert ups == [(2, ["$a"]), (3, ["$b"]), (3, ["$c"]), (5, ["$d"])] and upto == 10 and not limited
    ups, upto, limited = await src.get_updates("w", 2, 10, 1)
    assert [u[0] for u in ups] == [3, 3] and upto == 3 and limited


async def test_table_source_refuses_a_limit_below_one() -> None:
    db = _SyncDb()
    db.conn.execute("CREATE TABLE t (stream_id INTEGER, instance_name TEXT, user_id TEXT)")
    db.conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(1, "w", "a"), (2, "w", "b"), (2, "w", "c")])
    src = TableUpdateSource(db, "t", ["user_id"])
    for bad in (0, -1):
        with pytest.raises(ValueError, match="page limit must be at least 1"):
            await src.get_updates("w", 0, 10, bad)
