"""factstream.store.database on both engines: the four verbs, transactions, hooks, isolation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typing import Any

import pytest

from factstream.store import database
from factstream.store.database import Database, DatabaseError, connect, to_pyformat


#: writers and readers run on uvloop in production: every test here runs on both loops
BOTH_EVENT_LOOPS = True


@pytest.fixture
def db(engine_db: Any) -> Any:
    """An empty database of each engine (conftest's engine_db)."""
    return engine_db


def test_to_pyformat_rewrites_placeholders_and_escapes_percent() -> None:
    assert to_pyformat("SELECT ? , '?%' , x % 2 FROM t WHERE a = ?") == (
        "SELECT %s , '?%%' , x %% 2 FROM t WHERE a = %s"
    )


async def test_four_verbs(db: Database) -> None:
    assert db.engine in ("sqlite", "postgres")
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT)")
    assert await db.execute("INSERT INTO t VALUES (?, ?)", (1, "a")) == 1
    await db.executemany("INSERT INTO t VALUES (?, ?)", [(2, "b"), (3, "c%")])
    assert await db.fetchall("SELECT id, name FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c%")]
    assert await db.fetchone("SELECT name FROM t WHERE id = ?", (3,)) == ("c%",)
    assert await db.fetchone("SELECT name FROM t WHERE id = ?", (9,)) is None
    assert await db.fetchone("SELECT COUNT(*) FROM t WHERE name LIKE '%b'") == (1,)


async def test_transaction_commit_and_rollback_with_hooks(db: Database) -> None:
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    seen: list[str] = []
    async with db.transaction() as txn:
        await txn.execute("INSERT INTO t VALUES (?)", (1,))
        txn.call_after_commit(seen.append, "commit1")
        txn.call_after_rollback(seen.append, "rollback1")
        assert seen == []
    assert seen == ["commit1"]

    async def async_hook() -> None:
        seen.append("async-rollback")

    with pytest.raises(RuntimeError, match="boom"):
        async with db.transaction() as txn:
            await txn.execute("INSERT INTO t VALUES (?)", (2,))
            assert await txn.fetchone("SELECT COUNT(*) FROM t") == (2,)
            txn.call_after_commit(seen.append, "commit2")
            txn.call_after_rollback(seen.append, "rollback2")
            txn.call_after_rollback(async_hook)
            raise RuntimeError("boom")
    assert seen == ["commit1", "rollback2", "async-rollback"]
    assert await db.fetchall("SELECT id FROM t") == [(1,)]


async def test_failed_commit_runs_rollback_hooks(db: Database) -> None:
    """A statement error inside the block rolls back and reports the driver's error."""
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    await db.execute("INSERT INTO t VALUES (1)")
    seen: list[str] = []
    with pytest.raises(Exception):
        async with db.transaction() as txn:
            txn.call_after_rollback(seen.append, "rb")
            await txn.execute("INSERT INTO t VALUES (?)", (1,))
    assert seen == ["rb"]
    # the connection is usable afterwards
    assert await db.fetchone("SELECT COUNT(*) FROM t") == (1,)


async def test_db_calls_inside_transaction_join_it(db: Database) -> None:
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    with pytest.raises(KeyError):
        async with db.transaction():
            await db.execute("INSERT INTO t VALUES (?)", (1,))
            async with db.transaction() as inner:  # nested joins the outer
                await inner.execute("INSERT INTO t VALUES (?)", (2,))
            assert await db.fetchone("SELECT COUNT(*) FROM t") == (2,)
            raise KeyError("undo")
    assert await db.fetchone("SELECT COUNT(*) FROM t") == (0,)


async def test_transactions_of_different_tasks_do_not_interleave(db: Database) -> None:
    """Read-modify-write of a counter from many tasks loses no update."""
    await db.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, v BIGINT)")
    await db.execute("INSERT INTO c VALUES (1, 0)")

    async def bump() -> None:
        for _ in range(10):
            async with db.transaction() as txn:
                lock = " FOR UPDATE" if db.engine == "postgres" else ""
                row = await txn.fetchone("SELECT v FROM c WHERE k = 1" + lock)
                assert row is not None
                await asyncio.sleep(0)
                await txn.execute("UPDATE c SET v = ? WHERE k = 1", (row[0] + 1,))

    await asyncio.gather(*(bump() for _ in range(8)))
    assert await db.fetchone("SELECT v FROM c WHERE k = 1") == (80,)


async def test_sqlite_memory_and_wal(tmp_path: Path) -> None:
    mem = await connect("sqlite:///:memory:")
    try:
        assert mem.engine == "sqlite"
        assert await mem.fetchone("SELECT 1 + 1") == (2,)
    finally:
        await mem.close()
    filedb = await connect(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        assert await filedb.fetchone("PRAGMA journal_mode") == ("wal",)
    finally:
        await filedb.close()
    assert (tmp_path / "w.db").exists()


async def test_closed_database_says_so(tmp_path: Path) -> None:
    db = await connect(f"sqlite:///{tmp_path / 'c.db'}")
    await db.close()
    await db.close()  # idempotent
    with pytest.raises(DatabaseError, match="closed"):
        await db.fetchall("SELECT 1")


async def test_a_finished_transaction_refuses_every_verb(db: Database) -> None:
    """A transaction kept past its block used to run statements outside any transaction (on PostgreSQL on a
    connection back in the pool) and take hooks that never ran; now every verb says it is finished."""
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    async with db.transaction() as committed:
        await committed.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(RuntimeError):
        async with db.transaction() as rolled_back:
            raise RuntimeError("boom")
    seen: list[str] = []
    for txn in (committed, rolled_back):
        assert not txn.open
        for verb in (
            lambda: txn.execute("INSERT INTO t VALUES (2)"),
            lambda: txn.executemany("INSERT INTO t VALUES (?)", [(3,)]),
            lambda: txn.execute_batch([("INSERT INTO t VALUES (4)", None)]),
            lambda: txn.execute_batch([]),
            lambda: txn.fetchall("SELECT id FROM t"),
            lambda: txn.fetchone("SELECT id FROM t"),
        ):
            with pytest.raises(DatabaseError, match="transaction already finished"):
                await verb()
        with pytest.raises(DatabaseError, match="transaction already finished"):
            txn.call_after_commit(seen.append, "commit")
        with pytest.raises(DatabaseError, match="transaction already finished"):
            txn.call_after_rollback(seen.append, "rollback")
    assert await db.fetchall("SELECT id FROM t") == [(1,)]
    assert seen == []
    async with db.transaction() as txn:  # the database is fine
        await txn.execute("INSERT INTO t VALUES (5)")
    assert await db.fetchall("SELECT id FROM t ORDER BY id") == [(1,), (5,)]


async def test_closed_tells_whether_the_database_was_closed(db: Database) -> None:
    assert not db.closed
    await db.close()
    assert db.closed
    with pytest.raises(DatabaseError, match="is closed; connect"):
        await db.fetchall("SELECT 1")


async def test_bad_urls() -> None:
    with pytest.raises(DatabaseError, match="unsupported database URL"):
        await connect("mysql://x")
    with pytest.raises(DatabaseError, match="no file"):
        await connect("sqlite://")


@pytest.mark.postgres
async def test_postgres_unreachable_server_is_reported(postgres_dsn: str) -> None:
    with pytest.raises(DatabaseError, match="cannot connect"):
        await connect("postgresql://postgres@127.0.0.1:1/nope")


@pytest.mark.postgres
async def test_postgres_pool_is_bounded(postgres_dsn: str) -> None:
    db = await database.connect(postgres_dsn, max_connections=2)
    try:
        results = await asyncio.gather(*(db.fetchone("SELECT pg_sleep(0.01), ?::int", (i,)) for i in range(10)))
        assert [r[1] for r in results if r] == list(range(10))
        assert len(db._all) <= 2  # type: ignore[attr-defined]
    finally:
        await db.close()


async def test_sqlite_missing_folder_is_explained(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="its folder '.*/no/such' does not exist"):
        await connect(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")


async def test_sqlite_directory_and_non_database_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="is a directory, not a SQLite database file; name a file, e.g. sqlite:///"):
        await connect(f"sqlite:///{tmp_path}")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatabaseError, match="'.*notes.txt' is not a SQLite database"):
        await connect(f"sqlite:///{tmp_path / 'notes.txt'}")
    assert (tmp_path / "notes.txt").read_text() == "hello"


@pytest.mark.parametrize(("url", "words"), [
    ("t.db", "'t.db' is a file path, not a database URL; write sqlite:///t.db"),
    ("/abs/t.db", "write sqlite:////abs/t.db"),
    ("sqlite://t.db", "'sqlite://t.db' names no file (the path follows a third slash); write sqlite:///t.db"),
    ("host=h dbname=d password=pw1", "key=value connection string; write it as a URL"),
    ("postgresql://u:pw1@[::1/x", "bad host or port in postgresql://u:***@[::1/x: '[::1' opens '['"),
    ("postgresql://u:pw1@h1:5432,[::1/x", "'[::1' opens '[' without its closing"),
    ("postgres://u:pw1@fe80::1/x", "'fe80::1' looks like an IPv6 address without its brackets"),
    ("postgresql://u:pw1@[db]/x", "brackets hold an IPv6 address, got 'db'"),
    ("postgresql://u:pw1@h:99999/x", "the port in 'h:99999' must be a number 0-65535"),
])
def test_urls_that_name_no_database_say_how_to_write_them(url: str, words: str) -> None:
    with pytest.raises(database.DatabaseURLError) as caught:
        database.check_url(url)
    assert words in str(caught.value) and "pw1" not in str(caught.value)


def test_well_formed_urls_pass_the_check() -> None:
    for url, engine in (("sqlite:///t.db", "sqlite"), ("sqlite:////abs/t.db", "sqlite"), ("sqlite:///:memory:", "sqlite"),
                        ("postgresql://u:p@[::1]:5432/d", "postgres"), ("postgresql://h1:5432,[::1]:5433/d", "postgres"),
                        ("postgresql:///d?host=/var/run/postgresql", "postgres"), ("postgres://u@h/d", "postgres")):
        assert database.check_url(url) == engine, url
    assert database.sqlite_path("sqlite:////abs/t.db") == "/abs/t.db"


async def test_postgres_that_never_answers_is_given_up_on_within_connect_timeout() -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered: another service's port, a firewall

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        began = asyncio.get_running_loop().time()
        with pytest.raises(database.DatabaseUnavailable, match="no PostgreSQL answered at postgresql://u:\\*\\*\\*@"
                           f"127.0.0.1:{port}/x within 2 s: is that PostgreSQL's port"):
            await connect(f"postgresql://u:pw1@127.0.0.1:{port}/x", connect_timeout=2)
        assert asyncio.get_running_loop().time() - began < 5
        with pytest.raises(database.DatabaseUnavailable, match="within 3 s"):  # the URL's own setting wins
            await connect(f"postgresql://u@127.0.0.1:{port}/x?connect_timeout=3", connect_timeout=2)
        connecting = asyncio.ensure_future(connect(f"postgresql://u@127.0.0.1:{port}/x"))
        await asyncio.sleep(0.5)
        connecting.cancel()  # Ctrl-C: the connect in progress ends at once
        began = asyncio.get_running_loop().time()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        assert asyncio.get_running_loop().time() - began < 1
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


async def test_connect_timeout_must_be_a_duration() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="connect_timeout"):
            await connect("postgresql://u@127.0.0.1:1/x", connect_timeout=bad)


async def test_execute_batch_runs_every_step_in_order_inside_the_transaction(db: Database) -> None:
    """Savepoints, inserts and rollbacks to a savepoint, sent together: each unit stays atomic."""
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT)")
    seen: list[str] = []
    async with db.transaction() as txn:
        txn.call_after_commit(seen.append, "commit")
        await txn.execute_batch([
            ("SAVEPOINT unit", None),
            ("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, "b%")]),
            ("RELEASE SAVEPOINT unit", None),
            ("SAVEPOINT unit", None),
            ("INSERT INTO t VALUES (?, ?)", [(3, "gone")]),
            ("ROLLBACK TO SAVEPOINT unit", None),
            ("RELEASE SAVEPOINT unit", None),
            ("INSERT INTO t VALUES (?, ?)", [(4, "d")]),
        ])
        assert await txn.fetchall("SELECT id FROM t ORDER BY id") == [(1,), (2,), (4,)]
    assert seen == ["commit"]
    assert await db.fetchall("SELECT id, name FROM t ORDER BY id") == [(1, "a"), (2, "b%"), (4, "d")]
    # The same statement many times in one batch (psycopg would prepare it server-side mid-pipeline).
    async with db.transaction() as txn:
        await txn.execute_batch([("INSERT INTO t VALUES (?, ?)", [(i, "x")]) for i in range(10, 30)])
    assert await db.fetchone("SELECT COUNT(*) FROM t WHERE name = 'x'") == (20,)


async def test_execute_batch_failure_rolls_the_transaction_back(db: Database) -> None:
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    await db.execute("INSERT INTO t VALUES (?)", (1,))
    seen: list[str] = []
    with pytest.raises(Exception) as caught:
        async with db.transaction() as txn:
            txn.call_after_rollback(seen.append, "rollback")
            await txn.execute_batch([("INSERT INTO t VALUES (?)", [(2,)]), ("INSERT INTO t VALUES (?)", [(1,)])])
    assert "unique" in str(caught.value).lower() or "duplicate" in str(caught.value).lower()
    assert seen == ["rollback"]
    assert await db.fetchall("SELECT id FROM t") == [(1,)]
    await db.execute("INSERT INTO t VALUES (?)", (3,))  # the connection is usable again
    assert await db.fetchall("SELECT id FROM t ORDER BY id") == [(1,), (3,)]


async def test_run_transaction_commits_in_one_trip_or_rolls_back_whole(db: Database) -> None:
    await db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    await db.run_transaction([("INSERT INTO t VALUES (?)", [(1,), (2,)]), ("DELETE FROM t WHERE id = ?", [(1,)])])
    assert await db.fetchall("SELECT id FROM t") == [(2,)]
    with pytest.raises(Exception):
        await db.run_transaction([("INSERT INTO t VALUES (?)", [(3,)]), ("INSERT INTO t VALUES (?)", [(2,)])])
    assert await db.fetchall("SELECT id FROM t") == [(2,)]  # 3 was rolled back with the failing step
    await db.run_transaction([("INSERT INTO t VALUES (?)", [(4,)])])  # and the database is usable again
    async with db.transaction():
        await db.run_transaction([("INSERT INTO t VALUES (?)", [(5,)])])  # joins the task's transaction
    assert await db.fetchall("SELECT id FROM t ORDER BY id") == [(2,), (4,), (5,)]
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await db.run_transaction([("INSERT INTO t VALUES (?)", [(6,)])])
            raise RuntimeError("the outer transaction rolls back, the joined steps with it")
    assert await db.fetchall("SELECT id FROM t ORDER BY id") == [(2,), (4,), (5,)]


async def test_self_contained_jobs_run_in_the_order_started_around_an_open_transaction(db: Database) -> None:
    """run_transaction / execute hold the connection only to queue their job: the next one starts as soon as the
    one before ends, in the order they were started, never inside another task's open transaction."""
    await db.execute("CREATE TABLE o (n BIGINT, who TEXT)")
    inside = asyncio.Event()
    release = asyncio.Event()

    async def open_transaction() -> None:
        async with db.transaction() as txn:
            await txn.execute("INSERT INTO o VALUES (?, 'txn')", (0,))
            inside.set()
            await release.wait()
            await txn.execute("INSERT INTO o VALUES (?, 'txn')", (1,))

    holder = asyncio.create_task(open_transaction())
    await inside.wait()
    queued = [asyncio.create_task(db.run_transaction([("INSERT INTO o VALUES (?, 'job')", [(2 + i,)])]))
              for i in range(5)]
    queued.append(asyncio.create_task(db.execute("INSERT INTO o VALUES (?, 'job')", (7,))))
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(holder, *queued)
    rows = await db.fetchall("SELECT n, who FROM o ORDER BY n")
    assert rows == [(0, "txn"), (1, "txn"), *[(n, "job") for n in range(2, 8)]]
    if db.engine == "sqlite":
        # one database thread: the jobs ran after the transaction, in the order started
        order = await db.fetchall("SELECT n FROM o ORDER BY rowid")
        assert [n for (n,) in order] == list(range(8))


@pytest.mark.postgres
async def test_postgres_statement_timeout_in_a_pipeline_is_the_statement_s_error_not_an_outage(postgres_dsn: str) -> None:
    """A statement the server cancels (statement_timeout, SQLSTATE 57014) in psycopg's pipeline leaves the
    connection usable: the caller gets the server's error, not DatabaseUnavailable and a closed connection."""
    import psycopg

    db = await database.connect(postgres_dsn, max_connections=1)
    try:
        await db.execute("CREATE TABLE t (id BIGINT)")
        slow = "INSERT INTO t SELECT ? FROM pg_sleep(0.2)"
        with pytest.raises(psycopg.errors.QueryCanceled):
            await db.run_transaction([("SET LOCAL statement_timeout = 20", None), (slow, [(1,), (2,)])])
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with db.transaction() as txn:
                await txn.execute("SET LOCAL statement_timeout = 20")
                await txn.executemany(slow, [(3,), (4,)])
        conn = db._all.copy().pop()  # type: ignore[attr-defined]  # noqa: SLF001 - the pool's one connection
        assert not conn.closed
        await db.run_transaction([("INSERT INTO t VALUES (?)", [(5,)])])
        assert await db.fetchall("SELECT id FROM t") == [(5,)]
        assert db._all == {conn}  # type: ignore[attr-defined]  # noqa: SLF001 - the same connection, reused
    finally:
        await db.close()


@pytest.mark.postgres
async def test_postgres_idle_connections_the_server_ended_are_not_handed_out(postgres_dsn: str) -> None:
    """Every backend terminated while the pool's connections sit idle: the next calls get fresh
    connections instead of failing with DatabaseUnavailable on the dead ones."""
    import psycopg

    db = await database.connect(postgres_dsn, max_connections=3)
    try:
        await asyncio.gather(*(db.fetchone("SELECT pg_sleep(0.05)") for _ in range(3)))  # three idle ones
        before = set(db._all)  # type: ignore[attr-defined]  # noqa: SLF001
        assert len(before) == 3
        name = postgres_dsn.rsplit("/", 1)[1]
        with psycopg.connect(postgres_dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            ).fetchall()
        assert killed == [(True,)] * 3
        await asyncio.sleep(0.1)  # the server's goodbye reaches the sockets
        assert await asyncio.gather(*(db.fetchone("SELECT ?::int", (i,)) for i in range(3))) == [(0,), (1,), (2,)]
        assert not before & set(db._all)  # type: ignore[attr-defined]  # noqa: SLF001 - all three replaced
    finally:
        await db.close()
