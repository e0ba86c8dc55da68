"""The replication wire codec: Synapse's line protocol, byte for byte.

>>> from factstream import wire
>>> cmd = wire.parse_line(b'RDATA events master 54 ["$ev:hs","!room:hs"]')
>>> cmd.token, cmd.row
(54, ['$ev:hs', '!room:hs'])
>>> wire.encode(cmd)
b'RDATA events master 54 ["$ev:hs","!room:hs"]'

``encode`` gives one line without a newline (as published on Redis);
``encode_lines`` gives newline-terminated lines (for TCP); ``LineDecoder``
turns a byte stream into commands incrementally.
"""

from __future__ import annotations

from ._wire import DEFAULT_MAX_LINE_LENGTH, LineDecoder, encode, encode_lines, encode_redis_publish, parse_line
from .commands import *  # noqa: F403 - the command classes are part of this API
from .commands import __all__ as _command_names
from .errors import ProtocolError

__all__ = [
    "parse_line",
    "encode",
    "encode_lines",
    "encode_redis_publish",
    "LineDecoder",
    "DEFAULT_MAX_LINE_LENGTH",
    "ProtocolError",
    *_command_names,
]
