"""Replication over NATS JetStream: acknowledged rows/s, publish+deliver, and replay vs catch-up.

Groups (each measured in the same run as its baseline):

* ``nats publish (acknowledged)``: N facts written through a ``LocalStream``
  -> ``Publisher`` -> carrier, the clock stopping when the server acknowledged
  every row. factstream's JetStream carrier vs its Redis carrier (Redis
  acknowledges PUBLISH) vs raw nats-py (``js.publish_async`` of the same wire
  lines in the same pages with the same message ids, all futures awaited).
* ``nats publish+deliver``: the same facts until a ``Follower`` in another hub
  delivered all of them: JetStream carrier vs Redis carrier vs raw nats-py
  (``publish_async`` of the pages + a push subscription decoding every page).
* ``nats replay vs catch-up``: a reader far behind gets REPLAY_ROWS rows
  (default 1,000,000; ``FACTSTREAM_BENCH_REPLAY_ROWS``) either replayed from
  the retained JetStream log (no database) or fetched by the follower's
  catch-up from the PostgreSQL table holding the same rows; a third row
  replays the log into a hub that only counts the RDATA it is handed (the
  carrier's own share: delivery and page decoding, no Follower). Each is
  measured with the cycle collector as Python starts it and with the
  start-up heap frozen first (``gc.freeze()``, as a server does once).

Every row records ``factstream.IMPL`` and the event loop. Run:
.venv/bin/python -m pytest benchmarks/bench_nats.py --benchmark-only -p no:randomly
--benchmark-json=benchmarks/results/nats-run.json; .venv/bin/python benchmarks/ratios.py benchmarks/results/nats-run.json
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import factstream
from factstream import wire
from factstream.commands import PositionCommand
from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.transport.nats import MSG_ID, PREV, JetStreamLayout, NatsReplication, delete_stream
from factstream.transport.nats.pages import build_pages, decode_page

from conftest import require_service

N_FACTS = int(os.environ.get("FACTSTREAM_BENCH_NATS_FACTS", "20000"))
PAGE_ROWS = 1000  # NatsReplication's default page_rows
REPLAY_ROWS = int(os.environ.get("FACTSTREAM_BENCH_REPLAY_ROWS", "1000000"))
NATS_URL = "nats://127.0.0.1:4222"
LOOPS = ["uvloop", "asyncio"]
STREAM = "to_device"


def _row(i: int) -> list[Any]:
    return [f"@user{i % 997}:example.org"]


@pytest.fixture
def nats_url() -> str:
    require_service("NATS JetStream", "127.0.0.1", 4222, "nats-server -js -p 4222")
    return NATS_URL


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    if request.param == "uvloop":
        import uvloop

        lp: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        lp = asyncio.new_event_loop()
    try:
        yield lp
    finally:
        lp.close()


def _on(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    return loop.run_until_complete


def _name() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def _info(benchmark: Any, loop: asyncio.AbstractEventLoop | None, **extra: Any) -> None:
    benchmark.extra_info.update(impl=factstream.IMPL, **extra)
    if loop is not None:
        benchmark.extra_info["loop"] = type(loop).__module__.split(".")[0]


class _Writer:
    """A writer process's pieces: LocalStream -> Publisher -> hub -> carrier."""

    def __init__(self, carrier: str, url: str, name: str) -> None:
        self.stream = LocalStream(STREAM, "w1")
        self.publisher = Publisher("w1")
        self.publisher.add_stream(STREAM, self.stream.source, 0)
        self.stream.add_listener(self.publisher.notify)
        self.hub = ReplicationHub("w1", publisher=self.publisher)
        self.link: Any
        if carrier == "nats":
            self.link = NatsReplication(self.hub, url, name, max_pending=10 * N_FACTS)
        else:
            from factstream.transport.redis import RedisReplication

            self.link = RedisReplication(self.hub, url, name, max_pending=10 * N_FACTS)

    def write(self, n: int) -> None:
        for i in range(n):
            self.stream.write([_row(i)])

    async def acknowledged(self) -> None:
        if isinstance(self.link, NatsReplication):
            await self.link.flush(120)
        else:
            await self.link.carrier.flush()


class _Reader:
    def __init__(self, carrier: str, url: str, name: str, source: Any) -> None:
        self.follower = Follower(sources={STREAM: source}, start_position=0)
        self.delivered = 0

        def count(s: str, w: str, t: int, rows: list[Any]) -> None:
            self.delivered += len(rows)

        self.follower.add_handler(count)
        hub = ReplicationHub("r1", follower=self.follower)
        self.link: Any
        if carrier == "nats":
            self.link = NatsReplication(hub, url, name)
        else:
            from factstream.transport.redis import RedisReplication

            self.link = RedisReplication(hub, url, name)


def _cpu_per_row(cpu: list[float], rows: int) -> float | None:
    """Median CPU microseconds per row of this process over the rounds (the client's own cost)."""
    if not cpu:
        return None
    return round(1e6 * sorted(cpu)[len(cpu) // 2] / rows, 2)


def _carrier_url(carrier: str, request: pytest.FixtureRequest) -> str:
    if carrier == "nats":
        return str(request.getfixturevalue("nats_url"))
    return str(request.getfixturevalue("redis_url"))


# ---------------------------------------------------------------------- publish (acknowledged)


@pytest.mark.parametrize("carrier", ["nats", "redis"])
@pytest.mark.benchmark(group="nats publish (acknowledged)")
def test_publish_acknowledged(benchmark: Any, request: pytest.FixtureRequest, loop: asyncio.AbstractEventLoop,
                              carrier: str) -> None:
    run = _on(loop)
    url = _carrier_url(carrier, request)
    name = _name()
    w = _Writer(carrier, url, name)
    cpu: list[float] = []

    async def one_round() -> int:
        started = time.process_time()
        w.write(N_FACTS)
        await w.acknowledged()
        cpu.append(time.process_time() - started)
        return N_FACTS

    async def start() -> None:
        await w.link.start()
        await w.link.wait_connected(15)

    run(start())
    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == N_FACTS
    finally:
        run(w.link.stop())
        w.publisher.close()
        if carrier == "nats":
            run(delete_stream(url, name))
    _info(benchmark, loop, items=N_FACTS, carrier=carrier, cpu_us_per_row=_cpu_per_row(cpu, N_FACTS))
    if carrier == "nats":
        assert w.link.stats.retried == 0 and w.link.acked_positions() == {STREAM: w.stream.current_token()}


def _pages(start: int, n: int, rows: Callable[[int], list[Any]] = lambda i: _row(i)) -> list[tuple[bytes, dict[str, str]]]:
    """Facts ``start .. start+n-1`` as the carrier pages them: (payload, headers) per message."""
    out: list[tuple[bytes, dict[str, str]]] = []
    prev = start - 1
    for first in range(start, start + n, PAGE_ROWS):
        cmds = [wire.RdataCommand(STREAM, "w1", t, rows(t - start)) for t in range(first, min(first + PAGE_ROWS, start + n))]
        pages, _ = build_pages(STREAM, "w1", cmds, prev, 256 * 1024)
        for page in pages:
            out.append((page.payload, {MSG_ID: page.msg_id, PREV: str(page.prev)}))
            prev = page.end if page.end is not None else prev
    return out


async def _raw_publish(js: Any, subject: str, pages: list[tuple[bytes, dict[str, str]]]) -> None:
    futures = [await js.publish_async(subject, payload, headers=headers) for payload, headers in pages]
    await asyncio.gather(*futures)


@pytest.mark.benchmark(group="nats publish (acknowledged)")
def test_publish_raw_nats_py(benchmark: Any, nats_url: str, loop: asyncio.AbstractEventLoop) -> None:
    """Baseline: nats-py's own pipelined JetStream publish (publish_async) of the same pages and ids."""
    import nats

    run = _on(loop)
    name = _name()
    layout = JetStreamLayout.for_server(name)
    subject = layout.log_subject(STREAM, "w1")
    state = {"next": 1}
    cpu: list[float] = []

    async def setup() -> Any:
        nc = await nats.connect(nats_url)
        js = nc.jetstream(publish_async_max_pending=20_000)
        await js.add_stream(name=layout.stream, subjects=[layout.log_subjects])
        return nc, js

    nc, js = run(setup())

    async def one_round() -> int:
        started = time.process_time()
        start = state["next"]
        await _raw_publish(js, subject, _pages(start, N_FACTS))
        state["next"] = start + N_FACTS
        cpu.append(time.process_time() - started)
        return N_FACTS

    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == N_FACTS
    finally:
        run(js.delete_stream(layout.stream))
        run(nc.close())
    _info(benchmark, loop, items=N_FACTS, carrier="nats-py", cpu_us_per_row=_cpu_per_row(cpu, N_FACTS))


# ---------------------------------------------------------------------- publish + deliver


@pytest.mark.parametrize("carrier", ["nats", "redis"])
@pytest.mark.benchmark(group="nats publish+deliver (delivered by a Follower)")
def test_publish_and_deliver(benchmark: Any, request: pytest.FixtureRequest, loop: asyncio.AbstractEventLoop,
                             carrier: str) -> None:
    run = _on(loop)
    url = _carrier_url(carrier, request)
    name = _name()
    w = _Writer(carrier, url, name)
    r = _Reader(carrier, url, name, w.stream.source)

    async def start() -> None:
        await w.link.start()
        await w.link.wait_connected(15)
        await r.link.start()
        await r.link.wait_connected(15)

    async def one_round() -> int:
        before = r.delivered
        w.write(N_FACTS)
        await r.follower.wait_for_position(STREAM, "w1", w.stream.current_token(), timeout=120)
        return r.delivered - before

    run(start())
    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == N_FACTS
    finally:
        run(w.link.stop())
        run(r.link.stop())
        run(r.follower.close())
        w.publisher.close()
        if carrier == "nats":
            run(delete_stream(url, name))
    _info(benchmark, loop, items=N_FACTS, carrier=carrier, catchup_fetches=r.follower.stats["catchup_fetches"])


@pytest.mark.benchmark(group="nats publish+deliver (delivered by a Follower)")
def test_publish_and_deliver_raw_nats_py(benchmark: Any, nats_url: str, loop: asyncio.AbstractEventLoop) -> None:
    """Baseline: publish_async of the pages + a nats-py push subscription decoding every page (no ordering checks)."""
    import nats

    run = _on(loop)
    name = _name()
    layout = JetStreamLayout.for_server(name)
    subject = layout.log_subject(STREAM, "w1")
    state: dict[str, Any] = {"next": 1, "got": 0, "done": None}

    async def on_msg(msg: Any) -> None:
        state["got"] += len(decode_page(msg.data))
        if state["got"] >= state["want"] and not state["done"].done():
            state["done"].set_result(None)

    async def setup() -> Any:
        nc = await nats.connect(nats_url)
        js = nc.jetstream(publish_async_max_pending=20_000)
        await js.add_stream(name=layout.stream, subjects=[layout.log_subjects])
        sub = await js.subscribe(subject, cb=on_msg, ordered_consumer=True)
        return nc, js, sub

    nc, js, sub = run(setup())

    async def one_round() -> int:
        start = state["next"]
        state["want"] = state["got"] + N_FACTS
        state["done"] = asyncio.get_running_loop().create_future()
        await _raw_publish(js, subject, _pages(start, N_FACTS))
        await asyncio.wait_for(state["done"], 120)
        state["next"] = start + N_FACTS
        return N_FACTS

    try:
        assert benchmark.pedantic(lambda: run(one_round()), rounds=5, warmup_rounds=1) == N_FACTS
    finally:
        run(sub.unsubscribe())
        run(js.delete_stream(layout.stream))
        run(nc.close())
    _info(benchmark, loop, items=N_FACTS, carrier="nats-py")


# ---------------------------------------------------------------------- replay vs catch-up


@pytest.fixture(scope="module")
def replay_setup() -> Iterator[tuple[str, str]]:
    """REPLAY_ROWS facts of one writer, in a JetStream stream and in a PostgreSQL table (same rows)."""
    require_service("NATS JetStream", "127.0.0.1", 4222, "nats-server -js -p 4222")
    from conftest import PG_HOST, PG_PORT, PG_START, pg_dsn

    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    import psycopg

    from factstream.demo.tables import DEMO_TABLES
    from factstream.replication.tables import ROW_ORDER_COLUMN

    table = next(t for t in DEMO_TABLES if t.stream == STREAM)
    name = _name()
    dbname = f"factstream_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    dsn = pg_dsn(dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for sql in table.create_sql():
                conn.execute(sql)
            # What create_tables adds on PostgreSQL: the row order the table source sorts a token's rows by.
            conn.execute(f"ALTER TABLE {table.table} ADD COLUMN IF NOT EXISTS {ROW_ORDER_COLUMN} BIGINT "
                         "GENERATED BY DEFAULT AS IDENTITY")
            with conn.cursor().copy(f"COPY {table.table} (stream_id, instance_name, entity) FROM STDIN") as copy:
                for i in range(1, REPLAY_ROWS + 1):
                    copy.write_row((i, "w1", _row(i)[0]))
            conn.execute(f"ANALYZE {table.table}")
        asyncio.run(_fill_stream(name))
        yield name, dsn
    finally:
        asyncio.run(delete_stream(NATS_URL, name))
        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


async def _fill_stream(name: str) -> None:
    """The rows as the carrier would have published them (pages, ids, chain), stored without waiting per page."""
    import nats

    layout = JetStreamLayout.for_server(name)
    subject = layout.log_subject(STREAM, "w1")
    nc = await nats.connect(NATS_URL, pending_size=64 * 1024 * 1024)
    try:
        js = nc.jetstream()
        await js.add_stream(name=layout.stream, subjects=[layout.log_subjects])
        chunk = 100 * PAGE_ROWS
        for start in range(1, REPLAY_ROWS + 1, chunk):
            for payload, headers in _pages(start, min(chunk, REPLAY_ROWS + 1 - start), lambda i, s=start: _row(s + i)):
                await nc.publish(subject, payload, headers=headers)
            await nc.flush()
        want = -(-REPLAY_ROWS // PAGE_ROWS)
        deadline = time.monotonic() + 120
        while (await js.stream_info(layout.stream)).state.messages < want:
            assert time.monotonic() < deadline, "JetStream did not store every replay page"
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


@pytest.mark.parametrize("path", ["jetstream-replay", "postgres-catch-up", "jetstream-replay-carrier-only"])
@pytest.mark.parametrize("heap", ["gc-as-is", "gc-frozen"])
@pytest.mark.benchmark(group="nats replay vs catch-up (reader far behind)")
def test_replay_vs_catch_up(benchmark: Any, replay_setup: tuple[str, str], loop: asyncio.AbstractEventLoop,
                            path: str, heap: str) -> None:
    """``heap``: ``gc-frozen`` rounds start with ``gc.freeze()`` (untimed), as a long-running process
    does once after start-up (Synapse does), so the cycle collector's full passes skip the start-up
    objects (here pytest's); ``gc-as-is`` leaves the collector as Python starts it."""
    from factstream.demo.tables import DEMO_TABLES
    from factstream.store.database import connect

    if type(loop).__module__.startswith("asyncio"):
        pytest.skip("one loop (uvloop) is enough for the million-row comparison")
    name, dsn = replay_setup
    run = _on(loop)
    table = next(t for t in DEMO_TABLES if t.stream == STREAM)
    queries = {"n": 0}
    cpu = {"s": 0.0}

    async def one_round() -> int:
        started = time.process_time()
        db = await connect(dsn)
        source = table.source(db)

        class Counting:
            async def get_updates(self, *args: Any) -> Any:
                queries["n"] += 1
                return await source.get_updates(*args)

        follower = Follower(sources={STREAM: Counting()}, start_position=0)
        got = {"rows": 0}
        follower.add_handler(lambda s, w, t, rows: got.__setitem__("rows", got["rows"] + len(rows)))
        hub = ReplicationHub("replayer", follower=follower)
        link = None
        try:
            if path == "jetstream-replay-carrier-only":
                done = asyncio.Event()

                def count(conn: Any, cmds: list[Any]) -> None:  # the hub's run call, without the Follower
                    got["rows"] += len(cmds)
                    if got["rows"] >= REPLAY_ROWS:
                        done.set()

                hub.rdata_received = count  # type: ignore[method-assign]
                link = NatsReplication(hub, NATS_URL, name)
                await link.start()
                await asyncio.wait_for(done.wait(), 1800)
            elif path == "jetstream-replay":
                link = NatsReplication(hub, NATS_URL, name)
                await link.start()
            else:
                follower.on_position(PositionCommand(STREAM, "w1", REPLAY_ROWS, REPLAY_ROWS))
            if path != "jetstream-replay-carrier-only":
                await follower.wait_for_position(STREAM, "w1", REPLAY_ROWS, timeout=1800)
        finally:
            if link is not None:
                await link.stop()
            await follower.close()
            await db.close()
        cpu["s"] = time.process_time() - started
        return got["rows"]

    def freeze() -> None:
        if heap == "gc-frozen":
            gc.collect()
            gc.freeze()

    try:
        assert benchmark.pedantic(lambda: run(one_round()), setup=freeze, rounds=1, iterations=1) == REPLAY_ROWS
    finally:
        gc.unfreeze()
    # The reader's own CPU seconds: on a shared machine the wall clock also measures the neighbours.
    _info(benchmark, loop, items=REPLAY_ROWS, path=path, heap=heap, database_queries=queries["n"],
          reader_cpu_s=round(cpu["s"], 2), reader_cpu_us_per_row=round(1e6 * cpu["s"] / REPLAY_ROWS, 2))
    if path != "postgres-catch-up":
        assert queries["n"] == 0
