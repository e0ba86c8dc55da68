"""Transport-independent replication core (see docs/replication.md).

* :class:`Publisher` (writer side): completed positions -> RDATA / POSITION.
* :class:`Follower` (reader side): positions, batches, catch-up, in-order delivery.
* :class:`ReplicationHub`: one per process; a transport drives it through the
  :class:`~factstream.replication.carrier.CommandSink` contract and the
  :class:`~factstream.replication.carrier.Connection` it implements.
* :class:`LocalStream`: an in-memory writer; :mod:`.caches`: cache invalidation.
* :class:`MemoryPipe`: two hubs connected in-process (tests, single-process apps).
* :class:`MemoryUpdateSource`: the recent facts of in-memory streams, kept by their writer.
"""

from __future__ import annotations

from .caches import CacheInvalidator, CacheRegistry, SimpleCache
from .carrier import CommandSink, Connection
from .follower import Follower, PositionTimeout, Update
from .hub import OutboxFull, ReplicationHub
from .local import LocalStream
from .memory import MemoryConnection, MemoryPipe
from .memory_source import MemoryUpdateSource
from .publisher import ForeignStreamError, Publisher

__all__ = [
    "Publisher",
    "ForeignStreamError",
    "Follower",
    "Update",
    "PositionTimeout",
    "ReplicationHub",
    "OutboxFull",
    "Connection",
    "CommandSink",
    "LocalStream",
    "CacheInvalidator",
    "CacheRegistry",
    "SimpleCache",
    "MemoryPipe",
    "MemoryConnection",
    "MemoryUpdateSource",
]
