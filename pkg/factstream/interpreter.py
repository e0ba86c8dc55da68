"""Interpreter settings for a process that moves rows all day (``factstream serve``).

Two defaults of CPython cost such a process much of its time:

- The cyclic collector runs its young generation every 700 container
  allocations. A writer makes several containers per row (the row's list, its
  data's dict, the tuples carrying it) that live until the row is sent, so
  nearly every pass finds them alive and walks them again, and the oldest
  generation, start-up's modules and classes included, is walked whenever it
  has grown by a quarter. :func:`settle` moves what start-up made out of the
  collector's way (``gc.freeze()``) and runs the young generation every
  ``young`` allocations, by when most rows are gone. Cycles are still found.
- A thread waiting for the GIL gets it after the holder's switch interval
  (5 ms). A SQLite writer's database thread needs the GIL back after every
  statement it runs, so while the event loop is busy making the next
  transaction, each small write (a position, an id block) waited 5 ms, and
  the transactions queued behind it too. :func:`settle` sets 0.5 ms.

For the process's own entry point, after start-up; a library leaves these to
its application, so nothing else in factstream calls it.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["settle"]


def settle(*, young: int = 50_000, switch_interval: float = 0.0005) -> None:
    """Freeze start-up's objects, collect the young generation every ``young`` allocations, hand the GIL over
    after ``switch_interval`` seconds."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(max(young, 1), older, oldest)
    sys.setswitchinterval(switch_interval)
