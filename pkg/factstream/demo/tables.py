"""The demos' three streams, stored as plain tables with Synapse's row shapes.

``factstream serve``, ``tail --db``, ``logs stream`` (without ``--tables``)
and ``factstream demo`` use them (``events-demo`` has the event store's own
tables); an application describes its own tables with
:class:`factstream.replication.tables.StreamTable` the same way.
"""

from __future__ import annotations

from ..replication.tables import StreamTable

__all__ = ["DEMO_TABLES"]

#: to_device, receipts and caches, rows exactly as on the wire.
DEMO_TABLES: tuple[StreamTable, ...] = (
    StreamTable("to_device", "demo_to_device", ("entity",), frozenset({"entity"})),
    StreamTable("receipts", "demo_receipts", ("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data")),
    StreamTable("caches", "demo_caches", ("cache_func", "keys", "invalidation_ts")),
)
