"""``sqlite:///file.db?busy_timeout=SECONDS``: how long SQLite waits for a lock another process holds.

Before: the busy timeout was 30 s at connect (only ``PRAGMA busy_timeout``
after connecting changed it), and ``?busy_timeout=5`` was read as part of the
file name: ``connect("sqlite:///w.db?busy_timeout=5")`` opened (created) a
file named ``w.db?busy_timeout=5``, so a typo in any option was silently a
different database. Now the option sets the wait from the connect on, and an
option that does not exist, or a value that is not seconds, is a
``DatabaseURLError`` before anything is opened. The locks here are held by a
real second process.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from cli_run import ENV, FACTSTREAM
from factstream.store.database import DatabaseURLError, DatabaseUnavailable, check_url, connect, sqlite_path
from sqlite_lock import held


def journal_file(path: Path) -> None:
    """A database in rollback-journal mode: opening it switches it to WAL, which needs the write lock."""
    plain = sqlite3.connect(path)
    plain.execute("CREATE TABLE t (x INTEGER)")
    plain.commit()
    plain.close()


async def test_a_statement_gives_up_after_the_busy_timeout_of_the_url(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db = await connect(f"sqlite:///{path}?busy_timeout=1.5")
    try:
        assert db.path == str(path)  # type: ignore[attr-defined]
        assert await db.fetchall("PRAGMA busy_timeout") == [(1500,)]
        await db.execute("CREATE TABLE t (x INTEGER)")
        with held(path):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as err:
                await db.execute("INSERT INTO t VALUES (1)")
            waited = time.monotonic() - started
        assert 1.5 * 0.9 <= waited < 1.5 + 2.0, f"gave up after {waited:.2f}s, busy timeout 1.5 s"
        assert "waiting 1500 ms, the busy timeout" in str(err.value), err.value
        await db.execute("INSERT INTO t VALUES (1)")  # released
        assert await db.fetchall("SELECT x FROM t") == [(1,)]
    finally:
        await db.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("w.db-")) == ["w.db"]


async def test_connect_to_a_locked_file_gives_up_after_the_busy_timeout_of_the_url(tmp_path: Path) -> None:
    """The connect waited the fixed 30 s: no option shortened it (the option made another file instead)."""
    path = tmp_path / "journal.db"
    journal_file(path)
    with held(path):
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as err:
            await connect(f"sqlite:///{path}?busy_timeout=0.8")
        waited = time.monotonic() - started
    assert 0.8 * 0.9 <= waited < 0.8 + 2.0, f"gave up after {waited:.2f}s, busy timeout 0.8 s"
    text = str(err.value)
    assert "cannot open the SQLite database" in text and repr(str(path)) in text and "waiting 800 ms" in text, text
    db = await connect(f"sqlite:///{path}?busy_timeout=0.8")
    await db.close()


async def test_a_busy_timeout_of_0_gives_up_at_once(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db = await connect(f"sqlite:///{path}?busy_timeout=0")
    try:
        await db.execute("CREATE TABLE t (x INTEGER)")
        with held(path):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await db.execute("INSERT INTO t VALUES (1)")
            assert time.monotonic() - started < 0.5
    finally:
        await db.close()


async def test_the_default_stays_30_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # (before the option, ':memory:?busy_timeout=2' was a file made here)
    db = await connect(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        assert await db.fetchall("PRAGMA busy_timeout") == [(30000,)]
    finally:
        await db.close()
    db = await connect("sqlite:///:memory:?busy_timeout=2")
    try:
        assert db.path == ":memory:" and await db.fetchall("PRAGMA busy_timeout") == [(2000,)]  # type: ignore[attr-defined]
    finally:
        await db.close()


@pytest.mark.parametrize(
    "query, says",
    [
        ("busytimeout=5", "unknown option 'busytimeout'"),
        ("timeout=5", "unknown option 'timeout'"),
        ("busy_timeout=5&mode=ro", "unknown option 'mode'"),
        ("busy_timeout=abc", "busy_timeout in 'sqlite:///{path}?busy_timeout=abc' must be a number of seconds"),
        ("busy_timeout=-1", "must be a number of seconds from 0 to"),
        ("busy_timeout=nan", "must be a number of seconds"),
        ("busy_timeout=inf", "must be a number of seconds"),
        ("busy_timeout=99999999", "must be a number of seconds from 0 to 2147483"),
        ("busy_timeout", "(write busy_timeout=SECONDS)"),
        ("busy_timeout=1&busy_timeout=2", "busy_timeout is given twice"),
    ],
)
async def test_an_option_that_does_not_exist_or_a_bad_value_is_refused_before_anything_opens(
    tmp_path: Path, query: str, says: str
) -> None:
    """It was part of the file name: a typo opened (and created) another database without a word."""
    path = tmp_path / "w.db"
    url = f"sqlite:///{path}?{query}"
    for attempt in (lambda: check_url(url), lambda: connect(url)):
        with pytest.raises(DatabaseURLError) as err:
            result = attempt()
            if hasattr(result, "__await__"):
                await result
        assert says.format(path=path) in str(err.value), err.value
    assert list(tmp_path.iterdir()) == [], "a file was created for a refused URL"


def test_the_path_ends_at_the_options() -> None:
    assert sqlite_path("sqlite:///w.db?busy_timeout=5") == "w.db"
    assert sqlite_path("sqlite:////abs/w.db?busy_timeout=5") == "/abs/w.db"
    assert sqlite_path("sqlite:///w.db?") == "w.db"
    with pytest.raises(DatabaseURLError, match="no file"):
        sqlite_path("sqlite:///?busy_timeout=5")


def test_serve_refuses_an_unknown_option_with_a_usage_error(tmp_path: Path) -> None:
    proc = _cli_in(tmp_path, "serve", "--db", "sqlite:///w.db?busytimeout=5", "--port", "0")
    assert proc.returncode == 2, proc
    assert "unknown option 'busytimeout'" in proc.stderr and "busy_timeout=SECONDS" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_serve_on_a_locked_file_gives_up_after_the_busy_timeout_of_the_url(tmp_path: Path) -> None:
    journal_file(tmp_path / "w.db")
    with held(tmp_path / "w.db"):
        started = time.monotonic()
        proc = _cli_in(tmp_path, "serve", "--db", "sqlite:///w.db?busy_timeout=1", "--port", "0")
        took = time.monotonic() - started
    assert proc.returncode == 1, proc
    assert "locked by another connection or process" in proc.stderr and "waiting 1 s" in proc.stderr, proc.stderr
    assert 1.0 <= took < 1.0 + 10.0, took  # (the interpreter's start-up included)


def _cli_in(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``factstream ARGS`` run in ``where`` (relative sqlite:/// paths are there)."""
    return subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=60, env=ENV, cwd=where)
