"""One process per writer name and database (store.writer_claim), on both engines and through serve."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from cli_run import cli, serve, stop
from factstream.store.database import DatabaseError, connect
from factstream.store.writer_claim import WriterTaken, claim_writer


async def test_a_name_is_claimed_once_until_released(engine_db: Any) -> None:
    """A second claim (here another connection or open file, as another process would hold) is refused;
    another name is not; a released name can be claimed again."""
    other = await connect(engine_db.url)
    try:
        first = await claim_writer(engine_db, "master")
        with pytest.raises(WriterTaken, match="another process is already writing as 'master'"):
            await claim_writer(other, "master")
        second_name = await claim_writer(other, "event_persister1")
        await first.release()
        again = await claim_writer(other, "master")
        await again.release()
        await second_name.release()
    finally:
        await other.close()


async def _other_sessions(db: Any, within: float = 10.0) -> int:
    """Sessions still open on ``db``'s PostgreSQL database besides the one asking, once they had ``within``
    seconds to end: a closed connection's session ends when its server process gets to it, after close()
    returns (still listed in 16 of 600 runs on a busy machine, 3 of 300 on an idle one)."""
    import psycopg

    deadline = time.monotonic() + within
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        while True:
            cur = await conn.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            row = await cur.fetchone()
            assert row is not None
            if row[0] == 0 or time.monotonic() > deadline:
                return int(row[0])
            await asyncio.sleep(0.02)


async def test_closing_the_database_releases_its_claims(engine_db: Any) -> None:
    """An unreleased claim outlived db.close(): on PostgreSQL its connection stayed open (a ResourceWarning at
    exit) and the name stayed taken until the process ended. Closing the database now releases it."""
    other = await connect(engine_db.url)
    try:
        claim = await claim_writer(engine_db, "master")
        await engine_db.close()
        again = await claim_writer(other, "master")  # free: the closed database's claim went with it
        await again.release()
        await claim.release()  # still fine, and a no-op
    finally:
        await other.close()
    if engine_db.engine == "postgres":
        assert await _other_sessions(engine_db) == 0  # nothing left open behind the closed database


@pytest.mark.postgres
@pytest.mark.parametrize("ending", ["release", "close"])
async def test_the_name_is_free_when_release_or_close_returns(postgres_dsn: str, ending: str) -> None:
    """Closing a connection only asks PostgreSQL to end the session; its lock went when the server got to it,
    so a claim made just after release() or db.close() was refused now and then (1 run in 600 with the CPU
    busy). Here the claim's session outlives its close() until the end: the name must be free anyway."""
    db = await connect(postgres_dsn)
    other = await connect(postgres_dsn)
    claim = await claim_writer(db, "master")
    session = claim._conn  # noqa: SLF001
    end_session = session.close

    async def server_not_there_yet() -> None:
        """close() as seen by the next claimer while the server has not ended the session."""

    session.close = server_not_there_yet
    try:
        await (claim.release() if ending == "release" else db.close())
        again = await claim_writer(other, "master")  # WriterTaken when the name went only with the session
        await again.release()
    finally:
        await end_session()
        await db.close()
        await other.close()


@pytest.mark.postgres
@pytest.mark.parametrize("names", [["silent_server"], ["silent_a", "silent_b", "silent_c"]], ids=["one", "three"])
async def test_closing_on_a_server_that_went_silent_is_quick_and_quiet(
    postgres_dsn: str, caplog: Any, names: list[str]
) -> None:
    """The unlock before the close gets UNLOCK_TIMEOUT, then the socket is cut: psycopg's own cancel of it
    waited 5 s more for the cancel request and 5 s for the query, warning twice (close took 15 s). Several
    claims are released together: one after another, three took 25 s."""
    from freezing_proxy import FreezingProxy

    from factstream.store.writer_claim import UNLOCK_TIMEOUT

    proxy = FreezingProxy(armed=False)
    try:
        db = await connect(proxy.url(postgres_dsn))
        for name in names:
            await claim_writer(db, name)
        proxy.arm()  # the server answers nothing from now on, cancel requests included
        started = time.monotonic()
        await db.close()
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert took < UNLOCK_TIMEOUT + 2, f"db.close() took {took:.1f} s on a silent server with {len(names)} claim(s)"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []


async def test_a_closed_database_cannot_claim(engine_db: Any) -> None:
    """A claim on a closed database used to succeed; on PostgreSQL it opened a connection nothing closed."""
    await engine_db.close()
    with pytest.raises(DatabaseError, match="is closed; connect"):
        await claim_writer(engine_db, "master")
    if engine_db.engine == "postgres":
        assert await _other_sessions(engine_db) == 0


async def test_bad_names_and_arguments_are_refused_clearly(engine_db: Any) -> None:
    """A name is part of the SQLite lock file's name: '/' gave a raw FileNotFoundError and '../..' put the lock
    elsewhere. The same names are refused on both engines; a URL instead of a database is a TypeError."""
    for name in ("a/b", "../../evil", "..", "a\\b", "x\ny", "nul\0"):
        with pytest.raises(ValueError, match="cannot name a writer"):
            await claim_writer(engine_db, name)
    with pytest.raises(ValueError, match="instance_name must not be empty"):
        await claim_writer(engine_db, "")
    for name in (None, 5, b"master"):
        with pytest.raises(TypeError, match="instance_name must be a str"):
            await claim_writer(engine_db, name)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes the Database from connect\(\), not a str"):
        await claim_writer(engine_db.url, "master")  # type: ignore[arg-type]
    claim = await claim_writer(engine_db, "event_persister-1.a")  # an ordinary name is fine
    await claim.release()


def test_a_killed_writer_leaves_its_name_free(tmp_path: Any) -> None:
    """The claim goes with the process, however it ends: SIGKILL leaves nothing to clean up."""
    db_url = f"sqlite:///{tmp_path}/w.db"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys\n"
        "from factstream.store.database import connect\n"
        "from factstream.store.writer_claim import claim_writer\n"
        "async def main():\n"
        f"    db = await connect({db_url!r})\n"
        "    await claim_writer(db, 'master')\n"
        "    print('claimed', flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        out = cli("serve", "--db", db_url, "--port", "0")
        assert out.returncode == 1 and "another process is already writing as 'master'" in out.stderr, out.stderr
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        proc, _ = serve(db_url)  # starts: the name is free again
        stop(proc)
    finally:
        if holder.poll() is None:
            holder.kill()
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_serve_refuses_a_second_writer_of_the_same_name(tmp_path: Any, engine: str, request: Any) -> None:
    """Two `serve --produce` as master on one database used to run side by side, sharing id blocks and
    position rows. The second now exits 1 with one line saying what to do; another name is fine."""
    db_url = f"sqlite:///{tmp_path}/w.db" if engine == "sqlite" else request.getfixturevalue("postgres_dsn")
    first, _ = serve(db_url, "--produce", "--rate", "100")
    try:
        time.sleep(0.5)
        out = cli("serve", "--db", db_url, "--port", "0", "--produce", timeout=60)
        assert out.returncode == 1, out
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("factstream serve: another process is already writing as "
                                                       "'master' to "), out.stderr
        assert "another --instance-name" in lines[0]
        other, _ = serve(db_url, "--instance-name", "w2")
        stop(other)
    finally:
        stop(first)


async def test_a_release_cancelled_during_close_is_reported_and_the_close_completes(
    engine_db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A release that was cancelled (by another task, not by the close) was passed over in silence: gather's
    return_exceptions hands back a CancelledError, which is no Exception. Now a warning names it; the
    database still closes and the other claims are still released."""
    other = await connect(engine_db.url)
    try:
        claim = await claim_writer(engine_db, "master")
        gate = asyncio.Event()

        async def held_release() -> None:
            await gate.wait()  # a release stuck behind something another task then cancels

        waiter = asyncio.ensure_future(held_release())
        engine_db._on_close[id(waiter)] = lambda: waiter  # noqa: SLF001 - the hook a claim registers itself on
        asyncio.get_running_loop().call_later(0.05, waiter.cancel)
        with caplog.at_level("WARNING", logger="factstream.store.database"):
            await engine_db.close()
        assert "while closing the database was cancelled" in caplog.text, caplog.text
        again = await claim_writer(other, "master")  # the real claim was released all the same
        await again.release()
        await claim.release()
    finally:
        await other.close()
