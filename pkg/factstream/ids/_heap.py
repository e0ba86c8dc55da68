"""Selector: the active implementation of the pending-completion heap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import load

if TYPE_CHECKING:
    from ._heap_py import INT64_MAX, INT64_MIN, PendingHeap
else:
    _impl = load("ids._heap")
    PendingHeap = _impl.PendingHeap
    INT64_MIN = _impl.INT64_MIN
    INT64_MAX = _impl.INT64_MAX

__all__ = ["PendingHeap", "INT64_MIN", "INT64_MAX"]
