"""``--db-timeout``: positions, synapse check and tail --db give up on a database that does not answer.

Two ways a PostgreSQL database stops answering, both real: a table locked by
another session (Synapse's schema migrations take ACCESS EXCLUSIVE locks) and
a server that goes silent after the connect (a frozen host: here a proxy that
forwards the connect, then forwards nothing more and answers no new
connection, cancel requests included). Each command names the database after
--db-timeout with one line on stderr and ends about a second later; a query
behind a lock is cancelled and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, cli, no_traceback
from freezing_proxy import FreezingProxy
from synapse_fixtures import SynapseDb, synapse_db, synapse_template  # noqa: F401

pytestmark = pytest.mark.postgres

MESSAGE = "did not answer within {after:g} s (a table locked by a migration? a server that stopped answering?); " \
          "--db-timeout SECONDS to wait longer"


@pytest.fixture
def silent_proxy() -> Iterator[FreezingProxy]:
    proxy = FreezingProxy()
    try:
        yield proxy
    finally:
        proxy.close()


@contextlib.contextmanager
def locked(dsn: str, table: str) -> Iterator[None]:
    """``table`` held in ACCESS EXCLUSIVE mode by another session, as a migration holds it."""
    import psycopg

    migration = psycopg.connect(dsn)
    try:
        migration.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        migration.rollback()
        migration.close()


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``factstream ARGS``: (the process, seconds it took, interpreter start included)."""
    began = time.monotonic()
    out = subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=90, env=ENV)
    return out, time.monotonic() - began


def gave_up(out: subprocess.CompletedProcess[str], prog: str, url: str, after: float, status: int) -> None:
    """One line on stderr, naming the database (as positions names it) and the option; the exit status."""
    from factstream.redaction import redact_url

    line = f"{prog}: {redact_url(url)} {MESSAGE.format(after=after)}\n"
    assert out.returncode == status and out.stderr == line and no_traceback(out.stderr), (out.returncode, out.stderr)


@pytest.mark.slow
def test_synapse_check_gives_up_behind_a_locked_table(synapse_db: SynapseDb) -> None:
    """Before: with stream_positions locked by a migration, check waited as long as the lock was held (for ever
    here). Now it names the database after --db-timeout, exit 2 (could not check: 1 would say inconsistencies),
    and the query it cancelled leaves nothing behind."""
    with locked(synapse_db.dsn, "stream_positions"):
        out, took = timed("synapse", "check", "--db", synapse_db.dsn, "--db-timeout", "2")
        as_json, _ = timed("synapse", "check", "--db", synapse_db.dsn, "--db-timeout", "1", "--json")
    gave_up(out, "factstream synapse check", synapse_db.dsn, 2, 2)
    assert out.stdout == "" and took < 6, took
    assert as_json.returncode == 2 and '"healthy": null' in as_json.stdout and "did not answer within 1 s" in \
        as_json.stdout, as_json.stdout + as_json.stderr
    again = cli("synapse", "check", "--db", synapse_db.dsn, "--db-timeout", "30")
    assert again.returncode == 0 and "healthy" in again.stdout, again.stdout + again.stderr


def test_tail_db_gives_up_behind_a_locked_table(postgres_dsn: str) -> None:
    """Before: tail --db read the writer's positions at start and, behind a lock, never started, silently."""
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE stream_positions (stream_name TEXT, instance_name TEXT, stream_id BIGINT)")
    with locked(postgres_dsn, "stream_positions"):
        out, took = timed("tail", "127.0.0.1:1", "--db", postgres_dsn, "--db-timeout", "2")
    gave_up(out, "factstream tail", postgres_dsn, 2, 1)
    assert out.stdout == "" and took < 6, took
    refused = cli("tail", "127.0.0.1:1", "--db-timeout", "2")
    assert refused.returncode == 2 and "--db-timeout applies to --db" in refused.stderr, refused.stderr


async def test_each_query_of_a_following_tail_gives_up_and_the_database_stays_usable(postgres_dsn: str) -> None:
    """tail --db runs until stopped, so the deadline is per query: its follower reads the stream tables through
    QueriesWithin. A read behind a lock is cancelled after --db-timeout (the follower then warns and asks again)."""
    from factstream.store.deadline import NoAnswer, QueriesWithin
    from factstream.demo.tables import DEMO_TABLES
    from factstream.replication.tables import create_tables
    from factstream.store.database import connect

    db = await connect(postgres_dsn)
    try:
        await create_tables(db, DEMO_TABLES)
        caches = next(t for t in DEMO_TABLES if t.stream == "caches")
        source = caches.source(QueriesWithin(db, 1.0, postgres_dsn))
        with locked(postgres_dsn, caches.table):
            began = time.monotonic()
            with pytest.raises(NoAnswer, match="did not answer within 1 s"):
                await source.get_updates("master", 0, 10, 100)
            assert time.monotonic() - began < 4
        assert await source.get_updates("master", 0, 10, 100) == ([], 10, False)
    finally:
        await db.close()


COMMANDS: dict[str, tuple[list[str], str, int]] = {
    "positions": (["positions", "--db"], "factstream positions", 1),
    "synapse check": (["synapse", "check", "--db"], "factstream synapse check", 2),
    "tail": (["tail", "127.0.0.1:1", "--db"], "factstream tail", 1),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_server_gone_silent_is_given_up_on_soon_and_quietly(command: str, postgres_dsn: str,
                                                              silent_proxy: FreezingProxy) -> None:
    """The server accepted the connect, then answers nothing, a cancel request neither. Before (positions):
    cancelling the read left the cleaning up to psycopg, which gives a cancel request 5 s and the query 5 s
    more, warning each time: the give-up came 3 s late (CANCEL_GRACE) with psycopg's warning on stderr. Now:
    a second to answer the cancel, then the connection is cut; one line, ours."""
    args, prog, status = COMMANDS[command]
    url = silent_proxy.url(postgres_dsn)
    out, took = timed(*args, url, "--db-timeout", "3")
    assert silent_proxy.frozen.is_set()  # it connected, and its first query went unanswered
    gave_up(out, prog, url, 3, status)
    assert took < 3 + 3, f"gave up {took - 3:.1f} s after --db-timeout"


def test_a_locked_sqlite_file_ends_the_command_by_the_deadline(tmp_path: Any) -> None:
    """SQLite's busy wait cannot be interrupted: it is bounded by --db-timeout (it held the exit for its 30 s)."""
    import sqlite3

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE stream_positions (stream_name TEXT, instance_name TEXT, stream_id BIGINT)")
    holder.execute("INSERT INTO stream_positions VALUES ('events', 'master', 5)")
    holder.execute("BEGIN EXCLUSIVE")  # another process's write transaction, kept open
    try:
        url = f"sqlite:///{path}"
        for args in (("positions", "--db", url), ("tail", "127.0.0.1:1", "--db", url)):
            started = time.monotonic()
            done = cli(*args, "--db-timeout", "2", timeout=60)
            took = time.monotonic() - started
            assert done.returncode == 1 and no_traceback(done.stderr), done.stderr
            assert done.stderr.strip().endswith(MESSAGE.format(after=2)), done.stderr
            assert took < 8, f"{args[0]} ended {took:.1f} s after its start, --db-timeout 2"
    finally:
        holder.close()
