"""Selector: the active implementation of the archive column builder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import load

if TYPE_CHECKING:
    from ._archive_py import ArchiveColumns, timestamp_columns
else:
    _impl = load("spark._archive")
    ArchiveColumns = _impl.ArchiveColumns
    timestamp_columns = _impl.timestamp_columns

__all__ = ["ArchiveColumns", "timestamp_columns"]
