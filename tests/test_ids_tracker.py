"""PositionTracker rules, and a Hypothesis state machine over several writers (both heap twins)."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from factstream.ids import IdGeneratorError, PositionTracker

WRITERS = ("w0", "w1", "w2")


def test_idle_writer_does_not_hold_the_linear_position(heap_impl: ModuleType) -> None:
    w0 = PositionTracker("s", "w0", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    assert w0.positions() == {"w0": 1, "w1": 1, "w2": 1}
    w0.advance("w1", 10)
    w0.advance("w2", 8)
    # w0 is idle: its next id comes from the shared sequence, above everything seen
    assert w0.current_token_for_writer("w0") == 10
    assert w0.current_token() == 8 and w0.max_token() == 10


def test_fetch_window_holds_the_position(heap_impl: ModuleType) -> None:
    """Between asking the sequence for an id and registering it, the writer is busy."""
    events: list[tuple[int, int]] = []
    w0 = PositionTracker("s", "w0", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    w0.add_listener(lambda s, i, old, new: events.append((old, new)))
    h = w0.begin_fetch()  # the sequence will hand us 5 ...
    w0.advance("w1", 9)  # ... meanwhile w1 got 6..9 and completed them
    assert w0.current_token_for_writer("w0") == 1  # not bumped: 5 is on its way
    w0.end_fetch(h, [5])
    assert w0.lowest_pending() == 5 and w0.pending == 1
    assert w0.complete([5]) == 9  # 5 completes, and the idle writer catches up to 9
    assert events == [(1, 5), (5, 9)]  # own fact, then the idle catch-up


def test_failed_fetch_releases_the_window(heap_impl: ModuleType) -> None:
    w0 = PositionTracker("s", "w0", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    h = w0.begin_fetch()
    w0.advance("w1", 4)
    assert w0.current_token_for_writer("w0") == 1
    w0.end_fetch(h, None)
    assert w0.current_token_for_writer("w0") == 4
    with pytest.raises(IdGeneratorError, match="without a matching begin_fetch"):
        w0.end_fetch(h, None)


def test_concurrent_fetches_hold_the_position_below_ids_on_their_way(heap_impl: ModuleType) -> None:
    """Two tasks fetch; the later answer registers first and completes: the earlier id is still coming."""
    w0 = PositionTracker("s", "w0", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    h1 = w0.begin_fetch()  # will get 2
    h2 = w0.begin_fetch()  # will get 3
    w0.end_fetch(h2, [3])
    assert w0.complete([3]) is None  # 2 may still be on its way
    assert w0.current_token_for_writer("w0") == 1
    w0.end_fetch(h1, [2])
    assert w0.complete([2]) == 3


def test_persisted_upto_walks_reported_positions(heap_impl: ModuleType) -> None:
    reader = PositionTracker("s", "r", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    reader.advance("w0", 2)
    reader.advance("w1", 3)
    assert reader.current_token() == 1  # w2 unheard
    assert reader.persisted_upto() == 3  # 2 and 3 are complete, 1 means empty
    reader.advance("w2", 5)
    assert reader.current_token() == 2 and reader.persisted_upto() == 3


def test_own_echo_and_unknown_writers(heap_impl: ModuleType) -> None:
    w0 = PositionTracker("s", "w0", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    assert not w0.advance("w0", 50)  # our own POSITION echoed back: ignored
    assert w0.advance("w9", 7)  # an unconfigured writer is tracked ...
    assert w0.current_token() == 1  # ... but does not move the linear position
    assert w0.positions()["w9"] == 7


def test_reader_cannot_reserve(heap_impl: ModuleType) -> None:
    reader = PositionTracker("s", "r", WRITERS, {}, heap_class=heap_impl.PendingHeap)
    with pytest.raises(IdGeneratorError, match="not a writer"):
        reader.begin_fetch()
    with pytest.raises(IdGeneratorError, match="at least one writer"):
        PositionTracker("s", "r", (), {})


# ----------------------------------------------------------------------------- state machine


class Streams(RuleBasedStateMachine):
    """Three writer processes sharing one sequence, plus a reader, exchanging positions.

    Never: a position (per writer, linear, persisted_upto; in any process)
    at or past an id that is still incomplete; a position going backwards.
    Always: once everything completed and positions were exchanged, every
    process reaches the largest id handed out.
    """

    heap_class: type = object

    def __init__(self) -> None:
        super().__init__()
        self.seq = 1  # last id handed out by the shared sequence
        self.procs = {
            name: PositionTracker("s", name, WRITERS, {}, heap_class=self.heap_class) for name in WRITERS + ("r",)
        }
        # per writer: fetches begun (None = id not yet allocated, else the allocated ids)
        self.fetches: dict[str, list[list[int] | None]] = {w: [] for w in WRITERS}
        self.handles: dict[str, list[int]] = {w: [] for w in WRITERS}
        self.pending: dict[str, set[int]] = {w: set() for w in WRITERS}  # registered, incomplete
        self.seen: dict[tuple[str, str], int] = {}
        self.reported: dict[str, list[tuple[int, int]]] = {w: [] for w in WRITERS}
        for w in WRITERS:
            self.procs[w].add_listener(lambda s, i, old, new, w=w: self.reported[w].append((old, new)))

    def incomplete(self, writer: str | None = None) -> set[int]:
        names = WRITERS if writer is None else (writer,)
        out: set[int] = set()
        for w in names:
            out |= self.pending[w]
            for f in self.fetches[w]:
                if f is not None:
                    out |= set(f)
        return out

    @rule(w=st.sampled_from(WRITERS))
    def begin_fetch(self, w: str) -> None:
        self.handles[w].append(self.procs[w].begin_fetch())
        self.fetches[w].append(None)

    @rule(w=st.sampled_from(WRITERS), n=st.integers(1, 3), data=st.data())
    def sequence_answers(self, w: str, n: int, data: st.DataObject) -> None:
        waiting = [i for i, f in enumerate(self.fetches[w]) if f is None]
        if not waiting:
            return
        i = data.draw(st.sampled_from(waiting))
        self.fetches[w][i] = list(range(self.seq + 1, self.seq + 1 + n))
        self.seq += n

    @rule(w=st.sampled_from(WRITERS), data=st.data())
    def end_fetch(self, w: str, data: st.DataObject) -> None:
        if not self.fetches[w]:
            return
        i = data.draw(st.integers(0, len(self.fetches[w]) - 1))
        ids = self.fetches[w].pop(i)
        self.procs[w].end_fetch(self.handles[w].pop(i), ids)  # None: the request failed before the sequence answered
        if ids:
            self.pending[w] |= set(ids)

    @rule(w=st.sampled_from(WRITERS), data=st.data(), failed=st.booleans())
    def complete(self, w: str, data: st.DataObject, failed: bool) -> None:
        # a failed write (rollback) completes exactly like a committed one
        if not self.pending[w]:
            return
        sid = data.draw(st.sampled_from(sorted(self.pending[w])))
        self.pending[w].discard(sid)
        self.procs[w].complete([sid])

    @rule(src=st.sampled_from(WRITERS), dst=st.sampled_from(WRITERS + ("r",)))
    def replicate(self, src: str, dst: str) -> None:
        self.procs[dst].advance(src, self.procs[src].current_token_for_writer(src))

    @invariant()
    def never_past_an_incomplete_id(self) -> None:
        everything = self.incomplete()
        lowest = min(everything, default=None)
        for name, proc in self.procs.items():
            for w in WRITERS:
                own = self.incomplete(w)
                pos = proc.current_token_for_writer(w)
                if own:
                    assert pos < min(own), (name, w, pos, sorted(own))
                key = (name, w)
                assert pos >= self.seen.get(key, 1), f"{name}'s view of {w} went backwards"
                self.seen[key] = pos
            if lowest is not None:
                assert proc.current_token() < lowest, (name, proc.current_token(), lowest)
                assert proc.persisted_upto() < lowest, (name, proc.persisted_upto(), lowest)
            assert proc.persisted_upto() >= proc.current_token()

    @invariant()
    def listener_reports_are_contiguous(self) -> None:
        for w, reports in self.reported.items():
            for (o1, n1), (o2, n2) in zip(reports, reports[1:]):
                assert o2 == n1 and n2 > o2
            if reports:
                assert reports[-1][1] == self.procs[w].current_token_for_writer(w)

    def teardown(self) -> None:
        for w in WRITERS:
            for f in self.fetches[w]:
                if f is None:
                    self.fetches[w][self.fetches[w].index(f)] = list(range(self.seq + 1, self.seq + 2))
                    self.seq += 1
            for handle, ids in zip(self.handles[w], self.fetches[w]):
                self.procs[w].end_fetch(handle, ids)
                self.pending[w] |= set(ids or [])
            self.fetches[w] = []
            self.handles[w] = []
            for sid in sorted(self.pending[w], reverse=True):
                self.procs[w].complete([sid])
            self.pending[w].clear()
        for _ in range(2):
            for src in WRITERS:
                for dst in WRITERS + ("r",):
                    self.replicate(src, dst)
        for name, proc in self.procs.items():
            assert proc.current_token() == self.seq, (name, proc.positions(), self.seq)
            assert proc.persisted_upto() == self.seq
            assert proc.max_token() == self.seq


def test_state_machine(heap_impl: ModuleType) -> None:
    machine = type("StreamsMachine", (Streams,), {"heap_class": heap_impl.PendingHeap})
    run_state_machine_as_test(machine, settings=settings(max_examples=150, stateful_step_count=60, deadline=None))
