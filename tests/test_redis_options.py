"""Options of the Redis carrier that cannot work are refused when it is made.

A backoff of 0 used to reconnect in a busy loop (about 1000 log lines a
second with Redis down), a timeout of 0 or None failed or hung on the first
connect, and a batch of 2.5 or a queue bound of "10" raised a bare
TypeError deep in the send path. Each is now a ValueError or TypeError
naming the option, from ``RedisCarrier`` and from ``RedisReplication``,
which passes its options through. The accepted edges still connect to the
real Redis.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from factstream import wire
from factstream.replication import Follower, ReplicationHub
from factstream.transport.redis import RedisCarrier, RedisReplication

pytestmark = pytest.mark.redis
BOTH_EVENT_LOOPS = True

URL = "redis://127.0.0.1:6379/0"  # never contacted by the refused ones: they fail in __init__

REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    (dict(backoff_initial=0), ValueError, "backoff_initial must be > 0"),
    (dict(backoff_initial=-1), ValueError, "backoff_initial must be > 0"),
    (dict(backoff_max=0), ValueError, "backoff_max must be > 0"),
    (dict(backoff_initial=10, backoff_max=1), ValueError, r"backoff_initial \(10\) must not be above backoff_max"),
    (dict(backoff_initial=math.nan), ValueError, "backoff_initial must be > 0"),
    (dict(connect_timeout=0), ValueError, "connect_timeout must be > 0"),
    (dict(connect_timeout=-1), ValueError, "connect_timeout must be > 0"),
    (dict(connect_timeout=math.nan), ValueError, "connect_timeout must be > 0"),
    (dict(connect_timeout=None), TypeError, "connect_timeout must be a number of seconds"),
    (dict(ping_timeout=math.inf), ValueError, "ping_timeout must be > 0"),
    (dict(ping_timeout=math.nan), ValueError, "ping_timeout must be > 0"),
    (dict(ping_interval=math.nan), ValueError, "ping_interval must be > 0"),
    (dict(ping_interval=10, ping_timeout=5), ValueError, r"ping_interval \(10\) must not be above ping_timeout"),
    (dict(max_batch=2.5), TypeError, "max_batch must be a whole number, got float"),
    (dict(max_batch=0), ValueError, "max_batch must be at least 1"),
    (dict(max_pending="10"), TypeError, "max_pending must be a whole number, got str"),
    (dict(max_pending=None), TypeError, "max_pending must be a whole number"),
    (dict(max_pending=True), TypeError, "max_pending must be a whole number, got bool"),
    (dict(pipelining="no"), TypeError, "pipelining must be True or False, got str 'no'"),
    (dict(pipelining=0), TypeError, "pipelining must be True or False"),
    (dict(listen="yes"), TypeError, "listen must be True or False"),
    (dict(subscribe_user_ip=1), TypeError, "subscribe_user_ip must be True or False"),
    (dict(client_name=5), TypeError, "client_name must be a str, got int"),
    (dict(client_name=""), ValueError, "client_name must not be empty"),
    (dict(instance_name=b"w1"), TypeError, "instance_name must be a str, got bytes"),
]


@pytest.mark.parametrize(("options", "error", "message"), REFUSED, ids=[repr(o) for o, _, _ in REFUSED])
def test_carrier_refuses_options_that_cannot_work(options: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RedisCarrier(URL, "factstream-test-options", **options)


@pytest.mark.parametrize(("options", "error", "message"), REFUSED[:3], ids=[repr(o) for o, _, _ in REFUSED[:3]])
def test_replication_passes_its_carrier_options_through_the_checks(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    hub = ReplicationHub("r1", follower=Follower(sources={}))
    with pytest.raises(error, match=message):
        RedisReplication(hub, URL, "factstream-test-options", **options)


@pytest.mark.parametrize(
    ("url", "server_name", "message"),
    [(None, "s", "url must be a str, got NoneType"), (URL, None, "server_name must be a str, got NoneType"),
     (URL, b"s", "server_name must be a str, got bytes"), (URL, "", "server_name must not be empty")],
)
def test_carrier_refuses_a_missing_url_or_server_name(url: Any, server_name: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        RedisCarrier(url, server_name)


async def test_the_accepted_edges_connect_and_publish(redis_url: str, channel_prefix: str) -> None:
    """Whole-number seconds, backoff_initial == backoff_max, a batch of 1: all accepted and working."""
    got: list[wire.Command] = []
    edges = dict(ping_interval=1, ping_timeout=1, connect_timeout=2, backoff_initial=0.05, backoff_max=0.05)
    carrier = RedisCarrier(
        redis_url, channel_prefix, on_command=got.append, max_batch=1, max_pending=1, pipelining=False,
        client_name="factstream-test-edges", **edges,
    )
    assert (carrier.connect_timeout, carrier.backoff_initial, carrier.backoff_max) == (2.0, 0.05, 0.05)
    async with carrier:
        await carrier.wait_subscribed(5)
        assert carrier.send(wire.PingCommand("edge"))
        assert not carrier.send(wire.PingCommand("over the bound of 1"))
        await carrier.flush(5)
        deadline = time.monotonic() + 5
        while wire.PingCommand("edge") not in got:
            assert time.monotonic() < deadline, "the command never came back"
            await asyncio.sleep(0.01)


def test_send_many_of_something_that_is_not_commands_says_so() -> None:
    carrier = RedisCarrier("redis://127.0.0.1:6379", "x")
    with pytest.raises(TypeError, match="send_many takes an iterable of commands, got NoneType"):
        carrier.send_many(None)  # type: ignore[arg-type]
    assert carrier.pending == 0
