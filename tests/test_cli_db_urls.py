"""``--db`` as a user types it: a URL written wrong gets the form to write, a file that is no database is
named as such, and a PostgreSQL URL whose port answers nothing (another service, a silent listener) is
given up on within the connect timeout instead of 130 s of silence, and Ctrl-C still ends it at once."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, cli, no_traceback, start
from conftest import REDIS_HOST, REDIS_PORT

SECRET = "dburl-s3cret"


def run_in(cwd: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=60, env=ENV, cwd=cwd)


def test_postgres_port_that_never_answers_is_given_up_on_with_what_to_check(silent_port: int) -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{silent_port}/x?connect_timeout=2"
    commands = {
        "positions": ["positions", "--db", url],
        "serve": ["serve", "--db", url, "--port", "0"],
        "tail": ["tail", "127.0.0.1:1", "--db", url],
    }
    began = time.monotonic()
    procs = {name: start(*args) for name, args in commands.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, (name, err)
        assert "no PostgreSQL answered at" in err and "within 2 s" in err and "PostgreSQL's port" in err, (name, err)
        assert SECRET not in out + err and no_traceback(err), (name, err)
    assert time.monotonic() - began < 15


@pytest.mark.redis
@pytest.mark.slow
def test_redis_port_given_as_postgres_gives_up_after_ten_seconds_by_default() -> None:
    """No connect_timeout in the URL: 10 s, not psycopg's 130 s."""
    began = time.monotonic()
    out = cli("positions", "--db", f"postgresql://postgres:{SECRET}@{REDIS_HOST}:{REDIS_PORT}/x", timeout=60)
    took = time.monotonic() - began
    assert out.returncode == 1 and 9 < took < 20, (took, out.stderr)
    assert "no PostgreSQL answered" in out.stderr and "within 10 s" in out.stderr and "connect_timeout" in out.stderr
    assert SECRET not in out.stdout + out.stderr and no_traceback(out.stderr)


@pytest.mark.parametrize("command", [["positions"], ["serve", "--port", "0"]])
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_ends_a_postgres_connect_in_progress(silent_port: int, command: list[str], sig: int,
                                                      status: int) -> None:
    proc = start(*command, "--db", f"postgresql://postgres:{SECRET}@127.0.0.1:{silent_port}/x")
    time.sleep(1.5)
    proc.send_signal(sig)
    began = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status and time.monotonic() - began < 3, (proc.returncode, err)
    assert SECRET not in out + err and no_traceback(err)


def test_ctrl_c_ends_tail_while_its_database_connect_is_in_progress(silent_port: int) -> None:
    proc = start("tail", "127.0.0.1:1", "--db", f"postgresql://postgres:{SECRET}@127.0.0.1:{silent_port}/x")
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("tail ignored Ctrl-C during the database connect") from None
    assert proc.returncode == 130


@pytest.mark.parametrize(("typed", "hint"), [
    ("t.db", "write sqlite:///t.db"),
    ("sqlite://t.db", "write sqlite:///t.db"),
    (f"postgresql://postgres:{SECRET}@[::1/x", "'[::1' opens '[' without its closing ']'"),
    (f"postgresql://postgres:{SECRET}@::1/x", "'::1' looks like an IPv6 address without its brackets"),
    (f"postgresql://postgres:{SECRET}@127.0.0.1:54x/x", "the port in '127.0.0.1:54x' must be a number"),
    # a password holding '/' then '?': the authority ends at the '/', the password's first part read as a port
    (f"postgresql://postgres:Ab{SECRET}/cd?ef@127.0.0.1/x", "percent-encode '/', '?' and '#' in the password"),
])
def test_a_db_url_written_wrong_is_a_usage_error_with_the_form_to_write(tmp_path: Any, typed: str, hint: str) -> None:
    (tmp_path / "t.db").touch()  # the file exists: two slashes still name no file
    out = run_in(tmp_path, "positions", "--db", typed)
    assert out.returncode == 2 and hint in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert SECRET not in out.stdout + out.stderr
    for command in (["serve", "--port", "0"], ["tail", "127.0.0.1:1"]):  # a writer and a reader: the same words
        made = run_in(tmp_path, *command, "--db", typed)
        assert made.returncode == 2 and hint in made.stderr and SECRET not in made.stdout + made.stderr, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.db"]


def test_a_directory_and_a_file_that_is_no_database_are_named_as_such(tmp_path: Any) -> None:
    (tmp_path / "dir.db").mkdir()
    (tmp_path / "notes.txt").write_text("not a database\n")
    for command in (["positions"], ["serve", "--port", "0"]):
        out = run_in(tmp_path, *command, "--db", "sqlite:///dir.db")
        assert out.returncode == 1 and "'dir.db' is a directory" in out.stderr, (command, out.stderr)
        out = run_in(tmp_path, *command, "--db", "sqlite:///notes.txt")
        assert out.returncode == 1 and "'notes.txt' is not a SQLite database" in out.stderr, (command, out.stderr)
        assert "folder" not in out.stderr and no_traceback(out.stderr)
    assert (tmp_path / "notes.txt").read_text() == "not a database\n"
