"""The JetStream carrier through the chaos proxy: lines cut at random byte boundaries, every link cut repeatedly.

Writers and readers reach the shared JetStream server only through
:class:`ChaosProxy`; while they publish and follow, the proxy aborts every
connection again and again. Publishes in flight when a link dies are sent
again (same message ids), consumers are recreated after the last delivered
sequence, and every reader ends with exactly the facts written, in order.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from chaos_proxy import ChaosProxy
from factstream.replication import MemoryUpdateSource

from nats_helpers import (
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
)

__all__ = ["deployment", "nats_url"]

BOTH_EVENT_LOOPS = True


async def test_links_cut_again_and_again(nats_url: str, deployment: str) -> None:
    rng = random.Random(21)
    proxy = ChaosProxy(4222, rng)
    await proxy.start()
    url = f"nats://127.0.0.1:{proxy.port}"
    source = MemoryUpdateSource(capacity=1_000_000)
    writers = [Writer(f"w{i}", url, deployment, source) for i in (1, 2)]
    readers = [Reader(f"r{i}", url, deployment, source) for i in (1, 2)]
    nodes: list[Any] = [*writers, *readers]
    try:
        await start_all([*writers, *readers], timeout=30)
        for round_ in range(6):
            for i in range(120):
                for w in writers:
                    w.write(random_fact(rng, w.name, round_ * 1000 + i))
                if i % 20 == 0:
                    await asyncio.sleep(0.005)
            await eventually(lambda: all(n.nats.connected for n in nodes), what="all reconnected")
            proxy.cut()
            await asyncio.sleep(rng.uniform(0.0, 0.3))
        await settle(writers, readers, timeout=60)
        assert_exact(writers, readers)
        assert proxy.cuts == 6
        # Every cut hit every client (a cut during a reconnect's handshake may skip its "reconnected" callback).
        assert all(n.nats.stats.disconnects >= 6 for n in nodes)
        assert all(r.nats.stats.consumer_resets >= 1 for r in readers)
    finally:
        await stop_all([*writers, *readers])
        await proxy.stop()
