"""Selector: the active implementation of the replication relay's hot loops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import load

if TYPE_CHECKING:
    from ._relay_py import (
        Broadcast, Fact, Fanout, LocalWriter, Router, RowParser, RowWindow, Sink, StreamEmitter, SyncGet, gather, same_source,
        tally,
    )
else:
    _impl = load("replication._relay")
    RowWindow = _impl.RowWindow
    LocalWriter = _impl.LocalWriter
    StreamEmitter = _impl.StreamEmitter
    Router = _impl.Router
    Broadcast = _impl.Broadcast
    Fanout = _impl.Fanout
    RowParser = _impl.RowParser
    gather = _impl.gather
    same_source = _impl.same_source
    tally = _impl.tally
    from ._relay_py import Fact, Sink, SyncGet

__all__ = [
    "RowWindow", "LocalWriter", "StreamEmitter", "Router", "Broadcast", "Fanout", "RowParser", "gather", "same_source", "tally",
    "Fact", "Sink", "SyncGet",
]
