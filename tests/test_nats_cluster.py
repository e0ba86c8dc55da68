"""JetStream carrier against servers the tests start themselves: a single node and a three-node cluster.

Each test starts its own ``nats-server`` processes on free loopback ports with
their own store directories, kills or stops only those, and checks that
writers and readers carry on by themselves: every reader ends with exactly
the facts each writer committed, in order (the writer's "database" is the
shared update source; its list of written facts is the truth).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from factstream.replication import MemoryUpdateSource
from factstream.transport.nats import Retention

from nats_helpers import (
    Cluster,
    NatsServer,
    Reader,
    Writer,
    assert_exact,
    eventually,
    random_fact,
    settle,
    start_all,
    stop_all,
)

BOTH_EVENT_LOOPS = True
pytestmark = pytest.mark.slow


class Producer:
    """Writes facts on every writer in the background until stopped."""

    def __init__(self, writers: list[Writer], seed: int) -> None:
        self.writers = writers
        self.rng = random.Random(seed)
        self.i = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            for w in self.writers:
                w.write(random_fact(self.rng, w.name, self.i))
            self.i += 1
            await asyncio.sleep(0.003)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


async def wait_written(producer: Producer, more: int) -> None:
    target = producer.i + more
    await eventually(lambda: producer.i >= target, what=f"{more} more rounds written")


async def test_single_node_killed_and_restarted(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "n1")
    server.start()
    source = MemoryUpdateSource(capacity=1_000_000)
    writers = [Writer(f"w{i}", server.url, "hs", source) for i in (1, 2)]
    readers = [Reader(f"r{i}", server.url, "hs", source) for i in (1, 2)]
    try:
        await start_all([*writers, *readers])
        producer = Producer(writers, seed=11)
        producer.start()
        await wait_written(producer, 150)
        server.kill()
        await wait_written(producer, 100)  # committed while NATS is gone: queued by the writers
        server.start()
        await wait_written(producer, 150)
        await producer.stop()
        await settle(writers, readers, timeout=60)
        assert_exact(writers, readers)
        for r in readers:
            assert r.nats.stats.consumer_resets >= 1  # the consumer was recreated by itself
            assert r.source.queries == 0, "the log kept every fact: no database query"
        assert all(w.nats.stats.connects >= 2 for w in writers)
    finally:
        await stop_all([*writers, *readers])
        server.stop()


async def test_three_node_cluster_survives_a_killed_node_and_a_full_restart(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    source = MemoryUpdateSource(capacity=1_000_000)
    options: dict[str, Any] = {"retention": Retention(replicas=3)}
    writers = [Writer(f"w{i}", cluster.url, "hs", source, **options) for i in (1, 2)]
    readers = [Reader(f"r{i}", cluster.url, "hs", source, **options) for i in (1, 2, 3)]
    late_reader: list[Reader] = []
    try:
        await start_all([*writers, *readers], timeout=60)
        producer = Producer(writers, seed=12)
        producer.start()
        await wait_written(producer, 150)
        # One node dies mid-stream (possibly the stream's leader) and comes back.
        victim = cluster.nodes[1]
        victim.kill()
        await wait_written(producer, 150)
        victim.start()
        await wait_written(producer, 150)
        # The whole cluster stops and starts again (matrix-org/dendrite#3177).
        cluster.stop()
        await wait_written(producer, 100)
        cluster.start()
        await wait_written(producer, 150)
        await producer.stop()
        await settle(writers, readers, timeout=90)
        assert_exact(writers, readers)
        for r in readers:
            assert r.nats.stats.consumer_resets >= 1
        for w in writers:
            await w.nats.flush(30)
            assert w.nats.acked_positions() == {"to_device": w.stream.current_token()}
        # A reader started now replays everything from the replicated log alone.
        late = Reader("late", cluster.url, "hs", source)
        late_reader.append(late)
        await start_all([late], timeout=30)
        await settle(writers, [late], timeout=60)
        assert_exact(writers, [late])
        # (A publish refused during a leader election and sent again may be stored after later ones; readers
        # then fetch that hole from the table, so a few queries are allowed here: see docs/nats.md, known limits.)
        assert late.source.queries <= 2 * late.nats.stats.fallbacks
    finally:
        await stop_all([*writers, *readers, *late_reader])
        cluster.stop()
