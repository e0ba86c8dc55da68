"""The replication relay's hot loops, on both twins (``relay_impl`` is parametrised over c and py).

The pure twin is the specification; differential tests check that the
compiled twin gives the same commands, facts and errors, and that a follower
fed runs of RDATA (``on_rdata_many``) delivers exactly what one ``on_rdata``
per command delivers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import twin
from factstream import wire
from factstream.commands import Command, PingCommand, PositionCommand, RdataCommand, ReplicateCommand
from factstream.replication import Follower
from factstream.streams import UpdatesUnavailable
from factstream.replication import MemoryUpdateSource
from factstream.streams.rows import CachesRow

# ---------------------------------------------------------------- RowWindow


def test_row_window_hot_path_pages_and_out_of_order(relay_impl: ModuleType) -> None:
    win = relay_impl.RowWindow(100)
    assert win.get_updates_now("w", 0, 5, 10) == ([], 5, False)
    win.add("w", 1, ["a"])
    assert win.get_updates_now("w", 0, 1, 10) == ([(1, ["a"])], 1, False)  # the row just added
    win.add("w", 2, ["b"])
    win.add("w", 2, ["c"])
    win.add("w", 4, ["e"])
    win.add("w", 3, ["d"])  # completes after 4: kept in token order
    win.add("other", 9, ["x"])
    assert win.get_updates_now("w", 0, 4, 10) == ([(1, ["a"]), (2, ["b"]), (2, ["c"]), (3, ["d"]), (4, ["e"])], 4, False)
    assert win.get_updates_now("w", 1, 3, 10) == ([(2, ["b"]), (2, ["c"]), (3, ["d"])], 3, False)
    # a page never splits a token: limit 2 ends after token 2 (three rows)
    assert win.get_updates_now("w", 0, 4, 2) == ([(1, ["a"]), (2, ["b"]), (2, ["c"])], 2, True)
    assert win.get_updates_now("other", 0, 10, 10) == ([(9, ["x"])], 10, False)
    assert win.get_updates_now("nobody", 3, 7, 10) == ([], 7, False)


def test_row_window_forgets_old_rows_and_says_so(relay_impl: ModuleType) -> None:
    win = relay_impl.RowWindow(3)
    for t in range(1, 8):
        win.add("w", t, [t])  # 7 > 2 * 3: keeps the last 3, floor 4
    assert win.get_updates_now("w", 4, 7, 10) == ([(5, [5]), (6, [6]), (7, [7])], 7, False)
    with pytest.raises(UpdatesUnavailable, match="after 2 are no longer in memory"):
        win.get_updates_now("w", 2, 7, 10)
    win.capacity = 10
    assert win.capacity == 10


def test_memory_source_uses_the_chosen_twin(relay_impl: ModuleType) -> None:
    src = MemoryUpdateSource(capacity=5, relay=relay_impl)
    assert type(src.window) is relay_impl.RowWindow and src.capacity == 5
    src.add("w", 1, ["a"])
    assert asyncio.run(src.get_updates("w", 0, 2, 10)) == ([(1, ["a"])], 2, False)


# ---------------------------------------------------------------- StreamEmitter


def _lines(cmds: list[Command]) -> list[str]:
    return [wire.encode(c).decode() for c in cmds]


def test_emitter_rows_batches_and_positions(relay_impl: ModuleType) -> None:
    em = relay_impl.StreamEmitter("caches", "m", None, 0, None, [], 100)
    assert _lines(em.commands([(1, ["a"])], 1)) == ['RDATA caches m 1 ["a"]']
    assert (em.sent, em.rows) == (1, 1)
    # a row at or below sent is skipped (already published); several rows at one token are a batch;
    # a range ending past its last row is closed with POSITION
    ups = [(1, ["old"]), (3, ["b"]), (3, ["c"]), (4, ["d"])]
    assert _lines(em.commands(ups, 6)) == [
        'RDATA caches m batch ["b"]',
        'RDATA caches m 3 ["c"]',
        'RDATA caches m 4 ["d"]',
        "POSITION caches m 4 6",
    ]
    assert (em.sent, em.rows) == (6, 5)
    assert em.commands([], 8) == [PositionCommand("caches", "m", 6, 8)]
    assert em.commands([], 8) == []  # nothing new


def test_emitter_converts_typed_rows(relay_impl: ModuleType) -> None:
    em = relay_impl.StreamEmitter("caches", "m", None, 0, None, [], 100)
    row = CachesRow("f", ["k"], 5)
    (cmd,) = em.commands([(1, row)], 1)
    assert cmd == RdataCommand("caches", "m", 1, row.to_wire())
    assert _lines([cmd]) == ['RDATA caches m 1 ["f",["k"],5]']


def test_emitter_publish_now_pages_into_every_sink(relay_impl: ModuleType) -> None:
    win = relay_impl.RowWindow(100)
    for t in range(1, 8):
        win.add("m", t, [t])
    got: list[list[Command]] = []
    also: list[Command] = []
    sinks = [got.append]
    em = relay_impl.StreamEmitter("s", "m", win, 0, win.get_updates_now, sinks, 3)
    sinks.append(also.extend)  # the list is shared: a sink added later is used
    em.target = 9
    em.publish_now()
    assert [len(c) for c in got] == [3, 3, 2]
    assert [c.token for c in also[:-1]] == [1, 2, 3, 4, 5, 6, 7]  # type: ignore[attr-defined]
    assert also[-1] == PositionCommand("s", "m", 7, 9)
    assert (em.sent, em.rows) == (9, 7)
    em.page_limit = 100
    assert em.page_limit == 100


def test_emitter_without_sync_source_refuses_to_publish_now(relay_impl: ModuleType) -> None:
    em = relay_impl.StreamEmitter("s", "m", None, 0, None, [], 3)
    em.target = 2
    with pytest.raises(TypeError, match="no synchronous source"):
        em.publish_now()


# ---------------------------------------------------------------- Router


def test_router_publishes_own_forward_moves_only(relay_impl: ModuleType) -> None:
    win = relay_impl.RowWindow(100)
    got: list[Command] = []
    later: list[str] = []
    streams = {"s": relay_impl.StreamEmitter("s", "m", win, 0, win.get_updates_now, [got.extend], 10)}
    router = relay_impl.Router("m", streams, later.append)
    win.add("m", 1, ["a"])
    router.notify("s", "m", 0, 1)
    router.notify("s", "m", 0, 1)  # not forward: nothing
    router.notify("s", "other", 0, 5)  # another writer's position
    router.notify("nope", "m", 0, 5)  # a stream this writer does not publish
    assert _lines(got) == ['RDATA s m 1 ["a"]']
    streams["t"] = relay_impl.StreamEmitter("t", "m", None, 0, None, [got.extend], 10)  # shared dict
    router.notify("t", "m", 0, 3)  # no synchronous source: handed to the background drain
    assert later == ["t"] and streams["t"].target == 3 and streams["t"].sent == 0
    assert router.notify is not None and router.instance == "m"


# ---------------------------------------------------------------- Fanout


class Key:
    def __init__(self, stream: str, writer: str, position: int) -> None:
        self.stream, self.writer, self.position, self.rows = stream, writer, position, 0


def test_fanout_delivers_in_order_and_moves_the_position(relay_impl: ModuleType) -> None:
    errors: list[tuple[Any, ...]] = []

    def on_error(handler: Any, stream: str, writer: str, token: int) -> None:
        import sys

        errors.append((handler, stream, writer, token, type(sys.exc_info()[1])))

    fan = relay_impl.Fanout(lambda *a: a, on_error)
    key = Key("s", "w", 1)
    seen: list[tuple[Any, ...]] = []

    def first(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        seen.append(("first", token, list(rows), key.position))
        if token == 3:
            fan.handlers = [*fan.handlers, (None, late)]  # from the next fact on

    def late(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        seen.append(("late", token))

    def broken(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        raise ValueError("boom")

    class Q:
        def __init__(self) -> None:
            self.items: list[Any] = []

        def put_nowait(self, item: Any) -> None:
            self.items.append(item)

    q = Q()
    fan.handlers = [("s", first), ("other", late), (None, broken)]
    fan.queues.append(q)
    fan.deliver(key, [(2, ["a"]), (3, ["b", "c"]), (5, ["d"])])
    assert seen == [("first", 2, ["a"], 1), ("first", 3, ["b", "c"], 2), ("first", 5, ["d"], 3), ("late", 5)]
    assert errors == [(broken, "s", "w", t, ValueError) for t in (2, 3, 5)]
    assert q.items == [("s", "w", 2, ["a"]), ("s", "w", 3, ["b", "c"]), ("s", "w", 5, ["d"])]
    assert (key.position, key.rows) == (5, 4)


# ---------------------------------------------------------------- gather


def R(token: int | None, row: Any, stream: str = "s", writer: str = "w") -> RdataCommand:
    return RdataCommand(stream, writer, token, row)


def test_gather_folds_one_run(relay_impl: ModuleType) -> None:
    cmds: list[Command] = [R(None, 1), R(2, 2), R(3, 3), R(1, 9), R(None, 4), R(None, 5), R(5, 6), R(None, 7), R(6, 8, writer="x")]
    end, facts, batch, stale = relay_impl.gather(cmds, 0, 1, [0])
    assert end == 8  # stops at the other writer
    assert facts == [(2, [0, 1, 2]), (3, [3]), (5, [4, 5, 6])]
    assert batch == [7]  # waiting for its token
    assert stale == 1  # token 1 is below the position


def test_gather_stops_at_other_commands_and_streams(relay_impl: ModuleType) -> None:
    cmds: list[Command] = [R(1, "a"), PingCommand("1"), R(2, "b"), R(3, "c", stream="t"), R(4, "d")]
    assert relay_impl.gather(cmds, 0, 0, []) == (1, [(1, ["a"])], [], 0)
    assert relay_impl.gather(cmds, 2, 0, []) == (3, [(2, ["b"])], [], 0)
    assert relay_impl.gather(cmds, 3, 0, []) == (4, [(3, ["c"])], [], 0)


def test_gather_without_position_keeps_everything_and_parses(relay_impl: ModuleType) -> None:
    cmds: list[Command] = [R(5, 1), R(3, 2), R(5, 3)]
    assert relay_impl.gather(cmds, 0, None, [], lambda r: r * 10) == (3, [(5, [10]), (3, [20]), (5, [30])], [], 0)
    assert relay_impl.gather(cmds, 0, 4, []) == (3, [(5, [1])], [], 2)


def test_gather_decodes_rows_received_by_either_codec(relay_impl: ModuleType, wire_impl: ModuleType) -> None:
    data = b'RDATA events m batch ["a",{"b":[1,2.5,null]}]\nRDATA events m 7 ["c"]\nRDATA events m 8 "d"\n'
    cmds = wire_impl.LineDecoder().feed(data)
    end, facts, batch, stale = relay_impl.gather(cmds, 0, 0, [])
    assert (end, facts, batch, stale) == (3, [(7, [["a", {"b": [1, 2.5, None]}], ["c"]]), (8, ["d"])], [], 0)
    # what the follower got is what the command now holds (the row property's contract)
    assert facts[0][1][1] is cmds[1].row
    assert wire_impl.encode_lines(cmds) == data


def test_tally(relay_impl: ModuleType) -> None:
    cmds = [R(1, 1), PingCommand("1"), R(2, 2), ReplicateCommand(), PingCommand("2"), R(None, 3)]
    assert relay_impl.tally(cmds) == {"RDATA": 3, "PING": 2, "REPLICATE": 1}
    assert relay_impl.tally([]) == {}


# ---------------------------------------------------------------- differential

tokens = st.one_of(st.none(), st.integers(min_value=0, max_value=12))
rdata = st.builds(R, tokens, st.integers(), st.sampled_from(["s", "t"]), st.sampled_from(["w", "x"]))
streams_of_cmds = st.lists(st.one_of(rdata, rdata, rdata, st.just(PingCommand("p"))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(cmds=streams_of_cmds, position=st.one_of(st.none(), st.integers(min_value=-1, max_value=8)), data=st.data())
def test_gather_twins_agree(cmds: list[Command], position: int | None, data: st.DataObject) -> None:
    starts = [i for i, c in enumerate(cmds) if type(c) is RdataCommand]
    if not starts:
        return
    start = data.draw(st.sampled_from(starts))
    results = [twin("replication._relay", impl).gather(cmds, start, position, ["held"]) for impl in ("c", "py")]
    assert results[0] == results[1]


@settings(max_examples=300, deadline=None)
@given(
    ups=st.lists(st.tuples(st.integers(min_value=0, max_value=10), st.integers()), max_size=12),
    sent=st.integers(min_value=0, max_value=6),
    extra=st.integers(min_value=0, max_value=3),
)
def test_emitter_twins_agree(ups: list[tuple[int, int]], sent: int, extra: int) -> None:
    ups.sort(key=lambda u: u[0])
    upto = max([sent, *(t for t, _ in ups)]) + extra
    out = []
    for impl in ("c", "py"):
        em = twin("replication._relay", impl).StreamEmitter("s", "w", None, sent, None, [], 5)
        out.append((em.commands(ups, upto), em.sent, em.rows))
    assert out[0] == out[1]


def _deliveries(impl: str, cmds: list[Command], runs: bool, position: int | None, start: int | None) -> Any:
    positions = {("s", "w"): position} if position is not None else None
    fol = Follower(typed=False, positions=positions, start_position=start, relay=twin("replication._relay", impl))
    got: list[Any] = []
    fol.add_handler(lambda s, w, t, rows: got.append((s, w, t, list(rows), fol.position(s, w))))
    if runs:
        fol.on_rdata_many(cmds)  # type: ignore[arg-type]
    else:
        for c in cmds:
            fol.on_rdata(c)  # type: ignore[arg-type]
    return got, fol.positions(), fol.stats, {k: (v.batch, v.rows) for k, v in fol._keys.items()}


@settings(max_examples=300, deadline=None)
@given(
    cmds=st.lists(rdata, max_size=30),
    position=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
    start=st.one_of(st.none(), st.just(0)),
)
def test_follower_runs_deliver_like_single_commands(cmds: list[Command], position: int | None, start: int | None) -> None:
    # No update sources: a gap is skipped at once (no fetch), so this runs without an event loop.
    expected = _deliveries("py", cmds, False, position, start)
    for impl in ("c", "py"):
        assert _deliveries(impl, cmds, True, position, start) == expected


def test_follower_runs_count_tokens_and_rows_per_stream() -> None:
    cmds = [R(1, "a"), R(None, "b"), R(2, "c"), R(1, "dup"), R(3, "x", stream="t")]
    for impl in ("c", "py"):
        fol = Follower(typed=False, start_position=0, relay=twin("replication._relay", impl))
        fol.on_rdata_many(cmds)
        assert fol.positions() == {("s", "w"): 2, ("t", "w"): 3}
        assert Counter({(s, n) for _, s, n in fol.metric_rows()}) == Counter({("s", 3), ("t", 1)})
        assert fol.stats["stale_rows"] == 1


def test_follower_runs_refuse_other_commands() -> None:
    fol = Follower(typed=False, start_position=0)
    with pytest.raises(TypeError, match="RDATA commands only"):
        fol.on_rdata_many([R(1, "a"), PositionCommand("s", "w", 1, 2)])  # type: ignore[list-item]
    assert fol.positions() == {("s", "w"): 1}


def test_gather_keeps_a_cycle_through_a_decoded_row_collectable(relay_impl: ModuleType, wire_impl: ModuleType) -> None:
    # The compiled codec leaves a parsed command out of the cycle collector
    # while it holds only atoms; the relay decodes the row into it, so the
    # relay must put it back (else a cycle through the row would leak).
    import gc
    import weakref

    class Probe:
        pass

    cmd = wire_impl.parse_line(b'RDATA events master 5 ["a",1]')
    _, facts, _, _ = relay_impl.gather([cmd], 0, None, [])
    row = facts[0][1][0]
    assert row == ["a", 1]
    assert gc.is_tracked(cmd)
    probe = Probe()
    row.extend([cmd, probe])
    ref = weakref.ref(probe)
    del cmd, probe, row, facts
    gc.collect()
    assert ref() is None, "a cycle through a row decoded by the relay was not collected"
