"""NatsReplication's options and lifecycle: what cannot work fails at once, with the reason.

An option that cannot work (a timeout of 0, a page of 0 rows, a duplicate
window longer than the stream keeps facts) is refused when the object is
made; a stream configuration JetStream refuses (replicas on a single server)
is logged as an error and raised by ``wait_connected`` instead of being
retried forever as "not available yet"; a stopped carrier says so instead of
looking connected. The end-to-end checks run against the shared JetStream
server (and one plain NATS server without JetStream, started here).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from factstream.replication import Follower, ReplicationHub
from factstream.transport.nats import JetStreamLayout, NatsReplication, Retention, StreamConfigError, delete_stream

from nats_helpers import FAST, NatsServer, deployment, free_port, nats_url

__all__ = ["deployment", "nats_url"]  # fixtures re-exported for pytest

BOTH_EVENT_LOOPS = True

URL = "nats://127.0.0.1:4222"


def reader(url: str, server_name: str, **options: Any) -> NatsReplication:
    hub = ReplicationHub("r1", follower=Follower(sources={}, typed=False))
    return NatsReplication(hub, url, server_name, **{**FAST, **options})


@pytest.mark.parametrize(("option", "value", "error"), [
    ("consumer_heartbeat", 0, ValueError),  # JetStream: "flow control also needs heartbeats", retried forever
    ("consumer_heartbeat", -1, ValueError),  # a busy loop recreating the consumer
    ("consumer_heartbeat", 0.05, ValueError),  # JetStream: "idle heartbeat needs to be >= 100ms"
    ("connect_timeout", 0, ValueError),  # never connects, "no servers available" forever
    ("api_timeout", 0, ValueError),  # never ready, "nats: timeout" forever
    ("heartbeat", 0, ValueError),  # a POSITION every 50 ms
    ("heartbeat", float("inf"), ValueError),
    ("ack_timeout", 0, ValueError),
    ("ack_timeout", -1, ValueError),
    ("ack_timeout", float("nan"), ValueError),
    ("connect_timeout", "5", TypeError),
    ("page_limit", 0, ValueError),  # facts lost: a "limited" page with no rows published as a jump
    ("page_limit", -1, ValueError),
    ("backfill", -1, ValueError),
    ("max_in_flight", 1.5, TypeError),
    ("page_rows", 2.5, TypeError),
    ("max_pending", True, TypeError),
    ("page_bytes", 1023, ValueError),
])
def test_an_option_that_cannot_work_is_refused_when_made(option: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=option):
        NatsReplication(ReplicationHub("w1"), URL, "hs", **{option: value})


def test_the_smallest_working_options_are_accepted() -> None:
    nats = NatsReplication(ReplicationHub("w1"), URL, "hs", consumer_heartbeat=0.1, backfill=0, page_limit=1,
                           page_rows=1, max_in_flight=1, ack_timeout=0.01, heartbeat=0.01)
    assert (nats.consumer_heartbeat, nats.backfill, nats.page_limit) == (0.1, 0, 1)


@pytest.mark.parametrize(("options", "error", "match"), [
    (dict(max_age=-1), ValueError, "max_age must be >= 0"),
    (dict(max_age=60), ValueError, r"duplicate_window \(120 s\) must not be longer than max_age \(60 s\)"),
    (dict(max_age=10, duplicate_window=11), ValueError, "duplicate_window"),
    (dict(duplicate_window=-1), ValueError, "duplicate_window must be >= 0"),
    (dict(max_age=float("nan")), ValueError, "max_age"),
    (dict(replicas=1.0), TypeError, "replicas"),
    (dict(replicas=6), ValueError, "replicas must be 1-5"),
    (dict(max_msgs=-2), ValueError, "max_msgs"),
    (dict(storage="disk"), ValueError, "storage"),
])
def test_a_retention_jetstream_would_refuse_is_refused_when_made(
        options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Retention(**options)


async def test_a_retention_at_the_limits_is_one_jetstream_accepts(nats_url: str, deployment: str) -> None:
    # The checks are JetStream's own: a window as long as max_age is accepted, and the stream is made.
    nats = reader(nats_url, deployment, retention=Retention(max_age=60, duplicate_window=60, storage="memory"))
    await nats.start()
    try:
        await nats.wait_connected(5)
    finally:
        await nats.stop()


async def test_a_stream_jetstream_refuses_fails_wait_connected_with_the_reason(
        nats_url: str, deployment: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "factstream.transport.nats")
    nats = reader(nats_url, deployment, retention=Retention(replicas=3))  # one server: no replicas
    await nats.start()
    try:
        with pytest.raises(StreamConfigError, match=r"replicas > 1 not supported .*Retention\(replicas=1\)") as info:
            await nats.wait_connected(3)
        assert (info.value.code, info.value.err_code) == (500, 10074)
        with pytest.raises(StreamConfigError):  # the same answer at once, again
            await nats.wait_connected(0.5)
        logged = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert any(level == logging.ERROR and "replicas > 1 not supported" in text and "gives up" in text
                   for level, text in logged), logged
        assert not any("not available yet" in text for _, text in logged), logged
        assert nats.connection is None
    finally:
        await nats.stop()
    assert not await delete_stream(nats_url, deployment), "the refused stream exists"


async def test_another_stream_in_the_way_is_reported_and_asked_again_until_it_is_gone(
        nats_url: str, deployment: str, caplog: pytest.LogCaptureFixture) -> None:
    import nats as nats_py

    caplog.set_level(logging.INFO, "factstream.transport.nats")
    layout = JetStreamLayout.for_server(deployment)
    blocker = f"BLOCKER_{layout.stream}"
    nc = await nats_py.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=blocker, subjects=[f"{layout.prefix}.>"], storage="memory")
        carrier = reader(nats_url, deployment)
        await carrier.start()
        try:
            with pytest.raises(TimeoutError):  # not given up: the server's state can change
                await carrier.wait_connected(0.3)
            logged = [(r.levelno, r.getMessage()) for r in caplog.records]
            assert any(level == logging.ERROR and "subjects overlap" in text and "delete it" in text
                       for level, text in logged), logged
            await js.delete_stream(blocker)
            await carrier.wait_connected(5)
        finally:
            await carrier.stop()
    finally:
        try:
            await nc.jetstream().delete_stream(blocker)
        except Exception:  # noqa: BLE001 - deleted above
            pass
        await nc.close()


async def test_jetstream_not_answering_is_retried_not_reported_as_a_configuration_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A plain NATS server without JetStream: "no responders" (503) is a server not ready, retried.
    server = NatsServer(tmp_path / "plain")
    server.argv = lambda: [server.binary, "-a", "127.0.0.1", "-p", str(server.port)]  # type: ignore[method-assign]
    server.start()
    caplog.set_level(logging.INFO, "factstream.transport.nats")
    try:
        nats = reader(server.url, "plain", api_timeout=0.2)
        await nats.start()
        try:
            with pytest.raises(TimeoutError):
                await nats.wait_connected(1)
        finally:
            await nats.stop()
    finally:
        server.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("not available yet" in m for m in messages), messages
    assert not any(r.levelno >= logging.ERROR for r in caplog.records), messages


async def test_a_stopped_carrier_never_looks_connected_and_cannot_start_again(
        nats_url: str, deployment: str) -> None:
    nats = reader(nats_url, deployment)
    await nats.start()
    await nats.wait_connected(5)
    await nats.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await nats.wait_connected(1)
    with pytest.raises(RuntimeError, match="stopped"):
        await nats.start()
    assert not nats.connected and nats.connection is None


async def test_stop_before_start_leaves_a_carrier_that_cannot_start() -> None:
    nats = reader(URL, "never-started")
    await nats.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await nats.start()
    with pytest.raises(RuntimeError, match="stopped"):
        await nats.wait_connected(1)


async def test_stop_wakes_a_caller_waiting_for_the_connection() -> None:
    nats = reader(f"nats://127.0.0.1:{free_port()}", "nobody-listens")  # retries connecting forever
    await nats.start()
    waiting = asyncio.ensure_future(nats.wait_connected(3))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await nats.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await asyncio.wait_for(waiting, 1)

