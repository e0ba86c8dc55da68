"""The JetStream carrier against limits and outages a deployment meets: capped messages, a long outage.

An operator may create (or later change) the deployment's stream with a
``max_msg_size`` below the writer's page size. JetStream then refuses those
pages (err_code 10054) every time they are sent: the writer must publish the
same facts in smaller messages instead of retrying the same bytes forever,
with readers ending with exactly the facts written. A NATS outage must be
reported while it lasts (nats-py reconnects without a word), never with the
password of the URL.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import pytest

from factstream.replication import MemoryUpdateSource
from factstream.transport.nats import JetStreamLayout

from nats_helpers import (
    Cluster,
    NatsServer,
    Reader,
    Writer,
    assert_exact,
    deployment,
    nats_url,
    settle,
    start_all,
    stop_all,
)

__all__ = ["deployment", "nats_url"]


async def _stream_config(url: str, server_name: str) -> tuple[object, object]:
    import nats

    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    return nc, nc.jetstream()


def _write_mixed(w: Writer, rng: random.Random, n: int) -> None:
    """Mostly one-row facts of ~110 bytes, now and then a batch of 5 or of 300 rows (~33 KB, one fact)."""
    for i in range(n):
        rows = rng.choice([1, 5, 300]) if i % 50 == 0 else 1
        w.write([[f"@u{i}-{k}:" + "x" * 100] for k in range(rows)])


async def test_operator_capped_stream_is_published_in_messages_that_fit(nats_url: str, deployment: str) -> None:
    # The stream exists with max_msg_size 20000 before the writer starts: pages must fit from the start
    # (before the fix, every page above 20000 bytes was refused and retried forever; flush never returned).
    from nats.js.api import StreamConfig

    layout = JetStreamLayout.for_server(deployment)
    nc, js = await _stream_config(nats_url, deployment)
    try:
        await js.add_stream(StreamConfig(name=layout.stream, subjects=[layout.log_subjects],  # type: ignore[attr-defined]
                                         max_msg_size=20000))
        source = MemoryUpdateSource(capacity=1_000_000)
        w = Writer("w1", nats_url, deployment, source)
        r = Reader("r1", nats_url, deployment, source)
        try:
            await start_all([w, r])
            _write_mixed(w, random.Random(3), 2000)
            await w.nats.flush(20)
            await settle([w], [r], timeout=20)
            assert_exact([w], [r])
            assert w.nats.stats.publish_errors == 0
            assert w.nats.stats.too_large == 0
            assert r.nats.stats.fallbacks == 0 and r.source.queries == 0  # every fact came from the log
            assert w.nats.acked_positions()["to_device"] == w.stream.current_token()
        finally:
            await stop_all([w, r])
    finally:
        await nc.close()  # type: ignore[attr-defined]


async def test_stream_capped_while_running_gets_smaller_messages(nats_url: str, deployment: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    # max_msg_size lowered under a running writer: the refused pages are cut (whole facts kept together,
    # a fact larger than the cap cut by rows), a row larger than the cap is counted and logged; the
    # writer's acknowledged position reaches its last fact and the reader ends with exactly what was written.
    caplog.set_level(logging.INFO, logger="factstream")
    layout = JetStreamLayout.for_server(deployment)
    source = MemoryUpdateSource(capacity=1_000_000)
    w = Writer("w1", nats_url, deployment, source)
    r = Reader("r1", nats_url, deployment, source)
    nc, js = await _stream_config(nats_url, deployment)
    try:
        await start_all([w, r])
        for i in range(200):
            w.write([[f"@a{i}:" + "x" * 100]])
        await w.nats.flush(10)
        info = await js.stream_info(layout.stream)  # type: ignore[attr-defined]
        config = info.config
        config.max_msg_size = 20000
        await js.update_stream(config)  # type: ignore[attr-defined]
        _write_mixed(w, random.Random(5), 3000)
        w.write([["y" * 30000]])  # one row no message of this stream may hold
        w.write([["z"]])
        await w.nats.flush(30)
        await settle([w], [r], timeout=20)
        # The reader got the 30 KB row from the table (the writer could not publish it).
        assert_exact([w], [r])
        assert w.nats.stats.publish_errors >= 1
        assert w.nats.stats.too_large == 1
        assert w.nats.acked_positions()["to_device"] == w.stream.current_token()
        assert "refuses" in caplog.text and "max_msg_size" in caplog.text
    finally:
        await stop_all([w, r])
        await nc.close()  # type: ignore[attr-defined]


class _AuthServer(NatsServer):
    """A private nats-server that wants a user and password (so that logs can be checked for it)."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--user", "fsu", "--pass", PASSWORD]


PASSWORD = "Sekr3t-pw-91"


async def test_long_outage_is_reported_while_it_lasts_and_nothing_is_lost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The only NATS server is SIGKILLed for 12 s while the writer keeps writing. nats-py reconnects silently:
    # before the fix the writer said "connection lost" once and then nothing however long the outage lasted.
    caplog.set_level(logging.INFO, logger="factstream")
    server = _AuthServer(tmp_path / "n1")
    server.start()
    url = f"nats://fsu:{PASSWORD}@127.0.0.1:{server.port}"
    source = MemoryUpdateSource(capacity=1_000_000)
    w = Writer("w1", url, "outage", source)
    r = Reader("r1", url, "outage", source)
    try:
        await start_all([w, r])
        for i in range(300):
            w.write([[f"@a{i}:hs"]])
        await w.nats.flush(10)
        server.kill()
        for i in range(60):
            w.write([[f"@b{i}:hs"]])
            await asyncio.sleep(0.2)
        outage = [m for m in caplog.messages if "still unreachable" in m]
        # Both sides say it at 5 s and 10 s, with what is waiting.
        assert len(outage) >= 4, caplog.text[-3000:]
        assert any("lines queued" in m for m in outage)
        server.start()
        t0 = time.monotonic()
        await settle([w], [r], timeout=30)
        recovery = time.monotonic() - t0
        assert recovery < 20, recovery
        assert_exact([w], [r])
        assert any("back after" in m for m in caplog.messages)
    finally:
        await stop_all([w, r])
        server.stop()
    assert PASSWORD not in caplog.text


async def test_a_cluster_without_quorum_shows_in_status_as_unacknowledged_time(tmp_path: Path) -> None:
    # Two of three nodes die: the writer's link to the third stays up ("connected": true) while JetStream
    # stores nothing. Before, nothing in status() or `serve --status` showed the stall but a growing queue.
    from factstream.transport.nats import Retention

    cluster = Cluster(tmp_path)
    cluster.start()
    source = MemoryUpdateSource(capacity=100_000)
    first = cluster.nodes[0].url  # only the node that stays: the link never drops
    w = Writer("w1", first, "quorum", source, retention=Retention(replicas=3))
    try:
        await start_all([w], timeout=60)
        for i in range(20):
            w.write([[f"@a{i}:hs"]])
        await w.nats.flush(30)
        assert w.nats.unacknowledged_for() == 0 and w.nats.status()["unacknowledged_for"] == 0
        for node in cluster.nodes[1:]:
            node.kill()
        for i in range(20):
            w.write([[f"@b{i}:hs"]])
        await asyncio.sleep(5)
        status = w.nats.status()
        assert status["connected"] is True
        assert status["unacknowledged_for"] >= 3, status
        cluster.nodes[1].start()
        await w.nats.flush(60)
        assert w.nats.unacknowledged_for() == 0
    finally:
        await stop_all([w])
        cluster.stop()
