"""Chaos: a proxy cuts the reader's connection at random points while the writer produces.

At the end every committed fact was delivered exactly once and in order, per
stream, with the rollback holes skipped.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.transport.tcp import TcpClient, TcpServer

from chaos_proxy import ChaosProxy
from replication_helpers import complete_at_random

BOTH_EVENT_LOOPS = True


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
async def test_chaos_proxy_loses_duplicates_and_reorders_nothing(seed: int) -> None:
    rng = random.Random(seed)
    streams = ("to_device", "caches")
    pub = Publisher("master")
    local: dict[str, LocalStream] = {}
    for s in streams:
        ls = LocalStream(s, "master")
        pub.add_stream(s, ls.source, 0)
        ls.add_listener(pub.notify)
        local[s] = ls
    server = await TcpServer(ReplicationHub("master", publisher=pub), "chaos.hs").start()
    proxy = ChaosProxy(server.port, rng)
    await proxy.start()

    fol = Follower(typed=False, sources={s: local[s].source for s in streams}, start_position=0, page_limit=37)
    got: dict[str, list[tuple[int, list[Any]]]] = {s: [] for s in streams}
    fol.add_handler(lambda s, w, t, rows: got[s].append((t, rows)))
    client = await TcpClient(
        ReplicationHub("reader", follower=fol), "127.0.0.1", proxy.port,
        expected_server_name="chaos.hs", backoff_initial=0.005, backoff_max=0.05,
    ).start()

    committed: dict[str, dict[int, list[Any]]] = {s: {} for s in streams}

    async def produce() -> None:
        n = 0
        for _ in range(1500):
            n = complete_at_random(rng, streams, local, committed, n)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.003)

    async def chaos() -> None:
        while True:
            await asyncio.sleep(rng.uniform(0.01, 0.15))
            proxy.cut()

    chaos_task = asyncio.create_task(chaos())
    await produce()
    await asyncio.sleep(0.2)
    chaos_task.cancel()
    for s in streams:
        await fol.wait_for_position(s, "master", local[s].current_token(), timeout=20)
    await client.stop()
    await proxy.stop()
    await server.stop()

    assert proxy.cuts >= 5, "the chaos proxy should have cut the connection several times"
    assert client.connects >= 3
    for s in streams:
        tokens = [t for t, _ in got[s]]
        assert tokens == sorted(set(tokens)), f"{s}: duplicated or reordered facts"
        assert dict(got[s]) == committed[s], f"{s}: lost or altered facts"
