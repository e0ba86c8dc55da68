"""Stream ids: generators, positions, multi-writer tokens, the readers' change cache.

``create_id_generator(db, stream_name=..., instance_name=..., writers=..., tables=...)``
returns an :class:`IdGenerator`; see ``docs/ids.md`` for the rules.
"""

from __future__ import annotations

from .change_cache import AllEntitiesChangedResult, StreamChangeCache
from .errors import IdGeneratorError, PositionWaitTimeout, SequenceBehindError
from .generators import IdGenerator, create_id_generator, default_sequence_name
from .tokens import InstanceMap, MultiWriterStreamToken
from .tracker import Listener, PositionTracker

__all__ = [
    "AllEntitiesChangedResult",
    "IdGenerator",
    "IdGeneratorError",
    "InstanceMap",
    "Listener",
    "MultiWriterStreamToken",
    "PositionTracker",
    "PositionWaitTimeout",
    "SequenceBehindError",
    "StreamChangeCache",
    "create_id_generator",
    "default_sequence_name",
]
