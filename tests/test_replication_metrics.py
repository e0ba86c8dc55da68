"""Prometheus metrics of replication, read back from the default registry."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.transport.tcp import TcpClient, TcpServer


def value(name: str, **labels: str) -> float:
    v = REGISTRY.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_metrics_follow_the_replication_traffic() -> None:
    before_in = value("factstream_commands_in_total", command="RDATA")
    before_out = value("factstream_commands_out_total", command="RDATA")
    before_fetch = value("factstream_catchup_fetches_total", stream="push_rules")
    before_disc = value("factstream_disconnects_total", reason="closed")
    before_rc = value("factstream_reconnects_total", target="127.0.0.1:0")

    ls = LocalStream("push_rules", "metrics-writer")
    pub = Publisher("metrics-writer")
    pub.add_stream("push_rules", ls.source, 0)
    ls.add_listener(pub.notify)
    server = await TcpServer(ReplicationHub("metrics-writer", publisher=pub), "m.hs").start()
    for i in range(5):
        ls.write([[f"@u{i}:hs"]])  # before the reader connects: it catches up
    fol = Follower(sources={"push_rules": ls.source}, start_position=0, page_limit=2)
    client = await TcpClient(ReplicationHub("metrics-reader", follower=fol), "127.0.0.1", server.port, backoff_initial=0.01).start()
    await fol.wait_for_position("push_rules", "metrics-writer", 5, 5)
    for i in range(3):
        ls.write([[f"@v{i}:hs"], [f"@w{i}:hs"]])
    await fol.wait_for_position("push_rules", "metrics-writer", 8, 5)
    for conn in list(server.connections):
        conn.close("metrics test")
    for _ in range(200):
        await asyncio.sleep(0.01)
        if client.connects == 2:
            break

    assert value("factstream_commands_in_total", command="RDATA") - before_in >= 6
    assert value("factstream_commands_out_total", command="RDATA") - before_out >= 6
    assert value("factstream_rows_total", side="writer", stream="push_rules") >= 11
    assert value("factstream_rows_total", side="reader", stream="push_rules") >= 11
    assert value("factstream_position", side="writer", stream="push_rules", writer="metrics-writer") == 8
    assert value("factstream_position", side="reader", stream="push_rules", writer="metrics-writer") == 8
    assert value("factstream_catchup_fetches_total", stream="push_rules") - before_fetch >= 3
    assert value("factstream_catchup_rows_total", stream="push_rules") >= 5
    assert value("factstream_disconnects_total", reason="closed") - before_disc >= 1
    assert value("factstream_reconnects_total", target=f"127.0.0.1:{server.port}") >= 1
    assert value("factstream_pending_outbound") >= 0
    await client.stop()
    await server.stop()
    _ = before_rc
