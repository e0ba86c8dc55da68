"""The replication relay's hot loops, on both twins (``relay_impl`` is parametrised over c and py).

The pure twin is the specification; differential tests check that the
compiled twin gives the same commands, facts and errors, and that a follower
fed runs of RDATA (``on_rdata_many``) delivers exactly what one ``on_rdata``
per command delivers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from types import ModuleType
from typing import Any, ClassVar

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


def test_gather_takes_at_most_limit_commands(relay_impl: ModuleType) -> None:
    cmds: list[Command] = [R(None, 1), R(2, 2), R(3, 3), R(None, 4), R(5, 5)]
    assert relay_impl.gather(cmds, 0, 0, [], None, 2) == (2, [(2, [1, 2])], [], 0)
    assert relay_impl.gather(cmds, 2, 2, [], None, 2) == (4, [(3, [3])], [4], 0)  # the batch row waits on
    assert relay_impl.gather(cmds, 4, 3, [4], None, 9) == (5, [(5, [4, 5])], [], 0)
    with pytest.raises(ValueError, match="limit must be at least 1"):
        relay_impl.gather(cmds, 0, 0, [], None, 0)


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


def _deliveries(
    impl: str, cmds: list[Command], runs: bool, position: int | None, start: int | None, run_limit: int = 256
) -> Any:
    positions = {("s", "w"): position} if position is not None else None
    fol = Follower(typed=False, positions=positions, start_position=start, relay=twin("replication._relay", impl))
    fol.run_limit = run_limit
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
        assert _deliveries(impl, cmds, True, position, start, run_limit=2) == expected  # runs handed on in pieces


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


# ---------------------------------------------------------------- RowParser (typed rows without from_wire)

from factstream.errors import ProtocolError  # noqa: E402
from factstream.streams import rows as R_  # noqa: E402


@dataclasses.dataclass(frozen=True, slots=True)
class _Pair(R_.Row):
    STREAM: ClassVar[str] = "pair"
    a: Any
    b: Any


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked(R_.Row):
    """Its __post_init__ must run: never built around it."""

    STREAM: ClassVar[str] = "checked"
    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int):
            raise ProtocolError("checked row must hold an int", repr(self.n))


@dataclasses.dataclass(frozen=True, slots=True)
class _Custom(R_.Row):
    """A from_wire of its own (reverses the fields): always called."""

    STREAM: ClassVar[str] = "custom"
    a: Any
    b: Any

    @classmethod
    def from_wire(cls, row: Any) -> _Custom:
        return cls(row[1], row[0])


@dataclasses.dataclass(frozen=True, slots=True)
class _OwnInit(R_.Row):
    """An __init__ written by hand (it changes the value): always called."""

    STREAM: ClassVar[str] = "own_init"
    a: Any

    def __init__(self, a: Any) -> None:
        object.__setattr__(self, "a", ("seen", a))


@dataclasses.dataclass(frozen=True, slots=True)
class _SubPair(_Pair):
    """A subclass adding a field: a plain class of its own, three fields."""

    c: Any


class _Loose(_Pair):
    """A subclass that is not a dataclass of its own (it has a __dict__): built by from_wire."""


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - the failure is what is compared
        return type(err), str(err)


def _refusal(row: Any, name: str) -> tuple[type, str]:
    try:
        setattr(row, name, 1)
    except Exception as err:  # noqa: BLE001 - the refusal is what is compared
        return type(err), str(err)
    raise AssertionError(f"{row!r} took a new attribute {name}")


EVENT_SAMPLES = [
    ["ev", ["$e:hs", "!r:hs", "m.room.message", None, None, None, None, False, False]],
    ["ev", ("$e:hs", "!r:hs", "m.room.member", "@u:hs", None, None, "join", True, False)],
    ["state", ["!r:hs", "m.room.name", "", None]],
    ["state-all", ["!r:hs"]],
]


def test_row_shapes_say_which_classes_are_plain() -> None:
    assert R_.wire_fields(R_.ToDeviceRow) == ("entity",)
    assert R_.wire_fields(R_.CachesRow) == ("cache_func", "keys", "invalidation_ts")
    assert R_.wire_fields(_Pair) == ("a", "b") and R_.wire_fields(_SubPair) == ("a", "b", "c")
    for cls in (R_.Row, R_.EventsRow, _Checked, _Custom, _OwnInit, _Loose, int, "x"):
        assert R_.wire_fields(cls) is None, cls
    assert R_.wire_kinds(R_.EventsRow) is R_.EVENT_ROW_KINDS
    assert R_.wire_kinds(R_.EventRow) is None and R_.wire_kinds(_Pair) is None


@pytest.mark.parametrize(
    "cls, row",
    [
        (R_.ToDeviceRow, ["@u:hs"]),
        (R_.CachesRow, ["get_user", ["@u:hs", 1], 5]),
        (R_.CachesRow, ("get_user", None, 5)),
        (R_.TypingRow, ["!r:hs", ["@a:hs", "@b:hs"]]),
        (R_.ReceiptsRow, ["!r:hs", "m.read", "@u:hs", "$e:hs", None, {"ts": 1}]),
        (R_.PresenceRow, ["@u:hs", "online", 1, 2, 3, None, True]),
        (_Pair, [1.5, (1, 2)]),
        (_SubPair, ["x", "y", "z"]),
        *((R_.EventsRow, row) for row in EVENT_SAMPLES),
    ],
)
def test_row_parser_builds_what_from_wire_builds(relay_impl: ModuleType, cls: Any, row: Any) -> None:
    parser = relay_impl.RowParser(cls)
    got, want = parser(row), cls.from_wire(row)
    assert type(got) is type(want) and got == want and repr(got) == repr(want)
    assert _outcome(hash, got) == _outcome(hash, want)  # (a row holding a list is unhashable either way)
    assert got.to_wire() == want.to_wire()
    leaf_got, leaf_want = (got.data, want.data) if cls is R_.EventsRow else (got, want)
    for name in (f.name for f in dataclasses.fields(leaf_got)):
        assert getattr(leaf_got, name) is getattr(leaf_want, name)  # the decoded values themselves, not copies
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, first, 1)
    assert _refusal(got, "x") == _refusal(want, "x")  # (Python 3.11 refuses a new name with a TypeError)
    assert getattr(got, first) is getattr(want, first)
    assert dataclasses.replace(got) == got
    if cls is R_.EventsRow:
        assert type(got.data) is R_.EVENT_ROW_KINDS[row[0]] and got.data == want.data


@pytest.mark.parametrize(
    "cls, row, message",
    [
        (R_.ToDeviceRow, [], "to_device row must have 1 fields, got 0"),
        (R_.ToDeviceRow, ["a", "b"], "to_device row must have 1 fields, got 2"),
        (R_.ToDeviceRow, "a", "to_device row must be a JSON array, not str"),
        (R_.ToDeviceRow, {"entity": "a"}, "to_device row must be a JSON array, not dict"),
        (R_.CachesRow, ["f", None], "caches row must have 3 fields, got 2"),
        (R_.EventsRow, ["ev"], "events row must be a JSON array"),
        (R_.EventsRow, ["nope", []], "events row kind 'nope' is unknown"),
        (R_.EventsRow, [["ev"], []], "events row kind \\['ev'\\] is unknown"),
        (R_.EventsRow, ["state-all", []], "events row must have 1 fields, got 0"),
        (R_.EventsRow, ["state-all", "!r"], "events row must be a JSON array, not str"),
        (R_.EventsRow, ["ev", ["$e", "!r"]], "events row must have 9 fields, got 2"),
    ],
)
def test_row_parser_wrong_shapes_raise_from_wire_errors(relay_impl: ModuleType, cls: Any, row: Any, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        cls.from_wire(row)
    with pytest.raises(ProtocolError, match=message):
        relay_impl.RowParser(cls)(row)


def test_row_parser_hands_odd_rows_to_its_fallback(relay_impl: ModuleType) -> None:
    seen: list[Any] = []

    def fallback(row: Any) -> Any:
        seen.append(row)
        return ("untyped", row)

    parser = relay_impl.RowParser(R_.ToDeviceRow, fallback)
    assert parser.row_type is R_.ToDeviceRow and parser.fallback is fallback
    assert parser(["@u"]) == R_.ToDeviceRow("@u") and seen == []

    class Listish(list):  # a list subclass may iterate differently: from_wire decides
        pass

    odd = Listish(["@v"])
    assert parser(odd) == ("untyped", odd) and parser(["a", "b"]) == ("untyped", ["a", "b"])
    assert seen == [odd, ["a", "b"]]
    events = relay_impl.RowParser(R_.EventsRow, fallback)
    assert events(["ev", ["$e"]]) == ("untyped", ["ev", ["$e"]])
    assert events([1, ["!r"]]) == ("untyped", [1, ["!r"]])


@pytest.mark.parametrize("cls", [_Checked, _Custom, _OwnInit, _Loose])
def test_row_parser_leaves_classes_with_code_of_their_own_to_from_wire(relay_impl: ModuleType, cls: Any) -> None:
    parser = relay_impl.RowParser(cls)
    row = [7] if cls in (_Checked, _OwnInit) else [1, 2]
    got = parser(row)
    assert type(got) is cls and got == cls.from_wire(row)
    if cls is _Custom:
        assert (got.a, got.b) == (2, 1)
    if cls is _OwnInit:
        assert got.a == ("seen", 7)
    if cls is _Checked:
        with pytest.raises(ProtocolError, match="must hold an int"):
            parser(["7"])


def test_row_parser_events_kinds_added_later_and_custom_kinds(relay_impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = relay_impl.RowParser(R_.EventsRow)
    assert parser(["state-all", ["!r"]]) == R_.EventsRow("state-all", R_.AllStateRow("!r"))
    # The kinds are read live: one registered after the parser was made is built too, by its own from_wire
    # when it has one.
    monkeypatch.setitem(R_.EVENT_ROW_KINDS, "custom", _Custom)
    monkeypatch.setitem(R_.EVENT_ROW_KINDS, "pair", _Pair)
    assert parser(["custom", [1, 2]]) == R_.EventsRow("custom", _Custom(2, 1))
    assert parser(["pair", [1, 2]]) == R_.EventsRow("pair", _Pair(1, 2))


def test_row_parser_rows_holding_containers_stay_collectable(relay_impl: ModuleType) -> None:
    # A row holding only strings, numbers and None may be left out of the cycle collector; one holding a
    # list must not be, or a cycle through it would leak.
    import gc
    import weakref

    class Probe:
        pass

    parser = relay_impl.RowParser(R_.CachesRow)
    keys: list[Any] = ["@u"]
    row = parser(["get_user", keys, 5])
    assert gc.is_tracked(row)
    probe = Probe()
    keys.extend([row, probe])
    ref = weakref.ref(probe)
    del keys, row, probe
    gc.collect()
    assert ref() is None, "a cycle through a typed row was not collected"
    events = relay_impl.RowParser(R_.EventsRow)
    data = ["$e", "!r", "m.room.message", None, None, None, None, False, {"held": []}]
    wrapped = events(["ev", data])
    assert gc.is_tracked(wrapped.data) and gc.is_tracked(wrapped)


def test_gather_builds_typed_rows_with_a_row_parser(relay_impl: ModuleType, wire_impl: ModuleType) -> None:
    data = (
        b'RDATA to_device m batch ["@a:hs"]\nRDATA to_device m 7 ["@b:hs"]\n'
        b'RDATA to_device m 8 ["@c:hs","extra"]\nRDATA to_device m 9 {"entity":"@d:hs"}\n'
    )
    cmds = wire_impl.LineDecoder().feed(data)
    parser = relay_impl.RowParser(R_.ToDeviceRow, lambda row: ("untyped", row))
    end, facts, batch, stale = relay_impl.gather(cmds, 0, 7, [], parser)
    assert (end, batch, stale) == (4, [], 2)  # token 7 is at the position: its two rows are stale
    assert facts == [(8, [("untyped", ["@c:hs", "extra"])]), (9, [("untyped", {"entity": "@d:hs"})])]
    cmds = wire_impl.LineDecoder().feed(data)
    assert relay_impl.gather(cmds, 0, None, [], parser)[1][0] == (7, [R_.ToDeviceRow("@a:hs"), R_.ToDeviceRow("@b:hs")])


def test_typed_follower_delivers_the_same_rows_on_both_twins(caplog: pytest.LogCaptureFixture) -> None:
    cmds = [
        RdataCommand("events", "m", None, EVENT_SAMPLES[0]),
        RdataCommand("events", "m", 1, EVENT_SAMPLES[2]),
        RdataCommand("events", "m", 2, ["ev", ["$short"]]),  # malformed: delivered untyped, with a warning
        RdataCommand("to_device", "m", 3, ["@u:hs"]),
        RdataCommand("mine", "m", 4, ["anything"]),  # unknown stream: untyped
        RdataCommand("to_device", "m", 1, ["@stale:hs"]),
    ]
    got = {}
    for impl in ("c", "py"):
        fol = Follower(start_position=0, relay=twin("replication._relay", impl))
        out: list[Any] = []
        fol.add_handler(lambda s, w, t, rows, out=out: out.append((s, t, list(rows))))
        caplog.clear()
        with caplog.at_level("WARNING", logger="factstream.replication.follower"):
            fol.on_rdata_many(cmds)
        got[impl] = (out, fol.stats["stale_rows"], sorted(r.getMessage() for r in caplog.records))
    assert got["c"] == got["py"]
    out, stale, messages = got["py"]
    assert out == [
        ("events", 1, [R_.EventsRow.from_wire(EVENT_SAMPLES[0]), R_.EventsRow.from_wire(EVENT_SAMPLES[2])]),
        ("events", 2, [["ev", ["$short"]]]),
        ("to_device", 3, [R_.ToDeviceRow("@u:hs")]),
        ("mine", 4, [["anything"]]),
    ]
    assert stale == 1
    assert any("malformed events row delivered untyped" in m for m in messages)
    assert any("unknown stream 'mine'" in m for m in messages)


json_atoms = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3))
json_values = st.recursive(json_atoms, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
shaped_rows = st.one_of(
    json_values,
    st.lists(json_values, max_size=10),
    st.tuples(st.sampled_from([*R_.EVENT_ROW_KINDS, "nope"]), st.lists(json_values, max_size=10)).map(list),
)


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from([R_.ToDeviceRow, R_.CachesRow, R_.EventsRow, _Pair, _Checked]), row=shaped_rows)
def test_row_parser_twins_agree(cls: Any, row: Any) -> None:
    want = _outcome(cls.from_wire, row)
    for impl in ("c", "py"):
        got = _outcome(twin("replication._relay", impl).RowParser(cls), row)
        assert got == want and type(got) is type(want)


def test_gather_with_a_parser_leaves_the_command_as_received(relay_impl: ModuleType, wire_impl: ModuleType) -> None:
    # The typed row is what is handed out: the command keeps what it had (with the compiled codec, its
    # bytes: it stays re-encodable as received and out of the cycle collector's lists).
    import gc

    data = b'RDATA caches m 5 ["get_user",["@u:hs"],7]\n'
    cmds = wire_impl.LineDecoder().feed(data)
    tracked = gc.is_tracked(cmds[0])
    _, facts, _, _ = relay_impl.gather(cmds, 0, None, [], relay_impl.RowParser(R_.CachesRow))
    row = facts[0][1][0]
    assert row == R_.CachesRow("get_user", ["@u:hs"], 7)
    assert gc.is_tracked(cmds[0]) == tracked
    assert wire_impl.encode_lines(cmds) == data
    assert cmds[0].row == ["get_user", ["@u:hs"], 7]


# ---------------------------------------------------------------- publishing the row just added


def _published(impl: str, steps: list[tuple[int, int]], capacity: int) -> Any:
    """Each step adds ``rows`` rows at the next token (or, with rows 0, a hole) and publishes to ``target``."""
    relay = twin("replication._relay", impl)
    win = relay.RowWindow(capacity)
    out: list[Any] = []
    em = relay.StreamEmitter("s", "m", win, 0, win.get_updates_now, [lambda cmds: out.append(_lines(cmds))], 4)
    token = 0
    for rows, ahead in steps:
        token += 1
        for k in range(rows):
            win.add("m", token, [token, k])
        em.target = token + ahead  # ahead: the position runs past the rows (a hole or rows still to come)
        try:
            em.publish_now()
        except UpdatesUnavailable as err:
            out.append(str(err))
            em.sent = em.target  # as a reader would after catch-up: go on from here
        out.append((em.sent, em.rows))
    return out


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=1)), max_size=25),
    capacity=st.integers(min_value=1, max_value=6),
)
def test_publish_now_twins_agree(steps: list[tuple[int, int]], capacity: int) -> None:
    assert _published("c", steps, capacity) == _published("py", steps, capacity)


def test_publish_now_follows_a_replaced_sync_source(relay_impl: ModuleType) -> None:
    first, second = relay_impl.RowWindow(10), relay_impl.RowWindow(10)
    first.add("m", 1, ["first"])
    second.add("m", 1, ["second"])
    got: list[Command] = []
    em = relay_impl.StreamEmitter("s", "m", first, 0, first.get_updates_now, [got.extend], 10)
    em.sync_get = second.get_updates_now
    em.target = 1
    em.publish_now()
    assert _lines(got) == ['RDATA s m 1 ["second"]']


def test_a_published_command_that_may_be_kept_stays_collectable_in_a_cycle(relay_impl: ModuleType) -> None:
    # The compiled writer leaves the command of the row just added out of the cycle collector
    # while only a link's send queue holds it (encoded at the end of the loop turn); a sink or a
    # connection without a send queue may keep it, so it gets it tracked: a cycle through its row
    # must still be collected.
    import gc
    import weakref

    class Probe:
        pass

    class Conn:
        def __init__(self) -> None:
            self.got: list[Command] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.got.extend(cmds)

    class Link:  # a TCP link with its loop turn's queue open
        def __init__(self) -> None:
            self.send_queue: list[Command] = []

    plain, conn, link = [], Conn(), Link()
    win = relay_impl.RowWindow(10)
    em = relay_impl.StreamEmitter(
        "s", "m", win, 0, win.get_updates_now, [plain.extend, relay_impl.Broadcast([conn, link])], 10
    )
    win.add("m", 1, ["a"])
    em.target = 1
    em.publish_now()
    cmd = plain[0]
    assert cmd is conn.got[0] is link.send_queue[0] and _lines([cmd]) == ['RDATA s m 1 ["a"]']
    assert gc.is_tracked(cmd)
    probe = Probe()
    cmd.row.extend([cmd, probe])
    ref = weakref.ref(probe)
    del cmd, probe, plain[:], conn.got[:], link.send_queue[:]
    win = em = None  # the window holds the row too
    gc.collect()
    assert ref() is None

    # Only links' queues: out of the collector's lists (compiled twin), same command and bytes.
    link = Link()
    win = relay_impl.RowWindow(10)
    em = relay_impl.StreamEmitter("s", "m", win, 0, win.get_updates_now, [relay_impl.Broadcast([link])], 10)
    win.add("m", 1, ["a"])
    em.target = 1
    em.publish_now()
    assert _lines(link.send_queue) == ['RDATA s m 1 ["a"]']
    assert gc.is_tracked(link.send_queue[0]) == (relay_impl.__name__.endswith("_py"))


def test_broadcast_sends_to_every_target_seen_at_the_time(relay_impl: ModuleType) -> None:
    class Conn:
        def __init__(self) -> None:
            self.got: list[Command] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.got.extend(cmds)

    a, b = Conn(), Conn()
    targets = [a]
    broadcast = relay_impl.Broadcast(targets)
    broadcast([R(1, "x")])
    targets.append(b)  # the hub's list is shared: a connection added later is sent to
    broadcast([R(2, "y")])
    targets.remove(a)
    broadcast([R(3, "z")])
    assert [c.token for c in a.got] == [1, 2] and [c.token for c in b.got] == [2, 3]  # type: ignore[attr-defined]
    assert broadcast.targets is targets


def test_local_writer_completes_at_once_unless_reservations_are_in_flight(relay_impl: ModuleType) -> None:
    added: list[tuple[str, int, Any]] = []
    heard: list[tuple[str, str, int, int]] = []
    pending: list[int] = []
    fallen: list[Any] = []

    def fallback(rows: Any) -> int:
        fallen.append(list(rows))
        return -1

    w = relay_impl.LocalWriter(
        "s", "m", lambda i, t, r: added.append((i, t, r)), [lambda *a: heard.append(a)], pending, fallback, 5
    )
    assert (w.next, w.position) == (5, 5)
    assert w.write([["a"], ["b"]]) == 6
    assert w.write(iter([])) == 7  # no rows: a hole, still a token and a move
    assert added == [("m", 6, ["a"]), ("m", 6, ["b"])]
    assert heard == [("s", "m", 5, 6), ("s", "m", 6, 7)] and (w.next, w.position) == (7, 7)
    w.listeners.append(lambda *a: heard.append(("late",) + a))  # type: ignore[arg-type]  # shared: seen next time
    pending.append(9)  # a reservation in flight (the stream's shared list): the fallback writes
    assert w.write([["c"]]) == -1 and fallen == [[["c"]]] and (w.next, w.position) == (7, 7)
    pending.clear()

    def bad() -> Any:
        yield ["d"]
        raise RuntimeError("rows failed")

    with pytest.raises(RuntimeError, match="rows failed"):
        w.write(bad())
    assert (w.next, w.position) == (8, 7) and added[-1] == ("m", 8, ["d"])  # the token is used, not completed
    assert w.write([["e"]]) == 9 and heard[-2:] == [("s", "m", 7, 9), ("late", "s", "m", 7, 9)]


def test_broadcast_appends_to_a_targets_send_queue_instead_of_calling_send_many(relay_impl: ModuleType) -> None:
    class Conn:
        send_queue: list[Command] | None = None

        def __init__(self) -> None:
            self.calls: list[list[Command]] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.calls.append(list(cmds))

    open_q, shut = Conn(), Conn()
    open_q.send_queue = [R(0, "earlier")]
    broadcast = relay_impl.Broadcast([open_q, shut])
    broadcast([R(1, "x"), R(2, "y")])
    assert [c.token for c in open_q.send_queue] == [0, 1, 2] and open_q.calls == []
    assert [[c.token for c in call] for call in shut.calls] == [[1, 2]]  # None: through send_many
    open_q.send_queue = None
    broadcast([R(3, "z")])
    assert [[c.token for c in call] for call in open_q.calls] == [[3]]

    class NoQueue:  # a connection without the attribute at all
        def __init__(self) -> None:
            self.got: list[Command] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.got.extend(cmds)

    plain = NoQueue()
    relay_impl.Broadcast([plain])([R(4, "w")])
    assert [c.token for c in plain.got] == [4]


def test_a_single_row_publication_reaches_broadcast_targets_and_other_sinks_alike(relay_impl: ModuleType) -> None:
    """The writer's hot path (one row completing one token) through a Broadcast and a plain sink, in order."""

    class Conn:
        def __init__(self, queue: list[Command] | None) -> None:
            self.send_queue = queue
            self.calls: list[list[Command]] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.calls.append(list(cmds))

    window = relay_impl.RowWindow(100)
    queued, direct = Conn([]), Conn(None)
    plain: list[Command] = []
    em = relay_impl.StreamEmitter(
        "s", "m", window, 0, window.get_updates_now, [relay_impl.Broadcast([queued, direct]), plain.extend], 10
    )
    for token in (1, 2):
        window.add("m", token, [f"r{token}"])
        em.target = token
        em.publish_now()
    window.add("m", 3, ["a"])
    window.add("m", 3, ["b"])  # two rows at one token: a batch, not the single-row path
    em.target = 3
    em.publish_now()
    expected = ['RDATA s m 1 ["r1"]', 'RDATA s m 2 ["r2"]', 'RDATA s m batch ["a"]', 'RDATA s m 3 ["b"]']
    assert _lines(queued.send_queue) == _lines(plain) == expected and queued.calls == []  # type: ignore[arg-type]
    assert [_lines(c) for c in direct.calls] == [expected[:1], expected[1:2], expected[2:]]
    assert em.sent == 3 and em.rows == 4


@dataclasses.dataclass(slots=True)
class _SlotKey:
    stream: str
    writer: str
    position: int | None
    rows: int = 0


class _WatchedKey:
    """A key whose writes go through its own __setattr__: it must see every move."""

    def __init__(self) -> None:
        self.stream, self.writer, self.position, self.rows = "s", "w", 0, 0
        self.moves: list[tuple[str, Any]] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("position", "rows") and hasattr(self, "moves"):
            self.moves.append((name, value))
        object.__setattr__(self, name, value)


class _PropertyKey:
    """A key whose position is a property."""

    def __init__(self) -> None:
        self.stream, self.writer, self.rows, self.set_to = "s", "w", 0, []

    @property
    def position(self) -> int:
        return self.set_to[-1] if self.set_to else 0

    @position.setter
    def position(self, value: int) -> None:
        self.set_to.append(value)


def test_fanout_moves_keys_of_every_kind(relay_impl: ModuleType) -> None:
    fan = relay_impl.Fanout(lambda *a: a, lambda *a: None)
    positions: list[Any] = []
    fan.handlers = [(None, lambda s, w, t, rows: positions.append(t))]
    slot_key = _SlotKey("s", "w", 0)
    fan.deliver(slot_key, [(1, ["a"]), (2, ["b", "c"])])
    assert (slot_key.position, slot_key.rows) == (2, 3)
    watched = _WatchedKey()
    fan.deliver(watched, [(4, ["a", "b"])])
    assert watched.moves == [("rows", 2), ("position", 4)]
    prop = _PropertyKey()
    fan.deliver(prop, [(6, ["a"]), (7, ["b"])])
    assert prop.set_to == [6, 7] and prop.rows == 2
    fan.deliver(slot_key, [(3, ["d"])])  # back to the first kind of key
    assert (slot_key.position, slot_key.rows) == (3, 4)
    assert positions == [1, 2, 4, 6, 7, 3]


# ---------------------------------------------------------------- same_source


def test_same_source_finds_the_first_foreign_command(relay_impl: ModuleType) -> None:
    P = PositionCommand
    assert relay_impl.same_source([R(1, "a"), R(None, "b"), R(2, "c")]) == (3, False)
    assert relay_impl.same_source([P("s", "w", 0, 1), R(2, "a"), P("s", "w", 2, 4)]) == (3, True)
    assert relay_impl.same_source([R(1, "a"), R(2, "b", writer="x"), P("s", "w", 2, 3)]) == (1, False)
    assert relay_impl.same_source([R(1, "a"), R(2, "b", stream="t")]) == (1, False)
    assert relay_impl.same_source([R(1, "a"), P("s", "x", 1, 2)]) == (1, False)  # a foreign POSITION: not counted
    assert relay_impl.same_source([R(1, "a"), PingCommand("p"), R(2, "b")]) == (1, False)
    assert relay_impl.same_source([P("s", "w", 0, 1), ReplicateCommand()]) == (1, True)
    with pytest.raises(IndexError):
        relay_impl.same_source([])


@settings(max_examples=300, deadline=None)
@given(
    cmds=st.lists(
        st.one_of(
            rdata,
            st.builds(PositionCommand, st.sampled_from(["s", "t"]), st.sampled_from(["w", "x"]), st.just(0), st.just(1)),
            st.just(PingCommand("p")),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_same_source_twins_agree(cmds: list[Command]) -> None:
    if type(cmds[0]) is PingCommand:
        return  # the caller checks the first command is a fact first
    results = [twin("replication._relay", impl).same_source(cmds) for impl in ("c", "py")]
    assert results[0] == results[1]


# ---------------------------------------------------------------- direct paths (compiled: C bodies, slots)


def test_row_window_capacity_changed_later_trims_at_the_new_size(relay_impl: ModuleType) -> None:
    win = relay_impl.RowWindow(100)
    for t in range(1, 6):
        win.add("w", t, [t])
    win.capacity = 2  # 5 rows > 2 * 2: the next add trims down to 2, floor at the last dropped token
    win.add("w", 6, [6])
    assert win.capacity == 2 and win.get_updates_now("w", 4, 6, 10) == ([(5, [5]), (6, [6])], 6, False)
    with pytest.raises(UpdatesUnavailable, match="after 3 are no longer in memory"):
        win.get_updates_now("w", 3, 6, 10)
    win.capacity = 10**30  # bigger than any list: nothing is ever trimmed
    for t in range(7, 30):
        win.add("w", t, [t])
    assert len(win.get_updates_now("w", 4, 29, 100)[0]) == 25


def test_local_writer_through_a_window_and_a_router_matches_any_other_callables(relay_impl: ModuleType) -> None:
    """A MemoryUpdateSource's add and a Publisher's notify (the compiled twin calls their C bodies) give the
    same rows and commands as the same work done through plain callables; subclasses keep their overrides."""

    def run(wrap: bool, window_cls: Any, router_cls: Any) -> tuple[list[str], list[Any]]:
        win = window_cls(100)
        got: list[Command] = []
        streams = {"s": relay_impl.StreamEmitter("s", "m", win, 0, win.get_updates_now, [got.extend], 10)}
        router = router_cls("m", streams, lambda name: None)
        add = (lambda i, t, r: win.add(i, t, r)) if wrap else win.add
        notify = (lambda *a: router.notify(*a)) if wrap else router.notify
        w = relay_impl.LocalWriter("s", "m", add, [notify], [], lambda rows: -1, 0)
        for rows in ([["a"]], [["b"], ["c"]], [], [["d"]]):
            w.write(rows)
        return _lines(got), win.get_updates_now("m", 0, 10, 100)[0]

    class Window(relay_impl.RowWindow):  # type: ignore[misc,name-defined]
        def add(self, instance: str, token: int, row: Any) -> None:
            super().add(instance, token, row + ["!"])

    class Quiet(relay_impl.Router):  # type: ignore[misc,name-defined]
        def notify(self, stream: str, instance: str, old: int, new: int) -> None:
            if new != 2:  # token 2 is never announced: its rows go out with the next move
                super().notify(stream, instance, old, new)

    plain = run(True, relay_impl.RowWindow, relay_impl.Router)
    assert run(False, relay_impl.RowWindow, relay_impl.Router) == plain
    assert plain[0] == ['RDATA s m 1 ["a"]', 'RDATA s m batch ["b"]', 'RDATA s m 2 ["c"]', "POSITION s m 2 3",
                        'RDATA s m 4 ["d"]']
    rows, kept = run(False, Window, Quiet)
    assert rows == ['RDATA s m 1 ["a","!"]', 'RDATA s m batch ["b","!"]', 'RDATA s m 2 ["c","!"]',
                    "POSITION s m 2 3", 'RDATA s m 4 ["d","!"]']
    assert kept == [(1, ["a", "!"]), (2, ["b", "!"]), (2, ["c", "!"]), (4, ["d", "!"])]


def test_broadcast_reads_send_queue_of_every_kind_of_connection(relay_impl: ModuleType) -> None:
    """A send_queue in a slot (TcpConnection's), unset, in the instance dict, a property, or behind a
    __getattribute__ of its own: each connection is handed the commands as getattr would see them."""

    class Base:
        def __init__(self) -> None:
            self.calls: list[list[Any]] = []

        def send_many(self, cmds: list[Command]) -> None:
            self.calls.append([c.token for c in cmds])  # type: ignore[attr-defined]

    class Slotted(Base):
        __slots__ = ("send_queue",)

    class Plain(Base):
        send_queue: list[Command] | None = None

    class Prop(Base):
        @property
        def send_queue(self) -> list[Command] | None:
            return self.__dict__.get("q")

    class Odd(Slotted):
        def __getattribute__(self, name: str) -> Any:
            if name == "send_queue":
                return None  # never a queue: always send_many
            return object.__getattribute__(self, name)

    unset = Slotted()  # the slot never assigned: as getattr's default, None
    a, b, c, d = Slotted(), Plain(), Prop(), Odd()
    a.send_queue, b.send_queue, d.send_queue = [], [], []
    c.__dict__["q"] = []
    broadcast = relay_impl.Broadcast([a, unset, b, c, d, a])
    broadcast([R(1, "x")])
    wr = relay_impl.RowWindow(10)
    em = relay_impl.StreamEmitter("s", "w", wr, 0, wr.get_updates_now, [broadcast], 10)
    wr.add("w", 2, ["y"])
    em.target = 2
    em.publish_now()  # one row: Broadcast's single-command path
    assert [x.token for x in a.send_queue] == [1, 1, 2, 2] and a.calls == []
    assert [x.token for x in b.send_queue] == [1, 2] and [x.token for x in c.__dict__["q"]] == [1, 2]
    assert unset.calls == [[1], [2]] and d.calls == [[1], [2]] and d.__dict__ == {"calls": [[1], [2]]}
    a.send_queue = None
    broadcast([R(3, "z")])
    assert a.calls == [[3], [3]]


def test_row_parser_in_gather_sees_a_kind_replaced_between_runs(relay_impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = relay_impl.RowParser(R_.EventsRow)
    cmds = [R(1, ["custom", [1, 2]]), R(2, ["custom", [3, 4]])]
    monkeypatch.setitem(R_.EVENT_ROW_KINDS, "custom", _Pair)
    facts = relay_impl.gather(cmds, 0, None, [], parser)[1]
    assert facts == [(1, [R_.EventsRow("custom", _Pair(1, 2))]), (2, [R_.EventsRow("custom", _Pair(3, 4))])]
    monkeypatch.setitem(R_.EVENT_ROW_KINDS, "custom", _Custom)  # replaced: the next run builds the new class
    cmds = [R(3, ["custom", [1, 2]]), R(4, ["custom", [3, 4]])]
    facts = relay_impl.gather(cmds, 0, None, [], parser)[1]
    assert facts == [(3, [R_.EventsRow("custom", _Custom(2, 1))]), (4, [R_.EventsRow("custom", _Custom(4, 3))])]


def test_gather_one_row_facts_and_waiting_batches(relay_impl: ModuleType) -> None:
    waiting = [["early"]]
    cmds = [R(None, ["a"]), R(5, ["b"]), R(6, ["c"]), R(None, ["d"])]
    end, facts, batch, stale = relay_impl.gather(cmds, 0, None, waiting, None)
    assert (end, stale) == (4, 0) and facts == [(5, [["early"], ["a"], ["b"]]), (6, [["c"]])]
    assert facts[0][1] is waiting and batch == [["d"]] and batch is not waiting  # the waiting rows became a fact
    empty: list[Any] = []
    end, facts, batch, _ = relay_impl.gather([R(7, ["e"]), R(8, ["f"])], 0, None, empty, None)
    assert facts == [(7, [["e"]]), (8, [["f"]])] and batch == [] and facts[0][1] is not facts[1][1]


_HELD_ROWS = [
    # events-style rows: [kind, fields] of every shape the parser meets, odd ones included
    ("events", '["ev",["$e:hs","!r:hs","m.room.message",null,null,null,null,false,false]]'),
    ("events", '[ "ev" , [ "$e:hs" , "!r:hs" , "m.room.message" , null , "s" , "@u:hs" , null , true , false ] ]'),
    ("events", '["ev",["$e:hs","!r:hs","m.room.message",null,null,null,null,false]]'),  # a field short
    ("events", '["ev",["$e:hs","!r:hs","m.room.message",null,null,null,null,false,false,"x"]]'),  # one too many
    ("events", '["state-all",["!r:hs"]]'),
    ("events", '["custom",[1,{"a":[2]}]]'),  # a kind with a from_wire of its own
    ("events", '["nope",[1]]'),  # an unknown kind
    ("events", '[7,["$e:hs"]]'),  # a kind that is not a str
    ("events", '["ev",{"a":1}]'),  # fields that are not an array
    ("events", '["ev",[]]'),
    ("events", '["ev"]'),
    ("events", '["ev",[1],2]'),
    ("events", "[]"),
    ("events", '{"ev":[1]}'),
    ("events", '"ev"'),
    ("events", '["ev",[' + ",".join(["1"] * 40) + "]]"),  # more fields than any class has
    # plain rows: the class's field count, fewer, more, containers inside
    ("caches", '["get_user",["@u:hs"],1700000000000]'),
    ("caches", '["get_user",null,1]'),
    ("caches", '["get_user",["@u:hs"]]'),
    ("caches", '["get_user",["@u:hs"],1,2]'),
    ("caches", '{"cache_func":"x"}'),
    ("to_device", '["@a:hs"]'),
    ("to_device", '["@a:hs","extra"]'),
    ("to_device", "[]"),
]


@pytest.mark.parametrize("stream", sorted({s for s, _ in _HELD_ROWS}))
def test_gather_builds_typed_rows_from_held_bytes_as_from_decoded_rows(
    relay_impl: ModuleType, wire_impl: ModuleType, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the codec holds as bytes (the compiled twin fills the row class from the JSON array's values)
    come out as the parser makes them of the decoded rows, malformed shapes through the same fallback."""
    import json

    monkeypatch.setitem(R_.EVENT_ROW_KINDS, "custom", _Custom)
    cls = {"events": R_.EventsRow, "caches": R_.CachesRow, "to_device": R_.ToDeviceRow}[stream]
    texts = [t for s, t in _HELD_ROWS if s == stream]
    data = b"".join(f"RDATA {stream} m {i + 1} {t}\n".encode() for i, t in enumerate(texts))
    cmds = wire_impl.LineDecoder().feed(data)
    parser = relay_impl.RowParser(cls, lambda row: ("untyped", row))
    reference = twin("replication._relay", "py").RowParser(cls, lambda row: ("untyped", row))
    facts = relay_impl.gather(cmds, 0, None, [], parser)[1]
    assert facts == [(i + 1, [reference(json.loads(t))]) for i, t in enumerate(texts)]
    assert [type(rows[0]) for _, rows in facts] == [type(reference(json.loads(t))) for t in texts]
    assert wire_impl.encode_lines(cmds) == wire_impl.encode_lines(wire_impl.LineDecoder().feed(data))  # as received


def test_commands_and_their_subclasses_free_what_they_hold(relay_impl: ModuleType) -> None:
    """Importing the compiled relay gives RdataCommand and PositionCommand a deallocator of their own: every
    slot's value is released, in a subclass too (with a __dict__, a __weakref__, slots of its own), and a
    cycle through a command is still collected."""
    import gc
    import weakref

    class Held:
        pass

    class Sub(RdataCommand):
        pass

    class Slotted(RdataCommand):
        __slots__ = ("extra",)

    assert relay_impl.RowWindow is not None  # the twin is imported (the compiled one installs the deallocator)
    makers = [
        lambda v: RdataCommand("s", "w", 1, v),
        lambda v: PositionCommand("s", "w", 1, v),
        lambda v: Slotted("s", "w", 1, v),
    ]
    for make in makers:
        _frees_what_it_holds(make)
    held = Held()
    gone = weakref.ref(held)
    sub = Sub("s", "w", 1, [held])
    sub.note = held  # type: ignore[attr-defined]  # in its __dict__
    seen: list[int] = []
    ref = weakref.ref(sub, lambda _r: seen.append(1))
    del held, sub
    assert gone() is None and seen == [1] and ref() is None
    cyc = Slotted("s", "w", 1, None)
    cyc.extra = [cyc]
    probe = Held()
    cyc.token = probe  # type: ignore[assignment]
    gone = weakref.ref(probe)
    del probe, cyc
    gc.collect()
    assert gone() is None


def test_rows_a_parser_builds_free_what_they_hold(relay_impl: ModuleType) -> None:
    """A RowParser's row classes get the commands' deallocator (compiled twin): rows it builds, rows made
    by hand and rows of a subclass release every value."""

    class Sub(R_.CachesRow):
        pass

    relay_impl.RowParser(R_.EventsRow)
    relay_impl.RowParser(R_.CachesRow)
    parser = relay_impl.RowParser(R_.CachesRow)
    for make in (
        lambda v: parser(["f", [v], 1]),
        lambda v: R_.CachesRow("f", [v], 1),
        lambda v: Sub("f", [v], 1),
        lambda v: R_.EventsRow("ev", v),
    ):
        _frees_what_it_holds(make)


def _frees_what_it_holds(make: Any) -> None:
    """The object ``make(value)`` keeps ``value`` alive while it lives and releases it when freed."""
    import weakref

    class Held:
        pass

    held = Held()
    gone = weakref.ref(held)
    obj = make(held)
    del held
    assert gone() is not None
    del obj
    assert gone() is None


def test_freed_commands_and_rows_made_again_hold_only_their_own_values(
    wire_impl: ModuleType, relay_impl: ModuleType
) -> None:
    """The compiled build keeps freed commands and typed rows for its next allocations (as CPython keeps
    freed floats): one made again holds exactly what it was made with, the class is referenced once per
    live or kept instance (no reference gained or lost over many rounds), and rows freed while another
    class's rows are being made never come back as the wrong class."""
    import sys

    parser = relay_impl.RowParser(R_.EventsRow)
    caches = relay_impl.RowParser(R_.CachesRow)

    def rounds(n: int) -> None:
        for r in range(n):
            data = b"".join(
                f'RDATA events m {r * 300 + i + 1} ["ev",["$e{r}.{i}","!r{i}:hs","m.room.message",null,null,null,null,false,false]]\n'
                .encode()
                for i in range(300)
            )
            cmds = wire_impl.LineDecoder().feed(data)
            facts = relay_impl.gather(cmds, 0, None, [], parser)[1]
            assert [(t, type(rows[0])) for t, rows in facts] == [(r * 300 + i + 1, R_.EventsRow) for i in range(300)]
            assert [c.token for c in cmds] == [r * 300 + i + 1 for i in range(300)]
            assert [rows[0].data.event_id for _, rows in facts] == [f"$e{r}.{i}" for i in range(300)]
            assert [rows[0].data.room_id for _, rows in facts] == [f"!r{i}:hs" for i in range(300)]
            made = [caches(["get_user", [f"@u{r}.{i}:hs"], i]) for i in range(100)]
            assert [(type(m), m.cache_func, m.keys, m.invalidation_ts) for m in made] == [
                (R_.CachesRow, "get_user", [f"@u{r}.{i}:hs"], i) for i in range(100)
            ]
            del cmds, facts, made

    rounds(5)  # every kept list as full as this work makes it
    before = [sys.getrefcount(c) for c in (RdataCommand, R_.EventsRow, R_.EventRow, R_.CachesRow)]
    rounds(20)
    assert [sys.getrefcount(c) for c in (RdataCommand, R_.EventsRow, R_.EventRow, R_.CachesRow)] == before
