"""A writer whose stream goes back, and every dropped row counted (issue 11, items 1 and 10).

The follower runs on both relay twins (``relay_impl``) and is fed both ways a
transport feeds it: one RDATA at a time and whole runs (``on_rdata_many``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import REGISTRY

from factstream.commands import Command, PositionCommand, RdataCommand
from factstream.replication import Follower
from factstream.replication.droplog import DropLog


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def feed(fol: Follower, cmds: Sequence[Command], many: bool) -> None:
    """Hand ``cmds`` to the follower as a transport would: runs of RDATA at once (``many``) or one by one."""
    run: list[RdataCommand] = []
    for cmd in cmds:
        if isinstance(cmd, RdataCommand):
            if many:
                run.append(cmd)
            else:
                fol.on_rdata(cmd)
            continue
        if run:
            fol.on_rdata_many(run)
            run = []
        assert isinstance(cmd, PositionCommand)
        fol.on_position(cmd)
    if run:
        fol.on_rdata_many(run)


def typing(token: int, room: str = "!r:hs") -> RdataCommand:
    return RdataCommand("typing", "worker1", token, [room, [f"@u{token}:hs"]])


@pytest.fixture(params=[False, True], ids=["one-by-one", "runs"])
def many(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def recorder(fol: Follower) -> list[tuple[str, str, int, int]]:
    got: list[tuple[str, str, int, int]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((s, w, t, len(rows))))
    return got


async def test_in_memory_stream_reset_by_a_restarted_writer_delivers_every_row(
    relay_impl: ModuleType, many: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: at 84, the restarted writer says ``POSITION typing worker1 0 0`` then sends 1..22."""
    fol = Follower(relay=relay_impl)
    got = recorder(fol)
    resets: list[tuple[str, str, int, int]] = []
    fol.add_reset_handler(lambda *a: resets.append(a))
    before = sample("factstream_stream_resets_total", stream="typing", kind="in_memory")
    feed(fol, [PositionCommand("typing", "worker1", 0, 0), *[typing(t) for t in range(1, 85)]], many)
    assert fol.position("typing", "worker1") == 84 and len(got) == 84
    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        feed(fol, [PositionCommand("typing", "worker1", 0, 0), *[typing(t) for t in range(1, 23)]], many)
    assert resets == [("typing", "worker1", 84, 0)]
    assert [t for _, _, t, _ in got[84:]] == list(range(1, 23))
    assert fol.position("typing", "worker1") == 22
    assert fol.stats["stale_rows"] == 0 and fol.stats["resets"] == 1
    warned = [r for r in caplog.records if "went backwards" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING
    assert "typing/worker1" in warned[0].getMessage() and "84" in warned[0].getMessage()
    assert sample("factstream_stream_resets_total", stream="typing", kind="in_memory") == before + 1


async def test_reset_handler_runs_before_the_first_row_after_the_reset(relay_impl: ModuleType, many: bool) -> None:
    fol = Follower(relay=relay_impl, positions={("presence_federation", "w"): 10})
    events: list[Any] = []
    fol.add_handler(lambda s, w, t, rows: events.append(("rows", t)))
    fol.add_reset_handler(lambda s, w, old, new: events.append(("reset", old, new)), "presence_federation")
    fol.add_reset_handler(lambda *a: events.append(("other stream", a)), "typing")
    row = ["@u:hs", ["remote.example"]]
    feed(fol, [PositionCommand("presence_federation", "w", 3, 3), RdataCommand("presence_federation", "w", 4, row)], many)
    assert events == [("reset", 10, 3), ("rows", 4)]


async def test_table_backed_stream_going_back_is_an_error_with_a_metric_and_a_reset(
    relay_impl: ModuleType, many: bool, caplog: pytest.LogCaptureFixture
) -> None:
    fol = Follower(relay=relay_impl, typed=False)
    got = recorder(fol)
    resets: list[Any] = []
    fol.add_reset_handler(lambda *a: resets.append(a))
    before = sample("factstream_stream_resets_total", stream="caches", kind="table")
    row = ["get_user", ["@a:hs"], 1]
    feed(fol, [PositionCommand("caches", "master", 100, 100), RdataCommand("caches", "master", 101, row)], many)
    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        # The database was restored to 50: the writer reuses the ids after it.
        feed(fol, [PositionCommand("caches", "master", 50, 50), RdataCommand("caches", "master", 51, row)], many)
    assert resets == [("caches", "master", 101, 50)]
    assert [t for _, _, t, _ in got] == [101, 51]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    msg = errors[0].getMessage()
    assert "caches/master" in msg and "101" in msg and "50" in msg and "went backwards" in msg
    assert sample("factstream_stream_resets_total", stream="caches", kind="table") == before + 1


async def test_stale_rows_are_counted_and_their_warning_summary_comes_on_a_timer(
    relay_impl: ModuleType, many: bool, caplog: pytest.LogCaptureFixture
) -> None:
    fol = Follower(relay=relay_impl, typed=False)
    fol.drops.interval = 0.2
    before = sample("factstream_dropped_rows_total", stream="typing", why="stale")
    feed(fol, [PositionCommand("typing", "worker1", 50, 50)], many)
    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        # A restart announced by nothing: Synapse drops these too, but here each is counted and reported.
        for t in range(1, 31):
            feed(fol, [typing(t)], many)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "stale" in lines[0]
        await asyncio.sleep(0.4)  # nothing else arrives: the summary must come by itself
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "29 more suppressed" in lines[1] and "(29 rows)" in lines[1]
    assert sample("factstream_dropped_rows_total", stream="typing", why="stale") == before + 30
    assert fol.drops.counts[("typing", "stale")] == 30


async def test_rows_before_any_position_and_broken_batches_are_counted(relay_impl: ModuleType, many: bool) -> None:
    fol = Follower(relay=relay_impl, typed=False)
    before = sample("factstream_dropped_rows_total", stream="typing", why="unknown_position")
    feed(fol, [typing(1), typing(2)], many)
    assert sample("factstream_dropped_rows_total", stream="typing", why="unknown_position") == before + 2
    feed(fol, [PositionCommand("typing", "worker1", 2, 2)], many)
    conn = object()
    fol.on_rdata(RdataCommand("typing", "worker1", None, ["!r:hs", []]), conn)
    fol.on_rdata(RdataCommand("typing", "worker1", None, ["!s:hs", []]), conn)
    before = sample("factstream_dropped_rows_total", stream="typing", why="broken_batch")
    fol.connection_lost(conn)
    assert sample("factstream_dropped_rows_total", stream="typing", why="broken_batch") == before + 2


def test_drop_log_burst_without_a_loop_is_summarised_by_the_next_line_or_flush(caplog: pytest.LogCaptureFixture) -> None:
    drops = DropLog(logging.getLogger("factstream.test.droplog"), interval=60)
    with caplog.at_level(logging.WARNING, "factstream.test.droplog"):
        for i in range(2008):
            drops.dropped("bad_message", 1, "", "bad message %d", i)
        drops.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["bad message 0", "2007 more suppressed in the last 60s (2007 rows); counted in factstream_dropped_rows"]


async def test_drop_log_timer_summary_and_the_next_window(caplog: pytest.LogCaptureFixture) -> None:
    drops = DropLog(logging.getLogger("factstream.test.droplog2"), interval=0.1)
    with caplog.at_level(logging.WARNING, "factstream.test.droplog2"):
        for i in range(5):
            drops.log("line %d", i)
        await asyncio.sleep(0.25)
        assert [r.getMessage() for r in caplog.records][1].startswith("4 more suppressed")
        await asyncio.sleep(0.15)
        drops.log("later")
    assert [r.getMessage() for r in caplog.records][-1] == "later"
    assert len(caplog.records) == 3


class _Interrupted(BaseException):
    """Not an Exception: the catch-up's retry loop does not catch it."""


class _StuckSource:
    """A source whose fetch never returns and that fails when cancelled (a bug to be reported, not swallowed)."""

    async def get_updates(self, instance: str, start: int, upto: int, limit: int) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise _Interrupted("source broke while cancelled") from None
        raise AssertionError("unreachable")


async def test_close_reports_a_failed_catch_up_instead_of_swallowing_it(
    relay_impl: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    fol = Follower(relay=relay_impl, sources={"typing": _StuckSource()}, positions={("typing", "w"): 1})
    fol.on_position(PositionCommand("typing", "w", 5, 5))
    await asyncio.sleep(0.01)
    assert fol.is_catching_up("typing", "w")
    with caplog.at_level(logging.ERROR, "factstream.replication.follower"):
        await fol.close()
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert "source broke while cancelled" in str(failed[0].exc_info[1])


class _BrokenSource:
    async def get_updates(self, instance: str, start: int, upto: int, limit: int) -> Any:
        raise _Interrupted("not an Exception: escapes the retry loop")


async def test_a_catch_up_that_dies_is_reported_and_does_not_stall_the_stream(
    relay_impl: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    fol = Follower(relay=relay_impl, sources={"typing": _BrokenSource()}, positions={("typing", "w"): 1}, typed=False)
    got = recorder(fol)
    with caplog.at_level(logging.ERROR, "factstream.replication.follower"):
        fol.on_position(PositionCommand("typing", "w", 5, 5))
        fol.on_rdata(RdataCommand("typing", "w", 6, ["!r:hs", []]))
        for _ in range(20):
            await asyncio.sleep(0.01)
            if got:
                break
    assert [t for _, _, t, _ in got] == [6]
    assert any("catch-up failed" in r.getMessage() for r in caplog.records)
    await fol.close()


async def test_a_start_position_past_the_writer_is_said_as_such_not_as_a_restore(
    relay_impl: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    """``tail --from 99`` on a writer at 5: the follower assumed 99; the writer's POSITIONs below it are not a
    position gone backwards (no ERROR blaming a database restore): a warning saying so, then rows after 5."""
    fol = Follower(relay=relay_impl, start_position=99)
    got = recorder(fol)
    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        feed(fol, [PositionCommand("typing", "worker1", 5, 5), PositionCommand("typing", "worker1", 5, 5),
                   typing(6), typing(7)], False)
    assert [t for _, _, t, _ in got] == [6, 7] and fol.position("typing", "worker1") == 7
    said = [r for r in caplog.records if r.name == "factstream.replication.follower"]
    assert not [r for r in said if r.levelno >= logging.ERROR], [r.getMessage() for r in said]
    assert any(r.levelno == logging.WARNING and "start position 99 is past the writer's position 5" in r.getMessage()
               for r in said)
    # a position gone back after the writer was heard is still one
    caplog.clear()
    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        feed(fol, [PositionCommand("typing", "worker1", 2, 2)], False)
    assert any("went backwards from 7 to 2" in r.getMessage() for r in caplog.records)
