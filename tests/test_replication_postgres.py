"""Catch-up from real database tables (PostgreSQL and SQLite) through the id generators."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from factstream.replication import Follower, Publisher, ReplicationHub
from factstream.replication.tables import create_tables, open_id_generators
from factstream.demo.tables import DEMO_TABLES
from factstream.store.database import connect
from factstream.transport.tcp import TcpClient, TcpServer

TABLE = DEMO_TABLES[0]  # to_device


async def _write(db: Any, gen: Any, n: int, *, rollback_every: int = 0, rows_per_fact: int = 1) -> None:
    for i in range(n):
        try:
            async with db.transaction() as txn:
                token = await gen.get_next_txn(txn)
                for j in range(rows_per_fact):
                    await txn.execute(TABLE.insert_sql(), TABLE.insert_params(token, "master", [f"@u{token}_{j}:hs"]))
                if rollback_every and i % rollback_every == 0:
                    raise RuntimeError("rollback")
        except RuntimeError:
            pass


async def _scenario(url: str) -> None:
    db = await connect(url)
    await create_tables(db, [TABLE])
    gens = await open_id_generators(db, "master", [TABLE])
    gen = gens["to_device"]
    pub = Publisher("master", page_limit=10)
    pub.add_stream("to_device", TABLE.source(db), gen.current_token_for_writer("master"))
    gen.add_listener(pub.notify)
    server = await TcpServer(ReplicationHub("master", publisher=pub), "pg.hs").start()
    await _write(db, gen, 30, rollback_every=7)  # history before the reader exists

    reader_db = await connect(url)
    fol = Follower(sources={"to_device": TABLE.source(reader_db)}, start_position=0, page_limit=4)
    got: list[tuple[int, list[Any]]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, [r.entity for r in rows])))
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port, backoff_initial=0.01).start()
    await _write(db, gen, 20, rows_per_fact=3)  # live, with batches
    await pub.flush()
    await fol.wait_for_position("to_device", "master", gen.current_token(), 10)
    for conn in list(server.connections):
        conn.close("test cut")
    await _write(db, gen, 25, rollback_every=5)  # while the reader is away
    await pub.flush()
    await fol.wait_for_position("to_device", "master", gen.current_token(), 10)

    truth: dict[int, list[str]] = {}
    for token, entity in await db.fetchall(f"SELECT stream_id, entity FROM {TABLE.table} ORDER BY stream_id", ()):
        truth.setdefault(int(token), []).append(TABLE.to_row((entity,))[0])
    tokens = [t for t, _ in got]
    assert tokens == sorted(set(tokens))
    assert {t: sorted(r) for t, r in got} == {t: sorted(r) for t, r in truth.items()}
    assert fol.stats["catchup_fetches"] >= 5
    await client.stop()
    await server.stop()
    await gen.close()
    await db.close()
    await reader_db.close()


@pytest.mark.postgres
async def test_catch_up_from_postgres_tables(postgres_dsn: str) -> None:
    await _scenario(postgres_dsn)


async def test_catch_up_from_sqlite_tables(tmp_path: Any) -> None:
    await _scenario(f"sqlite:///{tmp_path}/r.db")
    await asyncio.sleep(0)


async def test_database_backed_cache_invalidation_over_tcp(tmp_path: Any) -> None:
    from factstream.replication import CacheInvalidator, CacheRegistry, SimpleCache
    from factstream.replication.tables import TableWriter

    caches_table = DEMO_TABLES[2]
    url = f"sqlite:///{tmp_path}/c.db"
    db = await connect(url)
    await create_tables(db, [caches_table])
    gen = (await open_id_generators(db, "master", [caches_table]))["caches"]
    pub = Publisher("master")
    pub.add_stream("caches", caches_table.source(db), gen.current_token_for_writer("master"))
    gen.add_listener(pub.notify)
    server = await TcpServer(ReplicationHub("master", publisher=pub), "c.hs").start()
    inv = CacheInvalidator(TableWriter(db, gen, caches_table).write)
    await inv.invalidate("get_user_by_id", ["@early:hs"])  # before the reader: reaches it by catch-up

    reader_db = await connect(url)
    registry = CacheRegistry()
    users = SimpleCache({("@early:hs",): 1, ("@bob:hs",): 2, ("@ann:hs",): 3})
    registry.register("get_user_by_id", users)
    fol = Follower(sources={"caches": caches_table.source(reader_db)}, start_position=0)
    fol.add_handler(registry.on_rows, "caches")
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port).start()
    token = await inv.invalidate_many([("get_user_by_id", ["@bob:hs"]), ("other", None)])
    await pub.flush()
    await fol.wait_for_position("caches", "master", token, 5)
    assert users == {("@ann:hs",): 3}
    token = await inv.invalidate("get_user_by_id", None)
    await pub.flush()
    await fol.wait_for_position("caches", "master", token, 5)
    assert users == {}
    await client.stop()
    await server.stop()
    await gen.close()
    await db.close()
    await reader_db.close()
