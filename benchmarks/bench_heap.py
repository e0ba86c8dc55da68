"""Pending-completion heap: reserve+complete pairs per second, compiled vs pure twin vs plain heapq.

One benchmarked call handles N = 10,000 ids: reserved in order, completed
either in order or in a shuffled order (fixed seed).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from types import ModuleType

import pytest

from conftest import twin  # type: ignore[import-not-found]

N = 10_000
ORDER = list(range(2, N + 2))
SHUFFLED = ORDER[:]
random.Random(1234).shuffle(SHUFFLED)


@pytest.fixture
def heap_impl(impl: str) -> ModuleType:
    return twin("ids._heap", impl)


def in_order(heap_cls: type) -> int:
    heap = heap_cls(1)
    reserve = heap.reserve
    complete = heap.complete
    for i in ORDER:
        reserve(i)
        complete(i)
    return int(heap.position)


def shuffled(heap_cls: type) -> int:
    heap = heap_cls(1)
    reserve = heap.reserve
    complete = heap.complete
    for i in ORDER:
        reserve(i)
    for i in SHUFFLED:
        complete(i)
    return int(heap.position)


def heapq_in_order() -> int:
    """The least a Python heap can do: push then pop, no bookkeeping or checks."""
    h: list[int] = []
    pos = 1
    for i in ORDER:
        heapq.heappush(h, i)
        pos = heapq.heappop(h)
    return pos


def heapq_shuffled() -> int:
    """Plain heapq plus a set of completed ids; no validation."""
    h: list[int] = []
    done: set[int] = set()
    pos = 1
    for i in ORDER:
        heapq.heappush(h, i)
    for i in SHUFFLED:
        done.add(i)
        while h and h[0] in done:
            pos = heapq.heappop(h)
            done.discard(pos)
    return pos


def run(benchmark: pytest.FixtureRequest, fn: Callable[[], int]) -> None:
    result = benchmark(fn)  # type: ignore[operator]
    assert result == N + 1
    benchmark.extra_info["items"] = N  # type: ignore[attr-defined]  # reserve+complete pairs


@pytest.mark.benchmark(group="heap-in-order")
def test_heap_in_order(benchmark, heap_impl: ModuleType) -> None:  # type: ignore[no-untyped-def]
    run(benchmark, lambda: in_order(heap_impl.PendingHeap))


@pytest.mark.benchmark(group="heap-in-order")
def test_heapq_baseline_in_order(benchmark) -> None:  # type: ignore[no-untyped-def]
    run(benchmark, heapq_in_order)


@pytest.mark.benchmark(group="heap-shuffled")
def test_heap_shuffled(benchmark, heap_impl: ModuleType) -> None:  # type: ignore[no-untyped-def]
    run(benchmark, lambda: shuffled(heap_impl.PendingHeap))


@pytest.mark.benchmark(group="heap-shuffled")
def test_heapq_baseline_shuffled(benchmark) -> None:  # type: ignore[no-untyped-def]
    run(benchmark, heapq_shuffled)
