"""``flush_positions()`` says whether the position was recorded; ``close()`` stays safe during an outage.

Before: ``flush_positions()`` returned quietly when the database was
unavailable (it only logged), so a caller flushing before a planned shutdown
could not tell whether ``stream_positions`` held its position; ``close()``
during an outage waited for the database twice (the position, then giving
back the ids recorded ahead of use) and logged "retrying with backoff" for a
generator that was stopping. Now ``flush_positions()`` raises
``DatabaseUnavailable`` naming the stream and the position not recorded, and
``close()`` logs one warning (no traceback) after one wait.

The databases are made unavailable for real: a SQLite file locked by another
process (a short ``?busy_timeout=`` in the URL), and a PostgreSQL database
that refuses connections (``ALLOW_CONNECTIONS false``) with its backends
ended by ``pg_terminate_backend`` from another connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from factstream.ids import IdGenerator, create_id_generator
from factstream.store.database import Database, DatabaseUnavailable, connect
from sqlite_lock import held

TABLES = [("facts", "instance_name", "stream_id")]

#: The busy timeout of these tests (the URL's option), seconds.
BUSY = 0.6


async def recorded(db: Database, stream: str = "events") -> int | None:
    row = await db.fetchone("SELECT stream_id FROM stream_positions WHERE stream_name = ?", (stream,))
    return None if row is None else int(row[0])


async def sqlite_writer(tmp_path: Path) -> tuple[Database, IdGenerator, Path]:
    path = tmp_path / "ids.db"
    db = await connect(f"sqlite:///{path}?busy_timeout={BUSY}")
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    gen = await create_id_generator(db, stream_name="events", instance_name="master", tables=TABLES)
    gen.flush_interval = 3600.0  # no background recording: what is in stream_positions is the explicit flush's
    async with gen.get_next() as sid:  # records the id block: the next ids need no write
        assert sid == 2
    await gen.flush_positions()
    assert await recorded(db) == 2
    return db, gen, path


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("factstream")]


async def test_flush_positions_on_a_locked_sqlite_file_raises_and_records_once_released(tmp_path: Path) -> None:
    """It returned None with the position unrecorded: the caller could not tell."""
    db, gen, path = await sqlite_writer(tmp_path)
    try:
        with held(path):
            async with gen.get_next_mult(3):  # ids from the in-process counter: no write needed
                pass
            assert gen.current_token_for_writer("master") == 5
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as err:
                await gen.flush_positions()
            waited = time.monotonic() - started
            text = str(err.value)
            assert "stream 'events'" in text and "position 5 of 'master' was not recorded" in text, text
            assert str(path) in text and "locked by another connection or process" in text, text
            assert err.value.__cause__ is None and err.value.__suppress_context__
            assert BUSY * 0.9 <= waited < BUSY + 2.0, f"one attempt waits the busy timeout, took {waited:.2f}s"
            assert await recorded(db) == 2
        await gen.flush_positions()  # released: recorded, and said so by returning
        assert await recorded(db) == 5
        await gen.flush_positions()  # nothing new: returns at once
    finally:
        await gen.close()
        await db.close()


async def test_close_on_a_locked_sqlite_file_waits_once_and_logs_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """close() waited the busy timeout twice (the position, then the ids given back) and logged
    'retrying with backoff' at ERROR for a generator that was stopping."""
    db, gen, path = await sqlite_writer(tmp_path)
    try:
        with held(path), caplog.at_level(logging.INFO, logger="factstream"):
            async with gen.get_next() as sid:
                assert sid == 3
            started = time.monotonic()
            await gen.close()  # must not raise
            took = time.monotonic() - started
        assert took < BUSY * 1.7, f"close() waited {took:.2f}s for a locked file, busy timeout {BUSY}s"
        records = ours(caplog)
        assert not [r for r in records if r.exc_info], "a traceback was logged"
        assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
        (warning,) = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        assert "position 3 of 'master' was not recorded" in warning, warning
        assert "could not give back the ids recorded ahead of use" in warning, warning
        assert await recorded(db) == 2
        again = await create_id_generator(db, stream_name="events", instance_name="master", tables=TABLES)
        try:
            async with again.get_next() as sid:
                assert sid > 3  # the block still recorded: id 3 is not handed out again
        finally:
            await again.close()
    finally:
        await gen.close()
        await db.close()


async def test_flush_positions_on_a_reader_returns_at_once(tmp_path: Path) -> None:
    db, gen, path = await sqlite_writer(tmp_path)
    try:
        reader = await create_id_generator(db, stream_name="events", instance_name="reader", tables=TABLES)
        with held(path):
            started = time.monotonic()
            await reader.flush_positions()  # nothing of its own to record
            assert time.monotonic() - started < BUSY / 2
        await reader.close()
    finally:
        await gen.close()
        await db.close()


# ------------------------------------------------------------------ PostgreSQL


@contextmanager
def refusing(dsn: str) -> Iterator[None]:
    """The database of ``dsn`` refuses new connections and its sessions are ended, meanwhile (another connection)."""
    import psycopg

    admin = dsn.rsplit("/", 1)[0] + "/postgres"
    name = dsn.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        ended = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                             (name,)).fetchall()
        assert ended and all(ok for (ok,) in ended), ended
    try:
        yield
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


async def postgres_writer(dsn: str) -> tuple[Database, IdGenerator]:
    db = await connect(dsn)
    await db.execute("CREATE TABLE facts (stream_id BIGINT NOT NULL, instance_name TEXT, body TEXT)")
    gen = await create_id_generator(db, stream_name="events", instance_name="master", tables=TABLES)
    gen.flush_interval = 3600.0
    return db, gen


@pytest.mark.postgres
async def test_flush_positions_with_postgres_unavailable_raises_and_records_once_back(postgres_dsn: str) -> None:
    """It returned None with the position unrecorded."""
    db, gen = await postgres_writer(postgres_dsn)
    try:
        async with gen.get_next_mult(3) as ids:  # reserved from the sequence while it is up
            assert ids == [2, 3, 4]
        with refusing(postgres_dsn):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as err:
                await gen.flush_positions()
            assert time.monotonic() - started < 5.0
            text = str(err.value)
            assert "stream 'events'" in text and "position 4 of 'master' was not recorded" in text, text
            # the pooled connection found dead under the statement, or a new one refused
            assert "lost the connection" in text or "not currently accepting connections" in text, text
        await gen.flush_positions()
        assert await recorded(db) == 4
    finally:
        await gen.close()
        await db.close()


@pytest.mark.postgres
async def test_close_with_postgres_unavailable_logs_one_warning_and_stops(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    db, gen = await postgres_writer(postgres_dsn)
    try:
        async with gen.get_next():
            pass
        with refusing(postgres_dsn), caplog.at_level(logging.INFO, logger="factstream"):
            started = time.monotonic()
            await gen.close()  # must not raise
            assert time.monotonic() - started < 5.0
        records = ours(caplog)
        assert not [r for r in records if r.exc_info], "a traceback was logged"
        (warning,) = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
        assert "closing while the database is unavailable" in warning, warning
        assert "position 2 of 'master' was not recorded" in warning, warning
    finally:
        await gen.close()
        await db.close()
