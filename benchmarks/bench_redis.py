"""Replication over Redis: commands/s published and delivered, next to redis-benchmark.

Rows (each round moves N_COMMANDS commands from the seeded corpus):

* ``publish``: factstream's carrier queues N commands and waits until Redis
  acknowledged all of them, pipelined (everything queued in one tick goes out
  in one round trip) vs one round trip per command; redis-py's own
  ``Redis.publish`` awaited one by one is the client baseline.
* ``redis-benchmark``: the server's own load generator publishing the same
  kind of line on the same machine in the same run, one client, with
  ``-P 1`` (one round trip per command) and ``-P 1000`` (pipelined), and 50
  clients ``-P 1`` (what the server sustains).
* ``publish+deliver``: a writer carrier publishes N commands, a reader
  carrier (another pair of connections) receives and decodes all N; the
  clock stops when the last one has been decoded. On uvloop and asyncio.

Run: .venv/bin/python -m pytest benchmarks/bench_redis.py --benchmark-only
--benchmark-json=redis.json -p no:randomly; .venv/bin/python benchmarks/ratios.py redis.json
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from corpus import generate
from factstream import wire
from factstream.transport.redis import RedisCarrier

pytestmark = pytest.mark.redis

N_COMMANDS = 20_000
COMMANDS = [wire.parse_line(line) for line in generate(N_COMMANDS, seed=99)]
# redis-benchmark publishes one fixed message: a typical events RDATA line.
SAMPLE_LINE = next(wire.encode(c) for c in COMMANDS if c.NAME == "RDATA" and getattr(c, "stream_name") == "events")
LOOPS = ["uvloop", "asyncio"]


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    lp = _new_loop(request.param)
    try:
        yield lp
    finally:
        lp.close()


def _on(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    return loop.run_until_complete


def _channel() -> str:
    return f"factstream-bench-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------- publish


@pytest.mark.parametrize("mode", ["pipelined", "round-trip-per-command"])
@pytest.mark.benchmark(group="redis publish (acknowledged)")
def test_publish_factstream(benchmark: Any, redis_url: str, loop: asyncio.AbstractEventLoop, mode: str) -> None:
    run = _on(loop)
    n = N_COMMANDS if mode == "pipelined" else N_COMMANDS // 4
    carrier = RedisCarrier(redis_url, _channel(), listen=False, pipelining=mode == "pipelined", max_pending=n)

    async def publish() -> int:
        carrier.send_many(COMMANDS[:n])
        await carrier.flush()
        return n

    run(carrier.start())
    try:
        assert benchmark.pedantic(lambda: run(publish()), rounds=5, warmup_rounds=1) == n
    finally:
        run(carrier.close())
    benchmark.extra_info.update(items=n, round_trips=carrier.stats.round_trips, loop=type(loop).__module__.split(".")[0])
    assert carrier.stats.dropped == 0


@pytest.mark.benchmark(group="redis publish (acknowledged)")
def test_publish_redis_py_one_by_one(benchmark: Any, redis_url: str, loop: asyncio.AbstractEventLoop) -> None:
    """Baseline: redis-py's client, one awaited PUBLISH per command (hiredis parser)."""
    import redis.asyncio as aioredis

    run = _on(loop)
    n = N_COMMANDS // 4
    lines = [wire.encode(c) for c in COMMANDS[:n]]
    channel = _channel()
    client = aioredis.Redis.from_url(redis_url, protocol=2)

    async def publish() -> int:
        for line in lines:
            await client.publish(channel, line)
        return n

    try:
        assert benchmark.pedantic(lambda: run(publish()), rounds=5, warmup_rounds=1) == n
    finally:
        run(client.aclose())
    benchmark.extra_info.update(items=n, loop=type(loop).__module__.split(".")[0])


REDIS_BENCHMARK = shutil.which("redis-benchmark")


def _redis_benchmark(url: str, n: int, clients: int, pipeline: int) -> float:
    """Run redis-benchmark PUBLISH; returns the requests/s it reports."""
    m = re.match(r"redis://([^:/]+):(\d+)", url)
    assert m, url
    out = subprocess.run(
        [
            REDIS_BENCHMARK or "redis-benchmark", "-h", m.group(1), "-p", m.group(2), "--csv",
            "-n", str(n), "-c", str(clients), "-P", str(pipeline),
            "PUBLISH", _channel(), SAMPLE_LINE.decode(),
        ],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout.strip().splitlines()[-1]
    return float(out.rsplit('","', 7)[1])


@pytest.mark.skipif(REDIS_BENCHMARK is None, reason="redis-benchmark is not installed (apt-get install redis-tools)")
@pytest.mark.parametrize(
    "clients,pipeline", [(1, 1), (1, 1000), (50, 1)], ids=["1-client-P1", "1-client-P1000", "50-clients-P1"]
)
@pytest.mark.benchmark(group="redis publish (acknowledged)")
def test_publish_redis_benchmark(benchmark: Any, redis_url: str, clients: int, pipeline: int) -> None:
    """The server's own load generator on the same machine; wall time of the whole run (includes its start-up)."""
    n = N_COMMANDS * 5 if pipeline > 1 or clients > 1 else N_COMMANDS // 4
    reported: list[float] = []
    benchmark.pedantic(lambda: reported.append(_redis_benchmark(redis_url, n, clients, pipeline)), rounds=3)
    benchmark.extra_info.update(items=n, reported_rps=round(max(reported)), line_bytes=len(SAMPLE_LINE))


PAIRS = 7


@pytest.mark.skipif(REDIS_BENCHMARK is None, reason="redis-benchmark is not installed (apt-get install redis-tools)")
@pytest.mark.parametrize("lines", ["corpus", "same-line"])
def test_paired_ratio_publish_over_redis_benchmark(
    benchmark: Any, redis_url: str, loop: asyncio.AbstractEventLoop, lines: str
) -> None:
    """Issue 17 target 5: the carrier's pipelined publish over ``redis-benchmark -P 1000``, rounds alternated.

    Each pair is one carrier round (N_COMMANDS commands queued with
    ``send_many``, clock stopped when Redis acknowledged the last) and one
    redis-benchmark run (1 client, ``-P 1000``, 5 x N_COMMANDS PUBLISH of
    SAMPLE_LINE), back to back so machine load hits both alike. ``corpus``
    publishes the seeded corpus (every command type), ``same-line`` the very
    line redis-benchmark publishes. Ratios are taken against redis-benchmark's
    wall time (process start-up included) and against the rate it reports
    itself (start-up excluded, the stricter one); extra_info holds each
    median and every pair in run order. The timing row is the whole paired run.
    """
    import time

    benchmark.group = "redis publish, paired ratio over redis-benchmark -P 1000"
    run = _on(loop)
    cmds = COMMANDS if lines == "corpus" else [wire.parse_line(SAMPLE_LINE) for _ in range(N_COMMANDS)]
    carrier = RedisCarrier(redis_url, _channel(), listen=False, max_pending=N_COMMANDS)
    n_rb = N_COMMANDS * 5
    result: dict[str, Any] = {}

    async def publish() -> float:
        start = time.perf_counter()
        carrier.send_many(cmds)
        await carrier.flush()
        return N_COMMANDS / (time.perf_counter() - start)

    def pairs() -> None:
        ours, wall, reported = [], [], []
        run(publish())  # warm-up
        for _ in range(PAIRS):
            ours.append(run(publish()))
            start = time.perf_counter()
            reported.append(_redis_benchmark(redis_url, n_rb, 1, 1000))
            wall.append(n_rb / (time.perf_counter() - start))
        by_wall = [a / b for a, b in zip(ours, wall)]
        by_reported = [a / b for a, b in zip(ours, reported)]

        def median(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2]

        result.update(
            factstream_per_s=round(median(ours)),
            redis_benchmark_wall_per_s=round(median(wall)),
            redis_benchmark_reported_per_s=round(median(reported)),
            median_ratio_wall=round(median(by_wall), 2),
            median_ratio_reported=round(median(by_reported), 2),
            ratios_reported=[round(r, 2) for r in by_reported],
            factstream_rounds=[round(x) for x in ours],
        )

    run(carrier.start())
    try:
        benchmark.pedantic(pairs, rounds=1, iterations=1)
    finally:
        run(carrier.close())
    assert carrier.stats.dropped == 0 and carrier.stats.publish_errors == 0
    benchmark.extra_info.update(result, loop=type(loop).__module__.split(".")[0], line_bytes=len(SAMPLE_LINE))


# ---------------------------------------------------------------------- publish + deliver


@pytest.mark.parametrize("mode", ["pipelined", "round-trip-per-command"])
@pytest.mark.benchmark(group="redis publish+deliver (decoded by a reader)")
def test_publish_and_deliver(benchmark: Any, redis_url: str, loop: asyncio.AbstractEventLoop, mode: str) -> None:
    run = _on(loop)
    n = N_COMMANDS if mode == "pipelined" else N_COMMANDS // 4
    channel = _channel()
    received = 0
    done: asyncio.Future[None] | None = None

    def on_command(cmd: wire.Command) -> None:
        nonlocal received
        if type(cmd) is wire.RdataCommand:
            cmd.row  # noqa: B018 - a reader looks at the row
        received += 1
        if received == n and done is not None:
            done.set_result(None)

    reader = RedisCarrier(
        redis_url, channel, on_command=on_command, instance_name="bench-reader", subscribe_user_ip=True
    )
    writer = RedisCarrier(
        redis_url, channel, listen=False, pipelining=mode == "pipelined", max_pending=n, instance_name="bench-writer"
    )

    async def start() -> None:
        await reader.start()
        await writer.start()
        await reader.wait_subscribed(5)

    async def one_round() -> int:
        nonlocal received, done
        received = 0
        done = asyncio.get_running_loop().create_future()
        writer.send_many(COMMANDS[:n])
        await asyncio.wait_for(done, 60)
        return n

    run(start())
    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == n
    finally:
        run(writer.close())
        run(reader.close())
    assert reader.stats.invalid == 0
    benchmark.extra_info.update(items=n, loop=type(loop).__module__.split(".")[0], round_trips=writer.stats.round_trips)


# ---------------------------------------------------------------------- whole stack


@pytest.mark.benchmark(group="redis replication, facts written -> delivered by a Follower")
def test_replication_end_to_end(benchmark: Any, redis_url: str, loop: asyncio.AbstractEventLoop) -> None:
    """LocalStream.write -> Publisher -> RedisReplication -> Redis -> RedisReplication -> Follower handler."""
    from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
    from factstream.transport.redis import RedisReplication

    run = _on(loop)
    n = N_COMMANDS // 2
    channel = _channel()
    stream = LocalStream("to_device", "bench-writer")
    pub = Publisher("bench-writer")
    pub.add_stream("to_device", stream.source, 0)
    stream.add_listener(pub.notify)
    writer = RedisReplication(ReplicationHub("bench-writer", publisher=pub), redis_url, channel, max_pending=n * 2)
    fol = Follower(sources={"to_device": stream.source}, start_position=0)
    delivered = 0

    def count(s: str, w: str, t: int, rows: list[Any]) -> None:
        nonlocal delivered
        delivered += len(rows)

    fol.add_handler(count)
    reader = RedisReplication(ReplicationHub("bench-reader", follower=fol), redis_url, channel)

    async def start() -> None:
        await writer.start()
        await reader.start()
        await writer.wait_connected(5)
        await reader.wait_connected(5)

    async def one_round() -> int:
        before = delivered
        for i in range(n):
            stream.write([[f"@user{i % 997}:example.org"]])
        await fol.wait_for_position("to_device", "bench-writer", stream.current_token(), timeout=60)
        return delivered - before

    run(start())
    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == n
    finally:
        run(writer.stop())
        run(reader.stop())
        run(fol.close())
        pub.close()
    benchmark.extra_info.update(items=n, loop=type(loop).__module__.split(".")[0], catchup_fetches=fol.stats["catchup_fetches"])
