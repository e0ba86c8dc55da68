"""Streams: registry of Synapse's streams, their typed rows and update sources.

>>> from factstream.streams import default_registry
>>> reg = default_registry()
>>> reg.parse_row("caches", ["get_user_by_id", ["@bob:hs"], 1550574873251])
CachesRow(cache_func='get_user_by_id', keys=['@bob:hs'], invalidation_ts=1550574873251)
"""

from __future__ import annotations

from . import rows
from .registry import SYNAPSE_STREAMS, StreamDefinition, StreamRegistry, UnknownStreamError, default_registry
from .rows import *  # noqa: F403
from .rows import __all__ as _row_names
from .sources import TableUpdateSource, UpdateSource, Updates, UpdatesUnavailable

__all__ = [
    "StreamDefinition",
    "StreamRegistry",
    "UnknownStreamError",
    "SYNAPSE_STREAMS",
    "default_registry",
    "UpdateSource",
    "Updates",
    "UpdatesUnavailable",
    "TableUpdateSource",
    "rows",
    *_row_names,
]
