"""``factstream tail`` mistakes in --format, --stream, --writer and --from are said, on every carrier.

A mistyped filter used to print nothing forever (Redis, NATS, every --writer),
a mistyped --format printed blanks, and --from past the writer blamed a
database restore. The installed executable runs against real writers.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cli_run import cli, no_traceback, start, stop
from nats_helpers import deployment, nats_url  # noqa: F401 - fixtures
from test_cli_tail import writer  # noqa: F401 - a TCP writer producing facts for the whole module
from test_nats_record_status import produce, wait_event


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("%{nosuchfield} %t", "unknown row field %{nosuchfield}; the row fields are: action,"),
        ("%{cache_fnc}", "did you mean %{cache_func}?"),
        ("%", "the template ends with a lone '%': write %% for a percent sign"),
        ("%t \\", "the template ends with a lone '\\': write \\\\ for a backslash"),
        ("%{user-id}", "malformed placeholder '%{user-id}'"),
        ("%{user_id", "malformed placeholder '%{user_id'"),
        ("", "the template is empty"),
        ("%q", "unknown placeholder %q"),
    ],
)
def test_a_format_mistake_is_a_usage_error_before_connecting(template: str, needle: str) -> None:
    out = cli("tail", "127.0.0.1:1", "--format", template, "--connect-timeout", "30")
    assert out.returncode == 2 and needle in out.stderr and no_traceback(out.stderr), out.stderr
    assert out.stdout == ""


def test_a_good_format_with_a_typed_field_still_works(writer: tuple[str, int]) -> None:
    _, port = writer
    out = cli("tail", f"127.0.0.1:{port}", "--stream", "caches", "--count", "2", "--format", "%{cache_func} 100%% %t")
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("get_user_by_id 100% ") for line in out.stdout.splitlines()), out.stdout


def _first_warning(proc: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    """Read stderr until a line holding ``needle`` (or ``timeout``), stop with Ctrl-C, return all stderr."""
    got: list[str] = []

    def read() -> None:
        for line in proc.stderr or ():
            got.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while not any(needle in line for line in got) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    stop(proc, signal.SIGINT)
    reader.join(10)
    return "".join(got)


def test_a_writer_typo_over_tcp_names_the_writers(writer: tuple[str, int]) -> None:
    _, port = writer
    proc = start("tail", f"127.0.0.1:{port}", "--writer", "mastr")
    err = _first_warning(proc, "--writer")
    assert no_traceback(err), err
    assert ("the writers the server announced are master; --writer mastr is not among them "
            "(nothing is shown for it)") in err, err


def test_with_db_a_writer_typo_and_a_from_past_the_writer_are_usage_errors(writer: tuple[str, int]) -> None:
    db_url, port = writer
    typo = cli("tail", f"127.0.0.1:{port}", "--db", db_url, "--writer", "mastr", "--count", "1")
    assert typo.returncode == 2 and no_traceback(typo.stderr), typo.stderr
    assert typo.stderr.strip() == "factstream tail: no writer mastr in the writer's database (its writers: master)"
    past = cli("tail", f"127.0.0.1:{port}", "--db", db_url, "--from", "99999999", "--count", "1")
    assert past.returncode == 2 and no_traceback(past.stderr), past.stderr
    assert "--from 99999999 is past the writer's current position (caches/master " in past.stderr
    assert "restored" not in past.stderr and "ERROR" not in past.stderr


def test_redis_stream_typo_warns_listing_the_streams_heard(tmp_path: Path, redis_url: str,
                                                           channel_prefix: str) -> None:
    w = start("serve", "--db", f"sqlite:///{tmp_path}/r.db", "--redis", redis_url, "--server-name", channel_prefix,
              "--produce", "--rate", "100")
    try:
        proc = start("tail", "--redis", redis_url, "--server-name", channel_prefix, "--stream", "cachez")
        err = _first_warning(proc, "--stream cachez")
    finally:
        stop(w)
    assert no_traceback(err), err
    assert "the streams heard on the channel are caches, receipts, to_device; --stream cachez is not among them" in err


def test_nats_stream_typo_warns_listing_the_streams_logged(tmp_path: Path, nats_url: str, deployment: str) -> None:
    w = produce(tmp_path / "n.db", nats_url, deployment, "--duration", "1")
    try:
        wait_event(w, "produced")  # the log now holds every stream's subject
        proc = start("tail", "--nats", nats_url, "--server-name", deployment, "--stream", "cachez")
        err = _first_warning(proc, "--stream cachez")
    finally:
        stop(w)
    assert no_traceback(err), err
    assert ("the streams in the deployment's log are caches, receipts, to_device; --stream cachez is not among "
            "them") in err, err
