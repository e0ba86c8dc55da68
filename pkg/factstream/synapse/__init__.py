"""Tools for operators of a Synapse deployment: a database doctor and a replication watchdog.

``check`` (:mod:`.snapshot`, :mod:`.doctor`, :mod:`.repair`, :mod:`.report`)
reads a Synapse database's sequences, stream tables and ``stream_positions``
and explains each inconsistency with the SQL that repairs it (``--config``:
:mod:`.config`); ``watch`` (:mod:`.watch`, :mod:`.watchdog`, :mod:`.watch_db`,
:mod:`.watch_metrics`) follows a live deployment's replication over Redis. The
streams and their tables are Synapse's own (:mod:`.streams`).
"""

from __future__ import annotations

from .streams import SYNAPSE_ID_STREAMS, SynapseIdStream

__all__ = ["SYNAPSE_ID_STREAMS", "SynapseIdStream"]
