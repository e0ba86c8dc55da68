"""The pending-completion heap, on both twins (``heap_impl`` is parametrised over c and py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream import _compat


def test_seed_worked_example(heap_impl: ModuleType) -> None:
    """The table from the streams seed, step by step."""
    heap = heap_impl.PendingHeap(1)
    assert heap.position == 1
    heap.reserve(2)
    assert heap.position == 1
    heap.reserve(3)
    assert heap.position == 1
    assert heap.complete(3) is None  # waiting for 2
    assert heap.position == 1
    assert heap.complete(2) == 3  # jumps 1 -> 3
    heap.reserve(4)
    heap.reserve(5)
    heap.reserve(6)
    assert heap.position == 3
    assert heap.complete(5) is None
    assert heap.position == 3
    assert heap.complete(4) == 5  # jumps 3 -> 5 although 6 is pending
    assert heap.complete(6) == 6
    assert heap.is_idle() and len(heap) == 0 and heap.pending == 0


def test_holes_and_sparse_ids(heap_impl: ModuleType) -> None:
    """Ids of other writers (gaps) do not matter; a failed id is a hole moved past."""
    heap = heap_impl.PendingHeap(10)
    heap.reserve_many([13, 17, 20])
    assert heap.lowest_pending() == 13
    assert heap.pending_ids() == [13, 17, 20]
    assert heap.complete(17) is None
    assert heap.is_pending(13) and not heap.is_pending(17) and not heap.is_pending(99)
    assert heap.complete(13) == 17  # 13 may have been a rollback: still completed
    assert heap.complete_many([20]) == 20


def test_out_of_order_reservation(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(1)
    heap.reserve(5)
    heap.reserve(3)  # a concurrent task got its id later
    assert heap.lowest_pending() == 3
    assert heap.complete(5) is None
    assert heap.complete(3) == 5


def test_errors(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(5)
    with pytest.raises(ValueError, match="at or below the position 5"):
        heap.reserve(5)
    heap.reserve(7)
    with pytest.raises(ValueError, match="already reserved"):
        heap.reserve(7)
    with pytest.raises(ValueError, match="was not reserved"):
        heap.complete(8)
    heap.reserve(9)
    assert heap.complete(9) is None
    with pytest.raises(ValueError, match="already completed"):
        heap.complete(9)
    with pytest.raises(OverflowError, match="64-bit"):
        heap.reserve(2**63)
    with pytest.raises(OverflowError, match="64-bit"):
        heap_impl.PendingHeap(-(2**63) - 1)
    with pytest.raises(TypeError):
        heap.reserve("12")
    # batch calls are all-or-nothing
    with pytest.raises(ValueError, match="already reserved"):
        heap.reserve_many([11, 12, 11])
    assert heap.pending_ids() == [7]
    with pytest.raises(ValueError, match="was not reserved"):
        heap.complete_many([7, 100])
    assert heap.pending_ids() == [7]
    with pytest.raises(ValueError, match="already completed"):
        heap.complete_many([7, 7])
    assert heap.complete_many([7]) == 9


def test_batch_calls_undo_a_partial_batch(heap_impl: ModuleType) -> None:
    """A batch failing late (after the table grew for it, or in the caller's iterable) leaves no trace."""
    heap = heap_impl.PendingHeap(0)
    heap.reserve_many(range(1, 6))
    with pytest.raises(ValueError, match="already reserved"):
        heap.reserve_many([*range(10, 500), 3])
    assert heap.pending_ids() == [1, 2, 3, 4, 5] and len(heap) == 5

    def failing(*ids: int) -> Iterator[int]:
        yield from ids
        raise RuntimeError("the caller's iterable broke")

    with pytest.raises(RuntimeError, match="iterable broke"):
        heap.complete_many(failing(2, 4))
    with pytest.raises(RuntimeError, match="iterable broke"):
        heap.reserve_many(failing(600, 601))
    assert heap.pending_ids() == [1, 2, 3, 4, 5] and heap.pending == 5
    heap.reserve_many(range(10, 500))  # none of them was left behind
    assert heap.complete_many([2, 4, 1]) == 2
    assert heap.complete_many([5, 3]) == 5 and heap.pending == 490


def test_advance_only_when_idle(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(1)
    assert heap.advance(1) is None
    assert heap.advance(10) == 10
    assert heap.advance(4) is None  # never backwards
    heap.reserve(11)
    assert heap.advance(50) is None  # busy: held back by 11
    assert heap.position == 10
    assert heap.complete(11) == 11
    assert heap.advance(50) == 50
    with pytest.raises(ValueError):
        heap.reserve(30)


def test_negative_range_and_extremes(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(-(2**63))
    heap.reserve(-(2**63) + 1)
    heap.reserve(2**63 - 1)
    assert heap.complete(2**63 - 1) is None
    assert heap.complete(-(2**63) + 1) == 2**63 - 1


def test_large_shuffled_run(heap_impl: ModuleType) -> None:
    rng = random.Random(7)
    heap = heap_impl.PendingHeap(1)
    ids = list(range(2, 20002))
    heap.reserve_many(ids)
    rng.shuffle(ids)
    best = 1
    for i in ids:
        pos = heap.complete(i)
        if pos is not None:
            assert pos > best
            best = pos
    assert best == 20001 and heap.position == 20001 and len(heap) == 0


def test_repr(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(3)
    heap.reserve(4)
    assert repr(heap) == "PendingHeap(position=3, pending=1, tracked=1, holds=0)"


# ----------------------------------------------------------------------- differential

OPS = st.lists(
    st.tuples(st.sampled_from(["reserve", "complete", "advance", "reserve_many", "complete_many"]), st.integers(0, 40)),
    max_size=120,
)


class Model:
    """Brute-force reference: the definition, no data structure."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.reserved: dict[int, bool] = {}

    def recompute(self) -> int | None:
        pending = [i for i, d in self.reserved.items() if not d]
        done = [i for i, d in self.reserved.items() if d and (not pending or i < min(pending))]
        if not done:
            return None
        self.position = max(done)
        for i in done:
            del self.reserved[i]
        return self.position


def run(impl: ModuleType | Model, ops: list[tuple[str, int]], start: int) -> list[object]:
    """Apply ops; record each result or error type. Ids derive from op args deterministically."""
    out: list[object] = []
    for name, arg in ops:
        try:
            if isinstance(impl, Model):
                if name == "reserve":
                    if start + arg <= impl.position:
                        raise ValueError
                    if start + arg in impl.reserved:
                        raise ValueError
                    impl.reserved[start + arg] = False
                    res: object = None
                elif name == "reserve_many":
                    ids = [start + arg, start + arg + 1]
                    if any(i <= impl.position or i in impl.reserved for i in ids):
                        raise ValueError
                    for i in ids:
                        impl.reserved[i] = False
                    res = None
                elif name in ("complete", "complete_many"):
                    ids = [start + arg] if name == "complete" else [start + arg, start + arg + 1]
                    if any(impl.reserved.get(i) is not False for i in ids):
                        raise ValueError
                    for i in ids:
                        impl.reserved[i] = True
                    res = impl.recompute()
                else:
                    if impl.reserved or start + arg <= impl.position:
                        res = None
                    else:
                        impl.position = start + arg
                        res = impl.position
            else:
                if name == "reserve":
                    res = impl.reserve(start + arg)
                elif name == "reserve_many":
                    res = impl.reserve_many([start + arg, start + arg + 1])
                elif name == "complete":
                    res = impl.complete(start + arg)
                elif name == "complete_many":
                    res = impl.complete_many([start + arg, start + arg + 1])
                else:
                    res = impl.advance(start + arg)
            out.append(res)
        except ValueError:
            out.append(ValueError)
        out.append(impl.position)
    return out


@settings(max_examples=300, deadline=None)
@given(ops=OPS, start=st.sampled_from([0, 1, -50, 2**40]))
def test_differential_against_model_and_other_twin(ops: list[tuple[str, int]], start: int) -> None:
    expected = run(Model(start), ops, start)
    py = _compat.load("ids._heap", "py")
    assert run(py.PendingHeap(start), ops, start) == expected
    if not _compat.NO_EXTENSIONS:
        c = _compat.load("ids._heap", "c")
        assert run(c.PendingHeap(start), ops, start) == expected


@settings(max_examples=200, deadline=None)
@given(perm=st.permutations(list(range(2, 40))))
def test_position_never_passes_an_incomplete_id(heap_impl: ModuleType, perm: list[int]) -> None:
    heap = heap_impl.PendingHeap(1)
    heap.reserve_many(range(2, 40))
    incomplete = set(range(2, 40))
    last = 1
    for i in perm:
        pos = heap.complete(i)
        incomplete.discard(i)
        assert heap.position >= last
        last = heap.position
        if incomplete:
            assert heap.position < min(incomplete)
            assert heap.position == min(incomplete) - 1 or heap.position == 1
        if pos is not None:
            assert pos == heap.position
    assert heap.position == 39


def test_selector_uses_the_compiled_twin_when_built() -> None:
    """Sentinel: a build that should be compiled really selects _heap_c."""
    from factstream.ids import _heap

    expected = "_heap_py" if _compat.IMPL == "python" else "_heap_c"
    assert _heap.PendingHeap.__module__ == f"factstream.ids.{expected}"


def test_switch_selects_the_pure_twin() -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, FACTSTREAM_NO_EXTENSIONS="1")
    out = subprocess.run(
        [sys.executable, "-c", "from factstream.ids import _heap; print(_heap.PendingHeap.__module__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "factstream.ids._heap_py"


def test_hold_keeps_the_position_below_an_id_on_its_way(heap_impl: ModuleType) -> None:
    heap = heap_impl.PendingHeap(1)
    heap.hold(1)  # a sequence request is in flight: its id will be > 1
    assert not heap.is_idle() and heap.holds == 1
    heap.reserve(3)  # another request answered first
    assert heap.complete(3) is None  # the held id may be 2
    assert heap.advance(10) is None  # not idle
    heap.reserve(2)
    assert heap.release(1) is None  # 2 still pending
    assert heap.complete(2) == 3
    with pytest.raises(ValueError, match="no hold at 7"):
        heap.release(7)
    with pytest.raises(ValueError, match="below the position 3"):
        heap.hold(2)
    heap.hold(3)
    heap.hold(5)
    heap.reserve_many([4, 6])
    assert heap.complete_many([4, 6]) is None  # the id held at 3 may still be below 4
    assert heap.release(3) == 4  # 6 still waits: the id held at 5 may be below it
    assert heap.release(5) == 6
    assert heap.is_idle()


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(2, 2**62), min_size=1, max_size=600, unique=True),
    seed=st.integers(0, 2**32),
)
def test_differential_wide_ids_and_interleaving(ids: list[int], seed: int) -> None:
    """Sparse ids, interleaved reserve/complete (exercises the compiled hash table's growth and deletion)."""
    rng = random.Random(seed)
    twins = [_compat.load("ids._heap", "py")]
    if not _compat.NO_EXTENSIONS:
        twins.append(_compat.load("ids._heap", "c"))
    heaps = [t.PendingHeap(1) for t in twins]
    todo = sorted(ids)
    reserved: list[int] = []
    while todo or reserved:
        if todo and (not reserved or rng.random() < 0.55):
            sid = todo.pop(0)
            outs = [h.reserve(sid) for h in heaps]
            reserved.append(sid)
        else:
            sid = reserved.pop(rng.randrange(len(reserved)))
            outs = [h.complete(sid) for h in heaps]
        assert len(set(outs)) == 1
        assert len({(h.position, h.pending, len(h)) for h in heaps}) == 1
        probe = rng.choice(ids)
        assert len({h.is_pending(probe) for h in heaps}) == 1
    assert all(h.position == max(ids) and h.is_idle() for h in heaps)
