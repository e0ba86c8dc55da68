"""Argument checks the two codec twins share, so that either build refuses a wrong argument with the same words.

Only the slow paths come here: ``LineDecoder.feed`` given something other
than ``bytes``, and each ``encode_redis_publish`` call's channels and counts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["chunk_bytes", "check_publish_args"]


def chunk_bytes(data: Any, method: str = "feed") -> bytes:
    """``data`` (bytes, bytearray, memoryview or another byte buffer) as bytes; anything else is a TypeError
    naming ``LineDecoder.<method>``.

    ``bytes(data)`` alone would turn an int ``n`` into ``n`` NUL bytes that
    then poison the next line.
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        raise TypeError(f"LineDecoder.{method} takes bytes as they arrive, not str: encode it first "
                        "(or give a whole line to parse_line, which takes str)")
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"LineDecoder.{method} takes bytes, bytearray or memoryview, got {type(data).__name__}") from None
    with view:
        return view.tobytes()


def check_publish_args(channel: Any, user_ip_channel: Any, counts: Any) -> None:
    """``encode_redis_publish``'s channels are bytes and ``counts`` a dict (command name -> number)."""
    for name, value in (("channel", channel), ("user_ip_channel", user_ip_channel)):
        if not isinstance(value, bytes):
            raise TypeError(f"encode_redis_publish: {name} must be bytes, got {type(value).__name__}")
    if not isinstance(counts, dict):
        raise TypeError(f"encode_redis_publish: counts must be a dict (command name -> number), "
                        f"got {type(counts).__name__}")
