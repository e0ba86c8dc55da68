"""replication.written.WrittenRows: committed rows answered from memory, anything not recorded whole from the table."""

from __future__ import annotations

from typing import Any

import pytest

from factstream.replication.written import WrittenRows
from factstream.streams.sources import Updates


class Table:
    """A stand-in for the table's source that says what it was asked (the real one is tested with serve)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int, int]] = []

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        self.asked.append((instance_name, from_token, upto_token, limit))
        return [(upto_token, ["from the table"])], upto_token, False


async def test_a_range_recorded_whole_comes_from_memory_in_pages() -> None:
    table = Table()
    src = WrittenRows(table, "w1")
    src.record(2, 5, [(2, ["a"]), (2, ["b"]), (4, ["c"])])  # 3 and 5: holes (rolled back, empty)
    src.record(6, 9, [(6, ["d"]), (9, ["e"]), (9, ["f"])])
    assert await src.get_updates("w1", 1, 9, 100) == ([(2, ["a"]), (2, ["b"]), (4, ["c"]), (6, ["d"]), (9, ["e"]), (9, ["f"])], 9, False)
    assert await src.get_updates("w1", 1, 9, 3) == ([(2, ["a"]), (2, ["b"]), (4, ["c"])], 4, True)  # never splits a token
    assert await src.get_updates("w1", 4, 7, 100) == ([(6, ["d"])], 7, False)
    assert await src.get_updates("w1", 3, 4, 100) == ([(4, ["c"])], 4, False)
    assert table.asked == []
    assert src.from_memory == 4


@pytest.mark.parametrize(
    ("recorded", "ask"),
    [
        ([(2, 5)], (0, 5)),  # token 1 was not recorded (before this writer's first record)
        ([(2, 5)], (1, 6)),  # token 6 not recorded yet
        ([(2, 5), (8, 9)], (1, 9)),  # 6 and 7 not recorded (another writer's ids, or a transaction cut off)
    ],
)
async def test_anything_not_recorded_whole_is_read_from_the_table(recorded: list[tuple[int, int]], ask: tuple[int, int]) -> None:
    table = Table()
    src = WrittenRows(table, "w1")
    for first, last in recorded:
        src.record(first, last, [(first, ["x"])])
    assert await src.get_updates("w1", *ask, 100) == ([(ask[1], ["from the table"])], ask[1], False)
    assert table.asked == [("w1", *ask, 100)]


async def test_other_writers_and_forgotten_rows_go_to_the_table() -> None:
    table = Table()
    src = WrittenRows(table, "w1", capacity=3)
    src.record(2, 3, [(2, ["a"]), (3, ["b"])])
    assert (await src.get_updates("w2", 1, 3, 10))[0] == [(3, ["from the table"])]  # another writer's rows
    src.record(4, 5, [(4, ["c"]), (5, ["d"])])  # over capacity: 2..3 forgotten
    assert (await src.get_updates("w1", 1, 5, 10))[0] == [(5, ["from the table"])]
    assert await src.get_updates("w1", 3, 5, 10) == ([(4, ["c"]), (5, ["d"])], 5, False)
    src.record(5, 6, [(6, ["e"])])  # overlaps what was recorded: neither record holds, the table answers
    assert await src.get_updates("w1", 3, 6, 10) == ([(6, ["from the table"])], 6, False)
    assert await src.get_updates("w1", 4, 6, 10) == ([(6, ["from the table"])], 6, False)  # 5 may be d's
    src.record(7, 8, [(7, ["f"])])  # in order again: from memory
    assert await src.get_updates("w1", 6, 8, 10) == ([(7, ["f"])], 8, False)
    with pytest.raises(ValueError):
        src.record(9, 8, [])


@pytest.mark.parametrize("order", ["as reserved", "reversed"])
async def test_interleaved_records_go_to_the_table(order: str) -> None:
    """Two transactions of one writer whose ids interleave (two fetches in flight from one sequence):
    each range holds the other's ids, so neither may answer for it (serve once lost 2, 4, ... this way)."""
    table = Table()
    src = WrittenRows(table, "w1")
    records = [(1, 5, [(1, ["a"]), (3, ["b"]), (5, ["c"])]), (2, 6, [(2, ["d"]), (4, ["e"]), (6, ["f"])])]
    for first, last, rows in records if order == "as reserved" else records[::-1]:
        src.record(first, last, rows)
    for ask in ((0, 6), (1, 6), (0, 5)):
        assert await src.get_updates("w1", *ask, 100) == ([(ask[1], ["from the table"])], ask[1], False)
    assert src.from_memory == 0


async def test_published_ranges_are_forgotten() -> None:
    src = WrittenRows(Table(), "w1")
    for first in range(2, 2000, 10):
        src.record(first, first + 9, [(first, [first])])
    await src.get_updates("w1", 1001, 1999, 10_000)
    assert src._rows == 100  # noqa: SLF001 - ranges at or below 1001 are gone (only requests above follow)
    assert await src.get_updates("w1", 1991, 2001, 10) == ([(1992, [1992])], 2001, False)
    rows: Any = (await src.get_updates("w1", 1991, 2005, 10))[0]
    assert rows == [(2005, ["from the table"])]  # 2002..2005 were never recorded
