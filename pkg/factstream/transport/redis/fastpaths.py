"""Fast paths into redis-py's asyncio connection, each with a fallback.

The Redis carrier uses redis-py for connecting, AUTH, TLS and reconnects, and
reaches under its public API in three places, all here: the hiredis reader's
own ``gets`` (replies already buffered, without a coroutine), a synchronous
write on the connection's stream (``send_many`` writes ahead), and the
socket's low-water mark (wake the publisher when a batch's replies are in).
Each returns a fallback (or None) when redis-py's internals are not what they
were, so a redis-py upgrade makes the carrier slower, never wrong;
tests/test_redis_hiredis.py checks that all three are found.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.asyncio.connection import Connection as TcpRedisConnection
from redis.asyncio.connection import SSLConnection

_NOTHING: Any = object()


def _buffered_replies(conn: AbstractConnection) -> tuple[Callable[[], Any], Any]:
    """``(gets, nothing)``: ``gets()`` returns the next reply already buffered, or ``nothing``.

    With hiredis this is the parser's own ``gets`` (a C call, no coroutine),
    which lets a burst of pub/sub messages or PUBLISH replies be consumed in
    one synchronous loop after a single awaited read. Without it (or if
    redis-py's internals change) ``gets`` always says ``nothing`` and every
    reply goes through the public ``read_response``.
    """
    reader = getattr(getattr(conn, "_parser", None), "_reader", None)
    try:
        from redis._parsers.hiredis import NOT_ENOUGH_DATA
    except ImportError:  # pragma: no cover - depends on the redis-py version
        reader = None
    gets = getattr(reader, "gets", None)
    if gets is None:
        return (lambda: _NOTHING), _NOTHING
    return gets, NOT_ENOUGH_DATA


def _direct_write(conn: AbstractConnection) -> Callable[[bytes], bool] | None:
    """A synchronous ``write(data)`` on ``conn``'s stream, or None if redis-py's internals changed.

    ``send_many`` writes each full chunk of PUBLISH requests as soon as it is
    packed, so Redis works on one chunk while the next is being encoded (the
    asyncio transport sends at once and buffers what the kernel refuses).
    Without it every batch waits for the publisher task to write it.
    """
    writer = getattr(conn, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return None
    transport = writer.transport

    def write(data: bytes) -> bool:
        if transport.is_closing():
            return False
        transport.write(data)
        return True

    return write


#: The most bytes of replies the publisher waits for before its event loop wakes it (SO_RCVLOWAT).
REPLY_LOWAT_MAX = 65536


def _reply_lowat(conn: AbstractConnection) -> Callable[[int], None] | None:
    """``set(n)``: wake the publisher only once ``n`` bytes of replies are in the socket; None if unusable.

    A pipelined batch's replies (``:0\r\n``, 4 bytes or more each) arrive in
    small pieces as Redis works through it; waking for each piece costs an
    event-loop turn and a redis-py read. With ``4 * (replies still due) - 3``
    bytes as the kernel's low-water mark (at most one reply may already be
    partly read), the kernel never holds back the last replies. Plain TCP only:
    under TLS the bytes on the wire are not the replies' bytes, and a record
    may sit half-read in the TLS layer.
    """
    if not isinstance(conn, TcpRedisConnection) or isinstance(conn, SSLConnection):
        return None
    writer = getattr(conn, "_writer", None)
    sock = writer.transport.get_extra_info("socket") if isinstance(writer, asyncio.StreamWriter) else None
    option = getattr(socket, "SO_RCVLOWAT", None)
    if sock is None or option is None:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    except OSError:
        return None

    def set_lowat(n: int) -> None:
        sock.setsockopt(socket.SOL_SOCKET, option, n)

    return set_lowat
