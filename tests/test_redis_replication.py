"""Replication over Redis pub/sub end to end: publisher -> Redis -> follower.

Writers and readers are real :class:`ReplicationHub` s driven by
:class:`RedisReplication` over the real Redis; a shared
:class:`MemoryUpdateSource` stands for the database the readers catch up
from. Every check compares, per reader and per writer, the exact list of
facts delivered with the list written: nothing lost, duplicated or reordered.
"""

from __future__ import annotations

import asyncio
import functools
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from factstream import wire
from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.replication import MemoryUpdateSource
from factstream.transport.redis import RedisReplication

sys.path.insert(0, str(Path(__file__).parent))
from test_redis_carrier import (  # noqa: E402  (helpers and fixtures shared with the carrier tests)
    FAST,
    RedisServer,
    client_names,
    wait_client_names,
    eventually,
    kill_client,
    private_redis,
    raw_client,
    run,
)
from chaos_proxy import ChaosProxy  # noqa: E402
import replication_helpers  # noqa: E402
from replication_helpers import assert_exact, complete_at_random, random_fact, stop_all  # noqa: E402

__all__ = ["private_redis", "run"]  # fixtures re-exported for pytest

pytestmark = pytest.mark.redis


class RedisNode:
    """A writer's or a reader's Redis link (``.redis``), mixed into :mod:`replication_helpers`' Writer and Reader."""

    hub: ReplicationHub

    def __init__(self, name: str, url: str, server_name: str, source: MemoryUpdateSource, **options: Any) -> None:
        super().__init__(name, source)  # type: ignore[call-arg]  # replication_helpers' Writer or Reader
        self.redis = RedisReplication(self.hub, url, server_name, **{**FAST, **options})

    @property
    def link(self) -> RedisReplication:
        return self.redis


class Writer(RedisNode, replication_helpers.Writer):
    """One writer instance: a LocalStream over the shared source, its publisher, hub and Redis link."""


class Reader(RedisNode, replication_helpers.Reader):
    """One reader instance: a follower catching up from the shared source."""


# Redis links connect within 5 s; every reader reaches the writers' positions within 20 s.
start_all = functools.partial(replication_helpers.start_all, timeout=5)
settle = functools.partial(replication_helpers.settle, timeout=20.0)


def test_two_writers_three_readers_with_a_killed_subscriber(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        source = MemoryUpdateSource()
        rng = random.Random(1)
        writers = [Writer(f"w{i}", redis_url, channel_prefix, source) for i in (1, 2)]
        readers = [Reader(f"r{i}", redis_url, channel_prefix, source) for i in (1, 2, 3)]
        await start_all([*writers, *readers])
        try:
            for i in range(150):
                for w in writers:
                    w.write(random_fact(rng, w.name, i))
                await asyncio.sleep(0.002)
            victim = readers[1]
            await kill_client(redis_url, victim.redis.carrier.subscriber_client_id)
            for i in range(150, 200):  # published while the victim is certainly not subscribed
                for w in writers:
                    w.write(random_fact(rng, w.name, i))
            await eventually(lambda: victim.redis.stats.subscriber_connects == 2, what="victim resubscribed")
            for i in range(200, 300):
                for w in writers:
                    w.write(random_fact(rng, w.name, i))
                await asyncio.sleep(0.002)
            await settle(writers, readers)
            assert_exact(writers, readers)
            assert victim.follower.stats["catchup_fetches"] >= 1  # the hole was repaired from the source
            assert all(r.redis.stats.subscriber_connects == 1 for r in readers if r is not victim)
            assert all(w.redis.stats.echoes > 0 for w in writers)  # own echoes were heard and dropped
        finally:
            await stop_all([*writers, *readers])

    run(scenario())


def test_killed_writer_publisher_is_repaired_by_positions(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        source = MemoryUpdateSource()
        rng = random.Random(2)
        writer = Writer("w1", redis_url, channel_prefix, source)
        readers = [Reader(f"r{i}", redis_url, channel_prefix, source) for i in (1, 2)]
        await start_all([writer, *readers])
        try:
            for round_ in range(3):
                for i in range(100):
                    writer.write(random_fact(rng, "w1", i))
                    if i == 50:
                        await kill_client(redis_url, writer.redis.carrier.publisher_client_id)
                    await asyncio.sleep(0.001)
                await eventually(lambda: writer.redis.carrier.publisher_connected, what="publisher back")
            await settle([writer], readers)
            assert_exact([writer], readers)
            assert writer.redis.stats.publisher_connects == 4
            assert writer.redis.stats.resyncs >= 3
        finally:
            await stop_all([writer, *readers])

    run(scenario())


def test_synapse_style_peer_gets_positions_and_reader_joins_late(
    run: Any, redis_url: str, channel_prefix: str
) -> None:
    """A raw client publishing REPLICATE (as a Synapse worker does) gets POSITION; a late reader catches up."""

    async def scenario() -> None:
        source = MemoryUpdateSource()
        writer = Writer("master", redis_url, channel_prefix, source)
        await start_all([writer])
        raw = await raw_client(redis_url)
        pubsub = raw.pubsub()
        await pubsub.subscribe(channel_prefix)
        try:
            for i in range(5):
                writer.write([[f"@u{i}:hs"]])
            await raw.publish(channel_prefix, b"REPLICATE")
            lines: list[bytes] = []
            deadline = asyncio.get_running_loop().time() + 5
            while b"POSITION to_device master 5 5" not in lines:
                assert asyncio.get_running_loop().time() < deadline, f"no POSITION after REPLICATE; heard {lines}"
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if msg is not None:
                    lines.append(msg["data"])
            reader = Reader("late", redis_url, channel_prefix, source)
            await start_all([reader])
            writer.write([["@u5:hs"]])
            await settle([writer], [reader])
            assert_exact([writer], [reader])
            await stop_all([reader])
        finally:
            await pubsub.aclose()
            await raw.aclose()
            await stop_all([writer])

    run(scenario())


def test_other_commands_reach_hub_handlers(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        source = MemoryUpdateSource()
        writer = Writer("master", redis_url, channel_prefix, source)
        reader = Reader("worker1", redis_url, channel_prefix, source, subscribe_user_ip=True)
        seen: list[wire.Command] = []
        for name in ("USER_SYNC", "USER_IP", "REMOTE_SERVER_UP", "LOCK_RELEASED"):
            writer.hub.on(name, lambda cmd, conn: seen.append(cmd))
        reader_seen: list[wire.Command] = []
        reader.hub.on("REMOTE_SERVER_UP", lambda cmd, conn: reader_seen.append(cmd))
        writer.redis = RedisReplication(writer.hub, redis_url, channel_prefix, subscribe_user_ip=True, **FAST)
        await start_all([writer, reader])
        try:
            reader.hub.user_sync("@alice:hs", "DEV", True, 1000)
            reader.hub.send(wire.UserIpCommand("@alice:hs", "tok", "10.0.0.1", "ua", "DEV", 1001))
            reader.hub.send(wire.RemoteServerUpCommand("remote.example"))
            reader.hub.send(wire.LockReleasedCommand("worker1", "lock", "key"))
            await eventually(lambda: len(seen) == 4, what="commands at the writer")
            assert [c.NAME for c in seen] == ["USER_SYNC", "USER_IP", "REMOTE_SERVER_UP", "LOCK_RELEASED"]
            assert writer.hub.syncing_users() == {"worker1": {("@alice:hs", "DEV")}}
            # The reader's own REMOTE_SERVER_UP comes back to it (not an echo-suppressed command, as in Synapse).
            await eventually(lambda: len(reader_seen) == 1, what="REMOTE_SERVER_UP at the reader")
        finally:
            await stop_all([writer, reader])

    run(scenario())


@pytest.mark.slow
def test_chaos_zero_lost_duplicated_or_reordered(run: Any, private_redis: RedisServer, channel_prefix: str) -> None:
    """Two writers x two streams, three readers; for ~6 s random CLIENT KILLs of any connection,
    a proxy that slices the bytes at random and cuts every link now and then, and one Redis
    restart. Facts complete out of order, with rollback holes and multi-row facts. At the end
    each reader holds exactly what each writer committed, per stream: nothing lost, duplicated
    or reordered."""

    streams = ("to_device", "caches")

    async def scenario() -> None:
        rng = random.Random(1234)
        proxy = ChaosProxy(private_redis.port, rng)
        await proxy.start()
        url = f"redis://127.0.0.1:{proxy.port}/0"
        sources = {s: MemoryUpdateSource(capacity=1_000_000) for s in streams}
        committed: dict[tuple[str, str], dict[int, list[Any]]] = {}
        writers: list[Any] = []
        for name in ("w1", "w2"):
            pub = Publisher(name, page_limit=100)
            local = {}
            for s in streams:
                ls = LocalStream(s, name, source=sources[s])
                pub.add_stream(s, sources[s], 0)
                ls.add_listener(pub.notify)
                local[s] = ls
                committed[(name, s)] = {}
            hub = ReplicationHub(name, publisher=pub)
            writers.append((name, pub, local, RedisReplication(hub, url, channel_prefix, max_pending=500, **FAST)))
        readers: list[tuple[Follower, dict[tuple[str, str], list[tuple[int, list[Any]]]], RedisReplication]] = []
        for name in ("r1", "r2", "r3"):
            fol = Follower(sources=dict(sources), start_position=0, typed=False, page_limit=37)
            got: dict[tuple[str, str], list[tuple[int, list[Any]]]] = {}
            fol.add_handler(lambda s, w, t, rows, got=got: got.setdefault((w, s), []).append((t, list(rows))))
            readers.append((fol, got, RedisReplication(ReplicationHub(name, follower=fol), url, channel_prefix, **FAST)))
        links = [w[3] for w in writers] + [r[2] for r in readers]
        for link in links:
            await link.start()
        for link in links:
            await link.wait_connected(5)

        stop = asyncio.Event()
        kills = 0

        async def produce(name: str, local: dict[str, LocalStream]) -> None:
            n = 0
            mine = {s: committed[(name, s)] for s in streams}
            while not stop.is_set():
                n = complete_at_random(rng, streams, local, mine, n, name)
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.random() * 0.003)

        async def chaos() -> None:
            nonlocal kills
            loop = asyncio.get_running_loop()
            end = loop.time() + 6.0
            restarted = False
            step = 0
            while loop.time() < end:
                await asyncio.sleep(rng.uniform(0.05, 0.25))
                step += 1
                if not restarted and loop.time() > end - 3.0:
                    restarted = True
                    private_redis.stop()
                    await asyncio.sleep(0.3)
                    private_redis.start()
                elif step % 4 == 0:
                    proxy.cut()
                else:
                    carrier = rng.choice(links).carrier
                    client_id = rng.choice([carrier.subscriber_client_id, carrier.publisher_client_id])
                    try:
                        await kill_client(private_redis.url, client_id)
                        kills += 1
                    except Exception:  # noqa: BLE001 - that connection is already gone
                        pass
            stop.set()

        producers = [asyncio.create_task(produce(name, local)) for name, _, local, _ in writers]
        try:
            await chaos()
            await asyncio.gather(*producers)
            for link in links:
                await link.wait_connected(15)
            for name, _, local, _ in writers:  # one final fact per stream, published on healthy links
                for s in streams:
                    t = local[s].reserve()
                    committed[(name, s)][t] = [[name, s, t, 0, -1]]
                    local[s].complete(t, committed[(name, s)][t])
            for fol, _, _ in readers:
                for name, _, local, _ in writers:
                    for s in streams:
                        await fol.wait_for_position(s, name, local[s].current_token(), timeout=30)
            for fol, got, link in readers:
                for key, facts in committed.items():
                    delivered = got.get(key, [])
                    tokens = [t for t, _ in delivered]
                    assert tokens == sorted(set(tokens)), f"{link.instance_name} {key}: duplicated or reordered facts"
                    assert dict(delivered) == facts, f"{link.instance_name} {key}: lost or altered facts"
            assert sum(len(f) for f in committed.values()) > 1000
            assert kills >= 5 and proxy.cuts >= 2
            assert sum(fol.stats["catchup_fetches"] for fol, _, _ in readers) >= 1
        finally:
            stop.set()
            for p in producers:
                p.cancel()
            for link in links:
                await link.stop()
            for fol, _, _ in readers:
                await fol.close()
            for _, pub, _, _ in writers:
                pub.close()
            await proxy.stop()

    run(scenario(), timeout=120)


def test_closing_the_hub_connection_resubscribes(run: Any, redis_url: str, channel_prefix: str) -> None:
    """Connection.close() from the core drops the subscription; a new one (a new connection) follows."""

    async def scenario() -> None:
        source = MemoryUpdateSource()
        writer = Writer("w1", redis_url, channel_prefix, source)
        reader = Reader("r1", redis_url, channel_prefix, source)
        await start_all([writer, reader])
        try:
            first = reader.redis.connection
            assert first is not None and first.connected and first.broadcast
            writer.write([["@a:hs"]])
            first.close("test")
            await eventually(lambda: reader.redis.stats.subscriber_connects == 2, what="resubscribed")
            second = reader.redis.connection
            assert second is not None and second is not first and not first.connected
            assert reader.hub.connections == [second]
            writer.write([["@b:hs"]])
            await settle([writer], [reader])
            assert_exact([writer], [reader])
        finally:
            await stop_all([writer, reader])

    run(scenario())


def test_stop_is_final_and_leaves_no_connection_behind(run: Any, redis_url: str, channel_prefix: str) -> None:
    """stop() before start() makes start() refuse; stop() after start() closes both Redis connections."""

    async def scenario() -> None:
        source = MemoryUpdateSource()
        early = Reader("r0", redis_url, channel_prefix, source, client_name=f"{channel_prefix}-r0")
        await early.redis.stop()
        async with asyncio.timeout(1):
            with pytest.raises(RuntimeError, match="stopped: make a new one"):
                await early.redis.start()
            with pytest.raises(RuntimeError, match="stopped"):
                await early.redis.wait_connected(30)
        await early.follower.close()

        name = f"{channel_prefix}-r1"
        reader = Reader("r1", redis_url, channel_prefix, source, client_name=name)
        await start_all([reader])
        await wait_client_names(redis_url, name, [f"{name}:pub", f"{name}:sub"])
        conn = reader.redis.connection
        assert conn is not None and reader.hub.connections == [conn]
        await stop_all([reader])
        await wait_client_names(redis_url, name, [])
        assert reader.redis.connection is None and reader.hub.connections == [] and not conn.connected
        conn.send(wire.ReplicateCommand())  # the hub's late send is ignored: its connection_lost came with stop()
        async with asyncio.timeout(1):
            with pytest.raises(RuntimeError, match="stopped"):
                await reader.redis.wait_connected(30)
            with pytest.raises(RuntimeError, match="stopped: make a new one"):
                await reader.redis.start()
            await reader.redis.stop()  # again: a no-op
        assert await client_names(redis_url, f"{channel_prefix}-r0") == []

    run(scenario())
