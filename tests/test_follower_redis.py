"""Issue 11 end to end over the real Redis: a restarted typing writer, forged commands, a burst of bad messages.

Each test has its own channel (``channel_prefix``) and runs on both event
loops (``run``); the forged-command test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.replication.tables import TableWriter, create_tables, open_id_generators
from factstream.demo.tables import DEMO_TABLES
from factstream.store.database import connect
from factstream.replication import MemoryUpdateSource
from factstream.transport.redis import RedisReplication

sys.path.insert(0, str(Path(__file__).parent))
from test_redis_carrier import FAST, eventually, raw_client, run  # noqa: E402

__all__ = ["run"]  # fixture re-exported for pytest

pytestmark = pytest.mark.redis

CACHES = DEMO_TABLES[2]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class TypingWriter:
    """A typing writer ``worker1``: its rows live in memory, so a restart starts the stream again at 0."""

    def __init__(self, url: str, channel: str) -> None:
        self.source = MemoryUpdateSource()
        self.stream = LocalStream("typing", "worker1", source=self.source)
        self.publisher = Publisher("worker1")
        self.publisher.add_stream("typing", self.source, 0)
        self.stream.add_listener(self.publisher.notify)
        self.redis = RedisReplication(ReplicationHub("worker1", publisher=self.publisher), url, channel, **FAST)

    def write(self, room: str) -> int:
        token = self.stream.reserve()
        self.stream.complete(token, [[room, ["@alice:hs"]]])
        return token

    async def stop(self) -> None:
        await self.redis.stop()
        self.publisher.close()


def test_restarted_typing_writer_rows_all_arrive_after_a_reset(
    run: Any, redis_url: str, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        fol = Follower(typed=False)
        got: list[tuple[int, str]] = []
        fol.add_handler(lambda s, w, t, rows: got.extend((t, r[0]) for r in rows), "typing")
        resets: list[tuple[str, str, int, int]] = []
        fol.add_reset_handler(lambda *a: resets.append(a))
        reader = RedisReplication(ReplicationHub("reader", follower=fol), redis_url, channel_prefix, **FAST)
        await reader.start()
        await reader.wait_connected(5)
        first = TypingWriter(redis_url, channel_prefix)
        await first.redis.start()
        await first.redis.wait_connected(5)
        await eventually(lambda: fol.position("typing", "worker1") == 0, what="the writer's first POSITION")
        for i in range(84):
            first.write(f"!a{i}:hs")
        await fol.wait_for_position("typing", "worker1", 84, 10)
        await first.stop()

        second = TypingWriter(redis_url, channel_prefix)  # the restart: POSITION typing worker1 0 0
        await second.redis.start()
        await second.redis.wait_connected(5)
        await eventually(lambda: resets != [], what="the reset")
        for i in range(22):
            second.write(f"!b{i}:hs")
        await fol.wait_for_position("typing", "worker1", 22, 10)
        assert resets == [("typing", "worker1", 84, 0)]
        assert got == [(t, f"!a{t - 1}:hs") for t in range(1, 85)] + [(t, f"!b{t - 1}:hs") for t in range(1, 23)]
        assert fol.stats["stale_rows"] == 0
        await second.stop()
        await reader.stop()
        await fol.close()

    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        run(scenario())
    assert any("went backwards from 84 to 0" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_forged_position_and_rdata_on_the_channel_lose_no_real_rows(
    run: Any, redis_url: str, channel_prefix: str, engine: str, tmp_path: Any,
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}" if engine == "sqlite" else request.getfixturevalue("postgres_dsn")

    async def scenario() -> None:
        db = await connect(url)
        await create_tables(db, [CACHES])
        gen = (await open_id_generators(db, "master", [CACHES]))["caches"]
        pub = Publisher("master")
        pub.add_stream("caches", CACHES.source(db), gen.current_token_for_writer("master"))
        gen.add_listener(pub.notify)
        writer = RedisReplication(ReplicationHub("master", publisher=pub), redis_url, channel_prefix, **FAST)
        table_writer = TableWriter(db, gen, CACHES)
        written: list[tuple[int, list[str]]] = []

        async def write(n: int) -> None:
            for _ in range(n):
                names = [f"c{len(written)}_{j}" for j in range(2)]
                token = await table_writer.write([[name, ["@k:hs"], 1] for name in names])
                written.append((token, names))

        await write(5)  # before the reader: it catches up from the database
        reader_db = await connect(url)
        fol = Follower(sources={"caches": CACHES.source(reader_db)}, start_position=0, typed=False)
        got: list[tuple[int, list[str]]] = []
        fol.add_handler(lambda s, w, t, rows: got.append((t, [r[0] for r in rows])), "caches")
        reader = RedisReplication(ReplicationHub("reader", follower=fol), redis_url, channel_prefix, **FAST)
        await writer.start()
        await reader.start()
        await writer.wait_connected(5)
        await reader.wait_connected(5)
        await write(3)
        await pub.flush()
        await fol.wait_for_position("caches", "master", gen.current_token(), 10)

        forger = await raw_client(redis_url)
        try:
            await forger.publish(channel_prefix, "POSITION caches master 1 5000000")
            await forger.publish(channel_prefix, 'RDATA caches master 5000001 ["forged",null,0]')
        finally:
            await forger.aclose()
        for _ in range(20):  # real rows keep coming while and after the forgery is checked
            await write(1)
            await asyncio.sleep(0.02)
        await pub.flush()
        await fol.wait_for_position("caches", "master", gen.current_token(), 15)
        assert got == written
        assert fol.position("caches", "master") == gen.current_token()
        await eventually(lambda: fol.stats["unbacked_claims"] == 2, what="both forgeries reported")
        await reader.stop()
        await writer.stop()
        await fol.close()
        pub.close()
        await gen.close()
        await reader_db.close()
        await db.close()

    with caplog.at_level(logging.WARNING, "factstream.replication.follower"):
        run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("Writer 'master', claimed 5000000, verified" in m for m in errors)
    assert any("Writer 'master', claimed 5000001, verified" in m for m in errors)


def test_burst_of_bad_messages_is_counted_and_its_summary_printed_without_a_later_message(
    run: Any, redis_url: str, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = sample("factstream_dropped_rows_total", stream="", why="bad_message")

    async def scenario() -> None:
        fol = Follower()
        reader = RedisReplication(ReplicationHub("reader", follower=fol), redis_url, channel_prefix, **FAST)
        await reader.start()
        await reader.wait_connected(5)
        bad = await raw_client(redis_url)
        try:
            pipe = bad.pipeline(transaction=False)
            for i in range(2008):
                pipe.publish(channel_prefix, f"NOT_A_COMMAND {i}")
            await pipe.execute()
        finally:
            await bad.aclose()
        await eventually(lambda: reader.stats.invalid == 2008, what="all bad messages read")
        await eventually(
            lambda: any("2007 more suppressed" in r.getMessage() for r in caplog.records),
            timeout=5, what="the summary, printed by the timer",
        )
        await reader.stop()
        await fol.close()

    with caplog.at_level(logging.WARNING, "factstream.transport.redis"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "factstream.transport.redis" and r.levelno >= logging.WARNING]
    bad_lines = [m for m in lines if "invalid replication message" in m or "more suppressed" in m]
    assert len(bad_lines) == 2 and "(2007 rows)" in bad_lines[1]
    assert sample("factstream_dropped_rows_total", stream="", why="bad_message") == before + 2008
