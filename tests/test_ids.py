"""Id generators on SQLite and PostgreSQL: the same suite on both engines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from factstream.ids import (
    IdGenerator,
    IdGeneratorError,
    PositionWaitTimeout,
    SequenceBehindError,
    create_id_generator,
)
from factstream.ids.generators import MAX_ID, MAX_IDS_PER_CALL
from factstream.store.database import Database, DatabaseError, connect

TABLES = [("facts", "instance_name", "stream_id")]

#: writers run on uvloop in production: every test here runs on both loops
BOTH_EVENT_LOOPS = True


@pytest.fixture
async def db(engine_db: Database) -> Database:
    await engine_db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    return engine_db


async def make(db: Database, **kw: object) -> IdGenerator:
    kw.setdefault("stream_name", "events")
    kw.setdefault("instance_name", "master")
    kw.setdefault("tables", TABLES)
    return await create_id_generator(db, **kw)  # type: ignore[arg-type]


async def test_seed_worked_example(db: Database) -> None:
    """The seed's table, step by step, through the real generator."""
    gen = await make(db)
    seen: list[tuple[int, int]] = []
    gen.add_listener(lambda stream, inst, old, new: seen.append((old, new)))
    assert gen.current_token() == 1
    async with AsyncExitStack() as s2, AsyncExitStack() as s3:
        assert await s2.enter_async_context(gen.get_next()) == 2
        assert gen.current_token() == 1
        assert await s3.enter_async_context(gen.get_next()) == 3
        assert gen.current_token() == 1
        await s3.aclose()  # complete 3
        assert gen.current_token() == 1
        await s2.aclose()  # complete 2
        assert gen.current_token() == 3
    stacks = {i: AsyncExitStack() for i in (4, 5, 6)}
    for i in (4, 5, 6):
        assert await stacks[i].enter_async_context(gen.get_next()) == i
        assert gen.current_token() == 3
    await stacks[5].aclose()
    assert gen.current_token() == 3
    await stacks[4].aclose()
    assert gen.current_token() == 5  # 6 still pending
    await stacks[6].aclose()
    assert gen.current_token() == 6
    assert seen == [(1, 3), (3, 5), (5, 6)]
    assert gen.current_token_for_writer("master") == gen.max_token() == gen.persisted_upto() == 6
    await gen.close()


async def test_failed_write_is_a_hole_the_position_moves_past(db: Database) -> None:
    gen = await make(db)
    with pytest.raises(RuntimeError):
        async with gen.get_next() as sid:
            assert sid == 2
            raise RuntimeError("write failed")
    assert gen.current_token() == 2
    async with gen.get_next() as sid:
        await db.execute("INSERT INTO facts VALUES (?, 'master', 'x')", (sid,))
    assert gen.current_token() == 3
    await gen.close()


async def test_get_next_txn_completes_after_commit_and_rollback(db: Database) -> None:
    gen = await make(db)
    async with db.transaction() as txn:
        sid = await gen.get_next_txn(txn)
        await txn.execute("INSERT INTO facts VALUES (?, 'master', 'a')", (sid,))
        assert gen.current_token() == 1  # not yet committed
    assert sid == 2 and gen.current_token() == 2
    with pytest.raises(ValueError):
        async with db.transaction() as txn:
            ids = await gen.get_next_mult_txn(txn, 3)
            assert ids == [3, 4, 5]
            await txn.executemany("INSERT INTO facts VALUES (?, 'master', 'b')", [(i,) for i in ids])
            raise ValueError("roll back")
    assert gen.current_token() == 5  # rolled back ids are holes
    assert await db.fetchall("SELECT stream_id FROM facts ORDER BY stream_id") == [(2,)]
    await gen.close()


async def test_get_next_mult(db: Database) -> None:
    gen = await make(db)
    async with gen.get_next_mult(100) as ids:
        assert ids == list(range(2, 102))
        assert gen.current_token() == 1
    assert gen.current_token() == 101
    with pytest.raises(ValueError, match="at least 1"):
        async with gen.get_next_mult(0):
            pass
    await gen.close()


async def test_get_next_txn_refuses_a_finished_transaction(db: Database) -> None:
    """An id reserved in a transaction that had already ended never completed: the stream's position stopped
    there for good. Now it is refused, nothing is reserved, and the stream goes on."""
    gen = await make(db)
    async with db.transaction() as done:
        pass
    with pytest.raises(DatabaseError, match="transaction already finished"):
        await gen.get_next_txn(done)
    with pytest.raises(DatabaseError, match="transaction already finished"):
        await gen.get_next_mult_txn(done, 3)
    async with gen.get_next() as sid:
        assert sid == 2  # nothing was taken by the refused calls
    await gen.wait_for("master", sid, timeout=5)  # used to time out: the refused id held the position back
    assert gen.current_token() == 2
    await gen.close()


async def test_a_bad_n_is_refused_before_anything_changes(db: Database) -> None:
    """get_next_mult(2.5) used to move a SQLite counter to 3.5 (and write 1003.5 to stream_id_blocks) before
    failing, breaking the generator for good; True handed out one id; a huge n ran generate_series unbounded
    on PostgreSQL. Every bad n is refused first, in and out of a transaction, and the next id is still 2."""
    gen = await make(db)
    for bad in (2.5, True, "3", None, 0, -1, MAX_IDS_PER_CALL + 1, 10**19):
        expected = TypeError if isinstance(bad, bool) or not isinstance(bad, int) else ValueError
        with pytest.raises(expected, match="n .the number of ids|cannot reserve"):
            async with gen.get_next_mult(bad):  # type: ignore[arg-type]
                pass
        with pytest.raises(expected, match="n .the number of ids|cannot reserve"):
            async with db.transaction() as txn:
                await gen.get_next_mult_txn(txn, bad)  # type: ignore[arg-type]
    async with gen.get_next_mult(2) as ids:
        assert ids == [2, 3]
    assert gen.current_token() == 3
    if db.engine == "sqlite":
        row = await db.fetchone("SELECT typeof(reserved_upto) FROM stream_id_blocks WHERE stream_name = 'events'")
        assert row == ("integer",)
    await gen.close()


async def test_sqlite_ids_stay_within_signed_64_bit(tmp_path: Path) -> None:
    """Near the largest BIGINT the counter hands out what fits and refuses the rest clearly (its block record
    is capped), instead of an OverflowError from the driver on every later id."""
    db = await connect(f"sqlite:///{tmp_path / 'max.db'}")
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    await db.execute("INSERT INTO facts VALUES (?, 'master', 'x')", (MAX_ID - 3,))
    gen = await make(db)
    async with gen.get_next() as sid:
        assert sid == MAX_ID - 2
    with pytest.raises(IdGeneratorError, match="largest signed 64-bit id"):
        async with gen.get_next_mult(5):
            pass
    async with gen.get_next_mult(2) as ids:
        assert ids == [MAX_ID - 1, MAX_ID]
    assert gen.current_token() == MAX_ID
    await gen.close()
    await db.close()


async def test_concurrent_tasks_get_distinct_ids_and_position_reaches_max(db: Database) -> None:
    gen = await make(db)
    got: list[int] = []

    async def one(i: int) -> None:
        async with gen.get_next() as sid:
            got.append(sid)
            await asyncio.sleep(0.001 * (i % 5))
            if i % 7 == 0:
                return  # nothing written: still completes
            await db.execute("INSERT INTO facts VALUES (?, 'master', 'c')", (sid,))

    await asyncio.gather(*(one(i) for i in range(60)))
    assert sorted(got) == list(range(2, 62))
    assert gen.current_token() == 61
    await gen.close()


async def test_restart_recovers_position_from_tables(db: Database) -> None:
    gen = await make(db)
    for _ in range(3):
        async with gen.get_next() as sid:
            await db.execute("INSERT INTO facts VALUES (?, 'master', 'x')", (sid,))
    await gen.close()
    # rows written without the generator's knowledge (stream_positions lags) still count
    await db.execute("INSERT INTO facts VALUES (10, 'master', 'late')")
    again = await make(db)
    assert again.current_token() == 10
    async with again.get_next() as sid:
        assert sid == 11
    await again.close()


async def test_sqlite_writer_restarted_after_a_crash_never_reuses_an_id(tmp_path: Path) -> None:
    # A crashed SQLite writer (no close(), stream_positions not yet written) had
    # handed out ids whose facts rolled back: readers saw a POSITION past them.
    # Restarted, its counter used to come from the tables only and gave those
    # ids out again, and readers dropped the new facts as stale.
    path = tmp_path / "crash.db"
    db = await connect(f"sqlite:///{path}")
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    gen = await make(db)
    used = []
    for _ in range(5):
        with pytest.raises(RuntimeError):
            async with gen.get_next() as sid:
                used.append(sid)
                raise RuntimeError("rolled back: nothing written")
    assert gen.current_token() == max(used)  # announced: readers are past these ids
    gen._closed = True  # the process dies: no close(), nothing more written
    if gen._flush_task is not None:
        gen._flush_task.cancel()
    from factstream.ids import generators

    generators._SQLITE_WRITERS.clear()  # a new process: it knows nothing of the dead one's counter
    await db.execute("DELETE FROM stream_positions")  # the background write had not happened yet
    again = await make(db)
    # The position it starts at (past the dead writer's ids) is backed by the database before it is
    # announced: a reader checks a writer's POSITION against stream_positions and the tables.
    recorded = await db.fetchall("SELECT MAX(stream_id) FROM stream_positions WHERE stream_name = 'events'")
    assert recorded[0][0] is not None and recorded[0][0] >= again.current_token() >= max(used)
    async with again.get_next() as sid:
        assert sid > max(used), f"id {sid} handed out again after a restart (used before: {used})"
    assert again.current_token() >= max(used)
    await again.close()
    await db.close()


async def test_stream_positions_records_the_local_position(db: Database) -> None:
    gen = await make(db)
    async with gen.get_next_mult(5):
        pass
    await gen.flush_positions()
    assert await db.fetchall("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'events'") == [
        ("master", 6)
    ]
    await gen.close()


async def test_backwards_stream(db: Database) -> None:
    gen = await make(db, stream_name="backfill", backwards=True)
    seen: list[tuple[int, int]] = []
    gen.add_listener(lambda s, i, old, new: seen.append((old, new)))
    async with gen.get_next() as sid:
        assert sid == -2
        await db.execute("INSERT INTO facts VALUES (?, 'master', 'old event')", (sid,))
    async with gen.get_next_mult(3) as ids:
        assert ids == [-3, -4, -5]
    assert gen.current_token() == 5  # positive magnitude
    assert seen == [(1, 2), (2, 5)]
    await gen.close()
    again = await make(db, stream_name="backfill", backwards=True)
    assert again.current_token() >= 2
    async with again.get_next() as sid:
        assert sid < -5 or (db.engine == "sqlite" and sid == -6)
    await again.close()


async def test_listener_errors_do_not_stop_the_writer(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    gen = await make(db)

    def bad(*args: object) -> None:
        raise RuntimeError("listener bug")

    gen.add_listener(bad)
    with caplog.at_level(logging.ERROR):
        async with gen.get_next():
            pass
    assert gen.current_token() == 2
    assert "listener" in caplog.text
    gen.remove_listener(bad)
    await gen.close()


async def test_wait_for(db: Database) -> None:
    gen = await make(db)

    async def write_later() -> None:
        await asyncio.sleep(0.02)
        async with gen.get_next_mult(3):
            pass

    task = asyncio.ensure_future(write_later())
    await gen.wait_for("master", 4, timeout=5)
    await gen.wait_for(None, 4, timeout=5)
    await task
    await gen.wait_for("master", 2, timeout=0)  # already there
    with pytest.raises(PositionWaitTimeout, match="reached 4, not 10") as info:
        await gen.wait_for("master", 10, timeout=0.05)
    assert isinstance(info.value, TimeoutError)
    assert info.value.reached == 4 and info.value.wanted == 10
    await gen.close()


async def test_reader_instance_tracks_but_cannot_reserve(db: Database) -> None:
    reader = await make(db, instance_name="reader")
    assert not reader.is_writer
    with pytest.raises(IdGeneratorError, match="not a writer"):
        async with reader.get_next():
            pass
    reader.advance("master", 7)
    assert reader.current_token() == 7
    reader.advance("master", 5)  # never backwards
    assert reader.positions() == {"master": 7}
    waiter = asyncio.ensure_future(reader.wait_for("master", 9, timeout=5))
    await asyncio.sleep(0)
    reader.advance("master", 9)
    await waiter
    await reader.close()


async def test_sqlite_refuses_several_writers(tmp_path: Path) -> None:
    db = await connect(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(IdGeneratorError, match="only one writer"):
            await create_id_generator(db, stream_name="s", instance_name="a", writers=("a", "b"))
        gen = await create_id_generator(db, stream_name="s", instance_name="a", writers=("a",))
        with pytest.raises(IdGeneratorError, match="already has a writer"):
            await create_id_generator(db, stream_name="s", instance_name="a", writers=("a",))
        await gen.close()
        again = await create_id_generator(db, stream_name="s", instance_name="a", writers=("a",))
        await again.close()
    finally:
        await db.close()


async def test_bad_table_spec_is_refused(db: Database) -> None:
    with pytest.raises(IdGeneratorError, match="plain SQL identifier"):
        await make(db, tables=[("facts; DROP TABLE facts", None, "stream_id")])


# ----------------------------------------------------------------------------- PostgreSQL only


@pytest.fixture
async def pg(postgres_dsn: str) -> AsyncIterator[Database]:
    conn = await connect(postgres_dsn)
    await conn.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    try:
        yield conn
    finally:
        await conn.close()


W3 = ("w1", "w2", "w3")


@pytest.mark.postgres
async def test_multi_writer_positions_in_one_database(pg: Database) -> None:
    w1 = await make(pg, instance_name="w1", writers=W3)
    w2 = await make(pg, instance_name="w2", writers=W3)
    reader = await make(pg, instance_name="reader", writers=W3)
    cm0 = w1.get_next()  # held open on purpose (keep the reference: GC would close it)
    a = await cm0.__aenter__()
    cm1 = w1.get_next()
    id1 = await cm1.__aenter__()
    async with w2.get_next_mult(3) as ids2:
        assert min(ids2) > id1
    # w2 completed; w1 still has id1 in flight, so w1 holds the linear position back
    assert w2.current_token_for_writer("w2") == max(ids2)
    w1.advance("w2", max(ids2))
    assert w1.current_token_for_writer("w1") < id1
    await cm1.__aexit__(None, None, None)
    assert w1.current_token_for_writer("w1") < a  # 'a' (smaller) is still pending
    await cm0.__aexit__(None, None, None)
    # w1 idle now: it takes the largest known position
    assert w1.current_token_for_writer("w1") == max(ids2)
    for name, gen in (("w1", w1), ("w2", w2)):
        reader.advance(name, gen.current_token_for_writer(name))
    # w3 never wrote: its position is the floor, and the linear token waits for it
    assert reader.current_token() == 1
    reader.advance("w3", max(ids2))
    assert reader.current_token() == max(ids2) == reader.max_token()
    for g in (w1, w2, reader):
        await g.close()


@pytest.mark.postgres
async def test_multi_writer_recovery_from_stream_positions_and_tables(pg: Database) -> None:
    w1 = await make(pg, instance_name="w1", writers=W3)
    w2 = await make(pg, instance_name="w2", writers=W3)
    w3 = await make(pg, instance_name="w3", writers=W3)
    for gen in (w1, w2, w3, w1):
        async with gen.get_next() as sid:
            await pg.execute("INSERT INTO facts VALUES (?, ?, 'x')", (sid, gen.instance_name))
    for gen in (w1, w2, w3):
        await gen.close()
    # w2 writes more but crashes before recording its position
    async with pg.transaction() as txn:
        row = await txn.fetchone("SELECT nextval('events_stream_seq')")
        assert row is not None
        await txn.execute("INSERT INTO facts VALUES (?, 'w2', 'late')", (row[0],))
    reader = await make(pg, instance_name="reader", writers=W3)
    assert reader.positions() == {"w1": 5, "w2": row[0], "w3": 4}
    assert reader.current_token() == 4
    await reader.close()


@pytest.mark.postgres
async def test_sequence_behind_table_is_repaired_with_a_warning(pg: Database, caplog: pytest.LogCaptureFixture) -> None:
    gen = await make(pg)
    async with gen.get_next():
        pass
    await gen.close()
    await pg.execute("INSERT INTO facts VALUES (50, 'master', 'imported')")
    with caplog.at_level(logging.WARNING):
        again = await make(pg)
    assert "moving the sequence to 50" in caplog.text
    async with again.get_next() as sid:
        assert sid == 51
    await again.close()


@pytest.mark.postgres
async def test_sequence_behind_stream_positions_stops_startup(pg: Database) -> None:
    gen = await make(pg)
    async with gen.get_next():
        pass
    await gen.close()
    await pg.execute("UPDATE stream_positions SET stream_id = 80")
    with pytest.raises(SequenceBehindError, match=r"setval\('events_stream_seq', 80\)"):
        await make(pg)


@pytest.mark.postgres
async def test_new_sequence_starts_above_existing_rows(pg: Database) -> None:
    await pg.execute("INSERT INTO facts VALUES (41, 'master', 'pre-existing')")
    gen = await make(pg, stream_name="imported", sequence_name="my_seq")
    assert gen.current_token() == 41
    async with gen.get_next() as sid:
        assert sid == 42
    await gen.close()


async def test_sqlite_memory_databases_are_separate() -> None:
    dbs = [await connect("sqlite:///:memory:") for _ in range(2)]
    try:
        gens = [await create_id_generator(d, stream_name="s", instance_name="m", writers=("m",)) for d in dbs]
        for g in gens:
            async with g.get_next() as sid:
                assert sid == 2
            await g.close()
    finally:
        for d in dbs:
            await d.close()


async def test_single_writer_table_without_instance_column(db: Database) -> None:
    await db.execute("CREATE TABLE plain (sid BIGINT NOT NULL)")
    gen = await make(db, stream_name="plain", tables=[("plain", None, "sid")])
    async with gen.get_next() as sid:
        await db.execute("INSERT INTO plain VALUES (?)", (sid,))
    await gen.close()
    await db.execute("INSERT INTO plain VALUES (7)")  # written, position never recorded
    again = await make(db, stream_name="plain", tables=[("plain", None, "sid")])
    assert again.current_token() == 7
    async with again.get_next() as sid:
        assert sid == 8
    await again.close()


@pytest.mark.postgres
async def test_backwards_multi_writer_recovery(pg: Database) -> None:
    w1 = await make(pg, stream_name="backfill", instance_name="w1", writers=("w1", "w2"), backwards=True)
    w2 = await make(pg, stream_name="backfill", instance_name="w2", writers=("w1", "w2"), backwards=True)
    for gen in (w1, w2, w1):
        async with gen.get_next() as sid:
            assert sid < 0
            await pg.execute("INSERT INTO facts VALUES (?, ?, 'old')", (sid, gen.instance_name))
    assert w1.current_token_for_writer("w1") == 4 and w2.current_token_for_writer("w2") == 3
    await w1.close()
    await w2.close()
    await pg.execute("INSERT INTO facts VALUES (-5, 'w2', 'unrecorded')")
    reader = await make(pg, stream_name="backfill", instance_name="r", writers=("w1", "w2"), backwards=True)
    assert reader.positions() == {"w1": 4, "w2": 5}
    assert reader.current_token() == 4
    await reader.close()


async def test_sqlite_block_recorded_in_a_rolled_back_transaction_is_written_again(tmp_path: Path) -> None:
    # The first id of a fresh SQLite writer records its block inside the caller's
    # transaction; when that rolls back, the record is written again (and must
    # not deadlock the writer, whose next transactions go on).
    db = await connect(f"sqlite:///{tmp_path / 'rb.db'}")
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    gen = await make(db)

    async def two_transactions() -> tuple[int, int]:
        first = second = 0
        with pytest.raises(RuntimeError):
            async with db.transaction() as txn:
                first = await gen.get_next_txn(txn)
                raise RuntimeError("roll back")
        async with db.transaction() as txn:
            second = await gen.get_next_txn(txn)
            await txn.execute("INSERT INTO facts VALUES (?, 'master', 'x')", (second,))
        return first, second

    first, second = await asyncio.wait_for(two_transactions(), 10)  # a deadlock fails here instead of hanging
    assert second > first
    await asyncio.sleep(0.05)
    row = await db.fetchone("SELECT reserved_upto FROM stream_id_blocks WHERE stream_name = 'events'")
    assert row is not None and int(row[0]) >= second
    await gen.close()
    await db.close()


async def test_a_sqlite_writer_records_its_next_id_block_ahead_of_use(tmp_path: Path) -> None:
    """Past half of the recorded block the next one is written in the background, so a reservation does not
    wait for the database (busy with another task's transaction) to record it; a clean close gives back what
    is unused."""
    from factstream.ids.generators import SQLITE_ID_BLOCK

    db = await connect(f"sqlite:///{tmp_path / 'ahead.db'}")
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    gen = await make(db)

    async def recorded() -> int:
        row = await db.fetchone("SELECT reserved_upto FROM stream_id_blocks WHERE stream_name = 'events'")
        assert row is not None
        return int(row[0])

    async with gen.get_next_mult(10) as ids:
        assert await recorded() == ids[-1] + SQLITE_ID_BLOCK
    async with gen.get_next_mult(SQLITE_ID_BLOCK // 2 + 100) as ids:  # past half the block: the next is written
        pass
    await asyncio.sleep(0.05)
    assert await recorded() == ids[-1] + SQLITE_ID_BLOCK
    inside, release = asyncio.Event(), asyncio.Event()

    async def busy() -> None:
        async with db.transaction() as txn:
            await txn.execute("INSERT INTO facts VALUES (0, 'other', 'x')")
            inside.set()
            await release.wait()

    holder = asyncio.create_task(busy())
    await inside.wait()

    async def reserve() -> list[int]:
        async with gen.get_next_mult(SQLITE_ID_BLOCK - 200) as more:  # beyond the first block, within the second
            return more

    more = await asyncio.wait_for(reserve(), 5)  # recorded ahead: no wait for the open transaction
    assert not holder.done() and more[-1] > ids[-1] + SQLITE_ID_BLOCK // 2
    release.set()
    await holder
    await asyncio.sleep(0.05)
    assert await recorded() == more[-1] + SQLITE_ID_BLOCK  # and the next block again, in the background
    await gen.close()
    assert await recorded() == more[-1]  # given back on a clean stop: a restart skips nothing
    await db.close()


async def test_a_busy_writer_records_its_position_once_per_flush_interval(db: Database) -> None:
    """The background record of the position is debounced while the position keeps moving: one upsert per
    ``flush_interval`` (it was one after another, each waiting for the database, for as long as ids completed)."""
    gen = await make(db)
    gen.flush_interval = 0.05
    writes: list[float] = []
    original = db.execute

    async def counting(sql: str, params: object = ()) -> int:
        if "stream_positions" in sql:
            writes.append(asyncio.get_running_loop().time())
        return await original(sql, params)  # type: ignore[arg-type]

    db.execute = counting  # type: ignore[method-assign]
    try:
        loop = asyncio.get_running_loop()
        until = loop.time() + 0.6
        while loop.time() < until:
            async with gen.get_next_mult(3):
                pass
            await asyncio.sleep(0.001)
        last = gen.current_token_for_writer("master")
        await asyncio.sleep(0.2)
    finally:
        db.execute = original  # type: ignore[method-assign]
    assert 5 <= len(writes) <= 0.6 / 0.05 + 3, writes
    assert all(b - a >= 0.05 * 0.9 for a, b in zip(writes, writes[1:]))
    row = await db.fetchone("SELECT stream_id FROM stream_positions WHERE stream_name = 'events'")
    assert row is not None and int(row[0]) == last  # the last advance was recorded all the same
    await gen.close()
