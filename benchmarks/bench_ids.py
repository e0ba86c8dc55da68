"""Id generators: ids per second through get_next() and get_next_mult(100), SQLite and PostgreSQL.

One benchmarked call reserves and completes 200 ids one at a time
(``get_next``), or 20 batches of 100 (``get_next_mult(100)``, 2,000 ids).
The body writes nothing: this measures the generator and its round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factstream.ids import IdGenerator, create_id_generator
from factstream.store.database import Database, connect

SINGLE = 200
BATCHES = 20


@pytest.fixture(params=["sqlite", "postgres"])
def gen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, IdGenerator]]:
    url = f"sqlite:///{tmp_path / 'b.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
    loop = asyncio.new_event_loop()

    async def setup() -> tuple[Database, IdGenerator]:
        db = await connect(url)
        await db.execute("CREATE TABLE facts (stream_id BIGINT, instance_name TEXT)")
        g = await create_id_generator(
            db, stream_name="bench", instance_name="master", tables=[("facts", "instance_name", "stream_id")]
        )
        return db, g

    db, g = loop.run_until_complete(setup())
    try:
        yield loop, g
    finally:
        loop.run_until_complete(g.close())
        loop.run_until_complete(db.close())
        loop.close()


async def singles(g: IdGenerator) -> int:
    last = 0
    for _ in range(SINGLE):
        async with g.get_next() as sid:
            last = sid
    return last


async def batches(g: IdGenerator) -> int:
    last = 0
    for _ in range(BATCHES):
        async with g.get_next_mult(100) as ids:
            last = ids[-1]
    return last


@pytest.mark.benchmark(group="ids-get_next")
def test_get_next(benchmark: Any, gen: tuple[asyncio.AbstractEventLoop, IdGenerator]) -> None:
    loop, g = gen
    benchmark.pedantic(lambda: loop.run_until_complete(singles(g)), rounds=10, warmup_rounds=1)
    benchmark.extra_info["items"] = SINGLE
    assert g.current_token() == g.max_token()


@pytest.mark.benchmark(group="ids-get_next_mult")
def test_get_next_mult_100(benchmark: Any, gen: tuple[asyncio.AbstractEventLoop, IdGenerator]) -> None:
    loop, g = gen
    benchmark.pedantic(lambda: loop.run_until_complete(batches(g)), rounds=10, warmup_rounds=1)
    benchmark.extra_info["items"] = BATCHES * 100
    assert g.current_token() == g.max_token()


@pytest.mark.benchmark(group="ids-get_next")
def test_baseline_raw_nextval_postgres(benchmark: Any, postgres_dsn: str) -> None:
    """Baseline: the bare round trip (psycopg, no factstream) that get_next() needs on PostgreSQL."""
    import psycopg

    loop = asyncio.new_event_loop()

    async def setup() -> Any:
        conn = await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True)
        await conn.execute("CREATE SEQUENCE bench_seq")
        return conn

    conn = loop.run_until_complete(setup())

    async def raw() -> int:
        last = 0
        for _ in range(SINGLE):
            cur = await conn.execute("SELECT nextval('bench_seq')")
            row = await cur.fetchone()
            last = row[0]
        return last

    try:
        benchmark.pedantic(lambda: loop.run_until_complete(raw()), rounds=10, warmup_rounds=1)
        benchmark.extra_info["items"] = SINGLE
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
