"""Replication over NATS JetStream end to end, against the shared JetStream server.

Writers and readers are real :class:`ReplicationHub` s driven by
:class:`NatsReplication`; a shared :class:`MemoryUpdateSource` stands for the
database, wrapped so that every query a reader makes of it is counted (the
JetStream carrier must not need any while the log holds the facts). Every
check compares, per reader and per writer, the exact list of facts delivered
with the list written.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from factstream import wire
from factstream.replication import MemoryUpdateSource, Publisher, ReplicationHub
from factstream.transport.nats import JetStreamLayout, NatsReplication, Retention, subject_token

from nats_helpers import (
    FAST,
    STREAM,
    Reader,
    Writer,
    assert_exact,
    deployment,
    eventually,
    nats_url,
    random_fact,
    settle,
    start_all,
    stop_all,
    writer_and_reader,
)

__all__ = ["deployment", "nats_url"]  # fixtures re-exported for pytest

BOTH_EVENT_LOOPS = True


def test_layout_names_are_valid_subjects() -> None:
    layout = JetStreamLayout.for_server("example.com")
    assert layout.stream == "FACTSTREAM_example_2Ecom"
    assert layout.log_subject("to_device", "event_persister-1") == "factstream.example%2Ecom.log.to_device.event_persister-1"
    assert subject_token("a b.c*>") == "a%20b%2Ec%2A%3E"
    with pytest.raises(ValueError, match="server name"):
        JetStreamLayout.for_server("bad name")
    with pytest.raises(ValueError, match="replicas"):
        Retention(replicas=0).stream_config(layout)


async def test_exactly_once_in_order_with_several_writers_and_readers(nats_url: str, deployment: str) -> None:
    source = MemoryUpdateSource()
    rng = random.Random(1)
    writers = [Writer(f"w{i}", nats_url, deployment, source) for i in (1, 2)]
    readers = [Reader(f"r{i}", nats_url, deployment, source) for i in (1, 2, 3)]
    await start_all([*writers, *readers])
    try:
        for i in range(300):
            for w in writers:
                w.write(random_fact(rng, w.name, i))
            if i % 50 == 0:
                await asyncio.sleep(0.01)
        await settle(writers, readers)
        assert_exact(writers, readers)
        for w in writers:
            await w.nats.flush(10)
            assert w.nats.acked_positions() == {STREAM: w.stream.current_token()}
        for r in readers:
            assert r.source.queries == 0, "a reader queried the database although the log held every fact"
            assert r.nats.stats.fallbacks == 0 and r.nats.stats.invalid == 0
    finally:
        await stop_all([*writers, *readers])


async def test_control_commands_travel_beside_the_log(nats_url: str, deployment: str) -> None:
    source = MemoryUpdateSource()
    writer = Writer("master", nats_url, deployment, source)
    reader = Reader("worker1", nats_url, deployment, source)
    heard: list[wire.Command] = []
    writer.hub.on("USER_SYNC", lambda cmd, conn: heard.append(cmd))
    writer.hub.on("FEDERATION_ACK", lambda cmd, conn: heard.append(cmd))
    reader_heard: list[wire.Command] = []
    reader.hub.on("REMOTE_SERVER_UP", lambda cmd, conn: reader_heard.append(cmd))
    await start_all([writer, reader])
    try:
        reader.hub.user_sync("@alice:hs", "DEV", True, 1)
        reader.hub.send(wire.FederationAckCommand("worker1", 12))
        writer.hub.send(wire.RemoteServerUpCommand("other.example.org"))
        await eventually(lambda: len(heard) == 2 and len(reader_heard) == 1, what="control commands")
        assert heard[0] == wire.UserSyncCommand("worker1", "@alice:hs", "DEV", True, 1)
        assert heard[1] == wire.FederationAckCommand("worker1", 12)
        assert writer.hub.syncing_users() == {"worker1": {("@alice:hs", "DEV")}}
    finally:
        await stop_all([writer, reader])


async def test_restarted_reader_resumes_from_the_log_without_a_database_query(nats_url: str, deployment: str) -> None:
    source = MemoryUpdateSource()
    rng = random.Random(3)
    writer = Writer("w1", nats_url, deployment, source)
    first = Reader("r1", nats_url, deployment, source)
    await start_all([writer, first])
    try:
        for i in range(200):
            writer.write(random_fact(rng, "w1", i))
        await settle([writer], [first])
        await first.nats.stop()
        await first.follower.close()
        positions = {k: v for k, v in first.follower.positions().items() if v is not None}
        for i in range(200, 400):  # written while the reader is away
            writer.write(random_fact(rng, "w1", i))
        await writer.nats.flush(10)
        again = Reader("r1", nats_url, deployment, source, positions=positions, got=first.got)
        await start_all([again])
        for i in range(400, 450):
            writer.write(random_fact(rng, "w1", i))
        await settle([writer], [again])
        assert_exact([writer], [again])
        assert again.source.queries == 0, "the restarted reader queried the database"
        assert again.follower.stats["catchup_fetches"] == 0
        assert again.nats.stats.lookups > 0  # it found its place in the log by sequence
        assert again.nats.stats.skipped == 0  # and started exactly there
        await stop_all([again])
    finally:
        await stop_all([writer])


async def test_live_only_reader_starts_at_the_writers_position(nats_url: str, deployment: str) -> None:
    source = MemoryUpdateSource()
    writer = Writer("w1", nats_url, deployment, source)
    await start_all([writer])
    try:
        for i in range(50):
            writer.write([[f"old{i}"]])
        await writer.nats.flush(10)
        reader = Reader("tail", nats_url, deployment, source, start_position=None)
        await start_all([reader])
        assert reader.follower.position(STREAM, "w1") == 50
        token = writer.write([["new"]])
        await reader.follower.wait_for_position(STREAM, "w1", token, 10)
        assert reader.got == {"w1": [(token, [["new"]])]}
        assert reader.source.queries == 0
        await stop_all([reader])
    finally:
        await stop_all([writer])


async def test_restarted_writer_republishes_what_jetstream_misses(nats_url: str, deployment: str) -> None:
    """Facts committed while the writer's link was gone, and a batch cut in the middle, reach JetStream once."""
    source = MemoryUpdateSource()
    rng = random.Random(4)
    writer = Writer("w1", nats_url, deployment, source)
    reader = Reader("r1", nats_url, deployment, source)
    await start_all([writer, reader])
    try:
        for i in range(100):
            writer.write(random_fact(rng, "w1", i))
        await writer.nats.flush(10)
        await writer.nats.stop()  # the writer "crashes": what it commits now never reaches JetStream
        crashed_at = writer.stream.current_token()
        for i in range(100, 180):
            writer.write(random_fact(rng, "w1", i))
        # ... and the first two rows of a three-row fact made it before the crash.
        cut = writer.stream.current_token() + 1
        writer.write([["a"], ["b"], ["c"]])
        await publish_raw(nats_url, deployment, [
            (wire.RdataCommand(STREAM, "w1", None, ["a"]), f"{STREAM}:w1:{cut}:0", crashed_at),
            (wire.RdataCommand(STREAM, "w1", None, ["b"]), f"{STREAM}:w1:{cut}:1", crashed_at),
        ])
        restarted = Writer("w1", nats_url, deployment, source, start_token=writer.stream.current_token())
        restarted.written = writer.written
        restarted.stream = writer.stream  # same "database"
        writer.stream.add_listener(restarted.publisher.notify)
        await start_all([restarted])
        for i in range(200, 260):
            writer.write(random_fact(rng, "w1", i))
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert restarted.nats.stats.repairs == 1 and restarted.nats.stats.repaired_rows >= 80
        assert reader.source.queries == 0, "no hole: the reader never needed the database"
        assert reader.nats.stats.broken_batches == 1  # the cut batch was dropped when it restarted
        await restarted.nats.flush(10)
        again = Reader("r2", nats_url, deployment, source)
        await start_all([again])
        await settle([writer], [again])
        assert_exact([writer], [again])
        assert again.source.queries == 0
        await stop_all([restarted, again])
    finally:
        await stop_all([reader])


class CutWithoutRows:
    """A source whose first answer is a page "cut" with no rows, as ``page(limit=0)`` gave; then the real one."""

    def __init__(self, inner: MemoryUpdateSource) -> None:
        self.inner = inner
        self.bad_answers = 0

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Any:
        if not self.bad_answers:
            self.bad_answers += 1
            return [], upto_token, True
        return await self.inner.get_updates(instance_name, from_token, upto_token, limit)


async def test_a_cut_page_without_rows_is_retried_not_published_as_a_jump(
        nats_url: str, deployment: str, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted writer re-publishing from a source that answers "limited, no rows" once loses nothing."""
    caplog.set_level(logging.INFO, "factstream.transport.nats")
    source = MemoryUpdateSource()
    writer = Writer("w1", nats_url, deployment, source)
    reader = Reader("r1", nats_url, deployment, source)
    await start_all([writer, reader])
    publisher = Publisher("w1")
    restarted = None
    try:
        for i in range(5):
            writer.write([[f"x{i}"]])
        await writer.nats.flush(5)
        await writer.nats.stop()
        crashed_at = writer.stream.current_token()
        for i in range(5, 10):  # committed while the writer's link is gone: the repair re-publishes them
            writer.write([[f"x{i}"]])
        broken = CutWithoutRows(source)
        publisher.add_stream(STREAM, broken, writer.stream.current_token())
        writer.stream.add_listener(publisher.notify)
        restarted = NatsReplication(ReplicationHub("w1", publisher=publisher), nats_url, deployment, **FAST)
        await restarted.start()
        await restarted.wait_connected(5)
        await restarted.flush(5)
        await settle([writer], [reader], timeout=5)
        assert_exact([writer], [reader])  # without the check: POSITION 5 -> 10 and facts 6-10 never delivered
        assert broken.bad_answers == 1 and restarted.stats.repaired_rows == 5
        assert reader.source.queries == 0
        assert any(r.levelno == logging.ERROR and f"limited page without progress after {crashed_at}" in r.getMessage()
                   for r in caplog.records)
    finally:
        if restarted is not None:
            await restarted.stop()
        publisher.close()
        writer.publisher.close()
        await stop_all([reader])


async def publish_raw(url: str, server_name: str, msgs: list[tuple[wire.Command, str | None, int | None]]) -> None:
    import nats

    layout = JetStreamLayout.for_server(server_name)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for cmd, msg_id, prev in msgs:
            headers = {}
            if msg_id is not None:
                headers["Nats-Msg-Id"] = msg_id
            if prev is not None:
                headers["Fs-Prev"] = str(prev)
            subject = layout.log_subject(getattr(cmd, "stream_name", STREAM), getattr(cmd, "instance_name", "w1"))
            await js.publish(subject, wire.encode(cmd), headers=headers or None)
    finally:
        await nc.close()


async def publish_bytes(url: str, server_name: str, subject_tail: str, payloads: list[bytes]) -> None:
    import nats

    layout = JetStreamLayout.for_server(server_name)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for p in payloads:
            await js.publish(f"{layout.prefix}.log.{subject_tail}", p)
    finally:
        await nc.close()


async def test_bad_messages_are_counted_and_the_reader_continues(nats_url: str, deployment: str) -> None:
    async with writer_and_reader(nats_url, deployment) as (writer, reader):
        for i in range(20):
            writer.write([[f"x{i}"]])
        await writer.nats.flush(10)
        await publish_bytes(nats_url, deployment, "to_device.w1", [
            b"NOT A COMMAND", b"RDATA to_device w1 21 {not json", b"\xff\xfe", b"", b"PING 123",
            b"POSITION to_device w1 x y",
        ])
        for i in range(20, 40):
            writer.write([[f"x{i}"]])
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert reader.nats.stats.invalid == 6
        assert reader.source.queries == 0


async def test_reader_falls_back_to_the_table_when_retention_dropped_facts(nats_url: str, deployment: str) -> None:
    source = MemoryUpdateSource()
    rng = random.Random(5)
    # Pages of at most 5 lines: the 300 facts take many more than the 40 messages retention keeps.
    writer = Writer("w1", nats_url, deployment, source, retention=Retention(max_msgs=40, storage="memory"),
                    page_rows=5)
    await start_all([writer])
    try:
        for i in range(300):
            writer.write(random_fact(rng, "w1", i))
        await writer.nats.flush(10)
        reader = Reader("late", nats_url, deployment, source)
        await start_all([reader])
        for i in range(300, 320):
            writer.write(random_fact(rng, "w1", i))
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert reader.nats.stats.fallbacks >= 1
        assert reader.source.queries >= 1
        keys = {(k.side, k.stream, k.writer): k for k in reader.nats.key_stats()}
        assert keys[("reader", STREAM, "w1")].fallbacks >= 1
        await stop_all([reader])
    finally:
        await stop_all([writer])


async def test_stats_report_sequence_pending_and_lag(nats_url: str, deployment: str) -> None:
    from prometheus_client import REGISTRY

    async with writer_and_reader(nats_url, deployment) as (writer, reader):
        for i in range(30):
            writer.write([[f"x{i}"]])
        await settle([writer], [reader])
        await writer.nats.flush(10)
        w = {(k.side, k.stream, k.writer): k for k in writer.nats.key_stats()}[("writer", STREAM, "w1")]
        r = {(k.side, k.stream, k.writer): k for k in reader.nats.key_stats()}[("reader", STREAM, "w1")]
        # The 30 facts travel in pages: at least one message, 30 lines (and the first POSITION) in all.
        assert w.position == 30 and w.pending == 0 and w.sequence >= 1
        assert writer.nats.stats.rows_queued >= 30
        assert r.position == 30 and r.sequence == w.sequence and r.pending == 0
        assert r.lag_seconds is not None and 0 <= r.lag_seconds < 10
        # Per (stream, writer), JetStream holds nothing more for this reader (the counts a scrape refreshes).
        assert await reader.nats.refresh_pending() == {(STREAM, "w1"): 0}
        status = reader.nats.status()
        assert status["carrier"] == "nats" and status["stream"] == JetStreamLayout.for_server(deployment).stream
        assert REGISTRY.get_sample_value(
            "factstream_nats_sequence", {"side": "reader", "stream": STREAM, "writer": "w1"}) == r.sequence


def test_bad_url_is_a_clear_error() -> None:
    from factstream.replication import ReplicationHub

    with pytest.raises(ValueError, match="bad NATS URL"):
        NatsReplication(ReplicationHub("x"), "127.0.0.1:4222", "hs")
