"""The Redis carrier's reply fast path (hiredis) is the one in use, and its fallback works.

The carrier drains every reply already buffered after one awaited read
through the parser's own ``gets`` (``transport.redis._buffered_replies``).
That only exists with redis-py's hiredis parser; with any other parser every
reply goes through ``read_response``. Both paths run against the real Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.utils import HIREDIS_AVAILABLE

from conftest import require
from factstream import wire
from factstream.transport.redis import RedisCarrier, _buffered_replies

pytestmark = pytest.mark.redis
BOTH_EVENT_LOOPS = True

FAST = dict(ping_interval=0.2, ping_timeout=2.0, connect_timeout=2.0, backoff_initial=0.02, backoff_max=0.2)


async def _connected(carrier: RedisCarrier) -> Any:
    """A connection made exactly as the carrier makes its own, connected."""
    conn = carrier._new_connection("probe")
    await conn.connect()
    return conn


async def _two_replies_in_one_read(conn: Any) -> tuple[Any, Any]:
    """Pipeline two PINGs, wait until both replies are in the socket, read once; then ask ``gets`` for the second."""
    gets, nothing = _buffered_replies(conn)
    await conn.send_packed_command(conn.pack_commands([("ECHO", "first"), ("ECHO", "second")]), check_health=False)
    await asyncio.sleep(0.2)  # both replies are now waiting in the kernel buffer: one read takes both
    first = await conn.read_response()
    second = gets()
    if second is nothing:  # the fallback: the second reply is still there for the public read
        second = await conn.read_response()
        return first, ("read", second)
    return first, ("gets", second)


async def test_hiredis_is_the_parser_the_carrier_uses(redis_url: str, channel_prefix: str) -> None:
    hiredis = require(module="hiredis", how="pip install 'redis[hiredis]' (a dependency of factstream)")
    assert HIREDIS_AVAILABLE
    carrier = RedisCarrier(redis_url, channel_prefix, **FAST)
    conn = await _connected(carrier)
    try:
        assert isinstance(conn._parser, _AsyncHiredisParser)
        assert isinstance(conn._parser._reader, hiredis.Reader)
        gets, _ = _buffered_replies(conn)
        assert gets == conn._parser._reader.gets  # the C reader's own gets, no coroutine
        # and it does what the carrier relies on: a reply buffered behind the one awaited comes out synchronously
        assert await _two_replies_in_one_read(conn) == (b"first", ("gets", b"second"))
    finally:
        await conn.disconnect()


async def test_without_hiredis_every_reply_goes_through_read_response(redis_url: str, channel_prefix: str) -> None:
    carrier = RedisCarrier(redis_url, channel_prefix, connection_options={"parser_class": _AsyncRESP2Parser}, **FAST)
    conn = await _connected(carrier)
    try:
        assert isinstance(conn._parser, _AsyncRESP2Parser)
        gets, nothing = _buffered_replies(conn)
        assert gets() is nothing
        assert await _two_replies_in_one_read(conn) == (b"first", ("read", b"second"))
    finally:
        await conn.disconnect()


@pytest.mark.parametrize("parser", ["hiredis", "python"])
async def test_carrier_delivers_bursts_in_order_on_either_parser(redis_url: str, channel_prefix: str, parser: str) -> None:
    options = {} if parser == "hiredis" else {"connection_options": {"parser_class": _AsyncRESP2Parser}}
    got: list[wire.Command] = []
    reader = RedisCarrier(redis_url, channel_prefix, on_command=got.append, instance_name="reader", **options, **FAST)
    writer = RedisCarrier(redis_url, channel_prefix, instance_name="writer", max_batch=500, **options, **FAST)
    sent = [wire.RdataCommand("caches", "writer", i // 3, ["get_user", [f"@u{i}:h"], i]) for i in range(3000)]
    async with reader, writer:
        await reader.wait_subscribed(5)
        assert writer.send_many(sent) == len(sent)
        await writer.flush(10)
        async with asyncio.timeout(20):
            while len(got) < len(sent):
                await asyncio.sleep(0.01)
    assert got == sent
    assert writer.stats.published == len(sent) and writer.stats.publish_errors == 0
    assert writer.stats.round_trips == len(sent) // 500  # every batch's replies drained in one round trip
    assert reader.stats.invalid == 0


async def test_write_through_and_reply_low_water_mark_are_usable_on_tcp(redis_url: str, channel_prefix: str) -> None:
    """send_many's direct write and the publisher's SO_RCVLOWAT rely on redis-py's stream; both find it."""
    from factstream.transport.redis import fastpaths

    carrier = RedisCarrier(redis_url, channel_prefix, **FAST)
    conn = await _connected(carrier)
    try:
        write = fastpaths._direct_write(conn)
        lowat = fastpaths._reply_lowat(conn)
        assert write is not None and lowat is not None
        lowat(5)
        assert write(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n")  # 8 bytes of reply: above the mark
        assert await conn.read_response() == b"hi"
        lowat(1)
    finally:
        await conn.disconnect()
