"""A SQLite file another process keeps locked is an outage, not a crash (a real second process holds the lock).

Before: every write path let the driver's bare ``sqlite3.OperationalError:
database is locked`` escape; opening such a file said to check that it is
readable and writable; the id generator logged a traceback at ERROR for the
position it could not record, gave up recording it (``stream_positions``
stayed behind after the lock was released), and ``close()`` raised.
Now each is :class:`DatabaseUnavailable` naming the file, the generator
waits the lock out with backoff (one line, no traceback) and catches up.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
import pytest

from factstream.ids import create_id_generator
from sqlite_lock import held
from factstream.store.database import Database, DatabaseUnavailable, connect

#: Short enough for a test (the default busy timeout waits 30 s).
BUSY_MS = 150


def assert_says_locked(err: BaseException, path: Path, outcome: str = "nothing was written") -> None:
    text = str(err)
    assert isinstance(err, DatabaseUnavailable), repr(err)
    assert repr(str(path)) in text and "locked by another connection or process" in text, text
    assert f"waiting {BUSY_MS} ms" in text and outcome in text and "retry once it is released" in text, text
    assert err.__cause__ is None and err.__suppress_context__, "the driver's exception would follow in a traceback"


async def open_db(path: Path) -> Database:
    db = await connect(f"sqlite:///{path}")
    await db.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    return db


async def test_every_write_path_on_a_locked_file_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    """Each raised 'sqlite3.OperationalError: database is locked'."""
    path = tmp_path / "locked.db"
    db = await open_db(path)
    try:
        await db.execute("INSERT INTO t VALUES (1)")
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        hooks: list[str] = []

        async def in_transaction() -> None:
            async with db.transaction() as txn:
                txn.call_after_rollback(hooks.append, "rolled back")
                await txn.execute("INSERT INTO t VALUES (6)")

        calls = {
            "execute": lambda: db.execute("INSERT INTO t VALUES (2)"),
            "executemany": lambda: db.executemany("INSERT INTO t VALUES (?)", [(3,), (4,)]),
            "run_transaction": lambda: db.run_transaction([("INSERT INTO t VALUES (?)", [(5,)])]),
        }
        with held(path):
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(DatabaseUnavailable) as err:
                    await call()
                assert time.monotonic() - started >= BUSY_MS / 1000 * 0.9, f"{name} did not wait the busy timeout"
                assert_says_locked(err.value, path)
            with pytest.raises(DatabaseUnavailable) as err:
                await in_transaction()
            assert_says_locked(err.value, path, "the transaction did not start, nothing was written")
            assert hooks == []  # never begun: nothing to roll back
            # WAL: a writer elsewhere does not hold up readers
            assert await db.fetchall("SELECT x FROM t") == [(1,)]
            # a real SQL error is the statement's own, not "unavailable"
            with pytest.raises(sqlite3.OperationalError, match="no such table"):
                await db.execute("INSERT INTO missing VALUES (1)")
        assert await db.fetchall("SELECT x FROM t") == [(1,)]  # nothing of it was written
        await db.execute("INSERT INTO t VALUES (2)")
        await in_transaction()
        await db.run_transaction([("INSERT INTO t VALUES (?)", [(7,)])])
        assert await db.fetchall("SELECT x FROM t ORDER BY x") == [(1,), (2,), (6,), (7,)]
    finally:
        await db.close()


async def test_reads_and_commit_blocked_by_another_process_are_unavailable(tmp_path: Path) -> None:
    """Rollback-journal mode (set by the user: WAL would not block these): a read under another process's
    exclusive lock, and a COMMIT waiting for another process's reader, raised the driver's bare error."""
    path = tmp_path / "journal.db"
    db = await open_db(path)
    try:
        await db.execute("INSERT INTO t VALUES (1)")
        assert await db.fetchall("PRAGMA journal_mode = DELETE") == [("delete",)]
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        with held(path, "BEGIN EXCLUSIVE"):
            for read in (db.fetchall("SELECT x FROM t"), db.fetchone("SELECT x FROM t")):
                with pytest.raises(DatabaseUnavailable) as err:
                    await read
                assert_says_locked(err.value, path)
        hooks: list[str] = []
        with held(path, "BEGIN", "SELECT x FROM t"):  # a reader: our COMMIT cannot take the exclusive lock
            with pytest.raises(DatabaseUnavailable) as err:
                async with db.transaction() as txn:
                    txn.call_after_commit(hooks.append, "committed")
                    txn.call_after_rollback(hooks.append, "rolled back")
                    await txn.execute("INSERT INTO t VALUES (2)")
            assert_says_locked(err.value, path, "the transaction was not committed (it rolls back)")
            assert hooks == ["rolled back"]
            with pytest.raises(DatabaseUnavailable) as err:
                await db.run_transaction([("INSERT INTO t VALUES (?)", [(3,)])])
            assert_says_locked(err.value, path)
        assert await db.fetchall("SELECT x FROM t") == [(1,)]
        async with db.transaction() as txn:
            await txn.execute("INSERT INTO t VALUES (2)")
        assert await db.fetchall("SELECT x FROM t ORDER BY x") == [(1,), (2,)]
    finally:
        await db.close()


@pytest.mark.slow
async def test_opening_a_file_locked_elsewhere_is_unavailable_not_unreadable(tmp_path: Path) -> None:
    """It said "cannot open SQLite database ... (database is locked); check that the file and its folder are
    readable and writable" (a DatabaseError: not retried by callers that wait out an outage). Waits the
    default busy timeout (30 s; the URL's ?busy_timeout= shortens it: test_database_busy_timeout.py)."""
    path = tmp_path / "journal.db"
    plain = sqlite3.connect(path)  # rollback-journal mode: opening must switch it to WAL, which needs the lock
    plain.execute("CREATE TABLE t (x INTEGER)")
    plain.commit()
    plain.close()
    with held(path):
        with pytest.raises(DatabaseUnavailable) as err:
            await connect(f"sqlite:///{path}")
    text = str(err.value)
    assert "cannot open the SQLite database" in text and repr(str(path)) in text, text
    assert "locked by another connection or process" in text and "waiting 30 s" in text, text
    assert "readable" not in text, text
    db = await connect(f"sqlite:///{path}")
    await db.close()


async def recorded(db: Database, stream: str) -> int | None:
    row = await db.fetchone("SELECT stream_id FROM stream_positions WHERE stream_name = ?", (stream,))
    return None if row is None else int(row[0])


async def until_recorded(db: Database, stream: str, pos: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (now := await recorded(db, stream)) != pos:
        assert time.monotonic() < deadline, f"stream_positions stayed at {now}, the writer is at {pos}"
        await asyncio.sleep(0.05)


async def test_position_recording_waits_out_a_lock_without_a_traceback_and_catches_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It logged 'could not record the position in stream_positions' with a traceback per attempt and
    stopped trying: stream_positions stayed behind after the lock was released."""
    path = tmp_path / "ids.db"
    db = await open_db(path)
    gen = await create_id_generator(db, stream_name="s", instance_name="master", tables=[("t", None, "x")])
    try:
        async with gen.get_next() as first:  # records the id block: the next ids need no write
            assert first == 2
        await until_recorded(db, "s", 2)
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        with caplog.at_level(logging.INFO, logger="factstream"):
            with held(path):
                for expected in (3, 4, 5):
                    async with gen.get_next() as sid:
                        assert sid == expected
                assert gen.current_token() == 5  # ids complete while the file is locked
                await asyncio.sleep(1.0)  # several attempts to record it
                assert await recorded(db, "s") == 2
            await until_recorded(db, "s", 5)
        ours = [r for r in caplog.records if r.name.startswith("factstream")]
        assert not [r for r in ours if r.exc_info], "a traceback was logged for a locked file"
        down = [r for r in ours if "unavailable" in r.getMessage()]
        assert len(down) == 1, [r.getMessage() for r in ours]
        assert "locked by another connection or process" in down[0].getMessage() and str(path) in down[0].getMessage()
        assert [r for r in ours if "is back after" in r.getMessage()], [r.getMessage() for r in ours]
    finally:
        await gen.close()
        await db.close()


async def test_get_next_on_a_locked_file_is_refused_whole(tmp_path: Path) -> None:
    """A fresh writer must record its id block before handing out an id: the driver's bare error escaped."""
    path = tmp_path / "ids.db"
    db = await open_db(path)
    gen = await create_id_generator(db, stream_name="s", instance_name="master", tables=[("t", None, "x")])
    try:
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        with held(path):
            with pytest.raises(DatabaseUnavailable) as err:
                async with gen.get_next():
                    pytest.fail("an id was handed out without its block recorded")
            assert_says_locked(err.value, path)
            assert gen.current_token() == 1
        async with gen.get_next() as sid:
            assert sid == 2  # the refused id was not used up
        assert gen.current_token() == 2
        row = await db.fetchone("SELECT reserved_upto FROM stream_id_blocks WHERE stream_name = 's'")
        assert row is not None and row[0] >= 2
    finally:
        await gen.close()
        await db.close()


async def test_close_on_a_locked_file_stops_and_a_restart_reuses_no_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """close() raised the driver's error from giving back the ids recorded ahead of use."""
    path = tmp_path / "ids.db"
    db = await open_db(path)
    gen = await create_id_generator(db, stream_name="s", instance_name="master", tables=[("t", None, "x")])
    try:
        async with gen.get_next() as sid:
            assert sid == 2
        await until_recorded(db, "s", 2)
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        with held(path), caplog.at_level(logging.WARNING, logger="factstream"):
            async with gen.get_next() as sid:
                assert sid == 3
            await gen.close()
        assert "could not give back the ids recorded ahead of use" in caplog.text, caplog.text
        assert not [r for r in caplog.records if r.exc_info]
        again = await create_id_generator(db, stream_name="s", instance_name="master", tables=[("t", None, "x")])
        try:
            async with again.get_next() as sid:
                assert sid > 3  # after the block still recorded: id 3 (recorded nowhere else) is not reused
        finally:
            await again.close()
    finally:
        await gen.close()
        await db.close()



async def test_a_block_record_lost_with_a_rollback_and_not_written_again_is_written_before_the_next_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolled-back transaction takes the id block's record with it; the generator writes it again in
    the background. When that fails too (here: the file locked by another process), the generator went on
    believing the block recorded: the ids it handed out next were durable nowhere, so a restart after a
    crash could hand them out again (and the task's error surfaced as 'Task exception was never retrieved')."""
    path = tmp_path / "ids.db"
    db = await open_db(path)
    gen = await create_id_generator(db, stream_name="s", instance_name="master", tables=[("t", None, "x")])
    try:
        await db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        with pytest.raises(RuntimeError):
            async with db.transaction() as txn:
                await gen.get_next_txn(txn)  # the fresh writer's first id: its block is recorded through txn
                raise RuntimeError("rolled back, and the block's record with it")
        with caplog.at_level(logging.WARNING, "factstream"), held(path):  # the rewrite runs while it is held
            await asyncio.sleep(BUSY_MS / 1000 * 3 + 0.2)
        assert any("could not record the id block again" in r.getMessage() for r in caplog.records), caplog.text
        async with gen.get_next() as sid:
            pass
        row = await db.fetchone("SELECT reserved_upto FROM stream_id_blocks WHERE stream_name = 's'")
        assert row is not None and row[0] >= sid, (row, sid)  # the id handed out is recorded as used
    finally:
        await gen.close()
        await db.close()
