"""``factstream record`` when its disk fails under it, run as the installed executable against real writers.

A full disk is a per-process file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored: every write past it
fails with EFBIG, as a full disk fails with ENOSPC) so no mount is needed. The recorder must stop with
one clear line and exit 1, and what it leaves must be complete files: every line up to the last
finished gzip member, readable by gzip and ``factstream decode``, the same rows the writer committed.
Before, the file was renamed to its final name ending inside a member (a "complete" file gzip could
not read), the message was a bare ``[Errno 27] File too large``, and over NATS the recorder went on
running, recording nothing, until it was signalled; a removed --dir went unnoticed until the next
rotation (an hour by default), every line written into a deleted file.
"""

from __future__ import annotations

import gzip
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli, no_traceback, serve, start, stop
from nats_helpers import deployment, nats_url
from test_cli_record import NAME, rdata_rows
from test_nats_record_status import produce, wait_event

__all__ = ["deployment", "nats_url"]

LIMIT = 48 << 10  # bytes a capture file may reach before writes fail


def small_disk() -> None:
    """preexec_fn: writes past LIMIT bytes fail with EFBIG instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def wait_exit(proc: subprocess.Popen[str], timeout: float) -> tuple[int | None, str]:
    """The exit status within ``timeout`` (None: still running, then stopped) and stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        _, err = stop(proc, signal.SIGTERM)
        return None, err


def check_files(rec_dir: Path) -> list[str]:
    """Every file finished (no .part), whole to gzip and to 'factstream decode'; their lines."""
    files = sorted(os.listdir(rec_dir))
    assert files and all(NAME.match(f) for f in files), files
    lines: list[str] = []
    for f in files:
        with gzip.open(rec_dir / f, "rt") as fh:  # raises EOFError on a file cut inside a member
            text = fh.read()
        assert text.endswith("\n"), f
        lines.extend(text.splitlines())
        out = cli("decode", str(rec_dir / f))
        assert out.returncode == 0, (f, out.stdout[-500:], out.stderr[-500:])
    return lines


def same_rows_as_db(db: Path, lines: list[str]) -> int:
    """Nothing missing or twice: per stream, the recorded RDATA rows are the committed rows of the token
    range they span (rows of a 'batch' not yet closed by its token are left out); the rows compared."""
    import sqlite3
    from collections import Counter, defaultdict

    rows: Counter[tuple[str, int]] = Counter()
    pending: Counter[str] = Counter()
    tokens: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        parts = line.split(" ", 3)
        if parts[1] != ">" or parts[2] != "RDATA":
            continue
        stream, _, token = parts[3].split(" ", 3)[:3]
        pending[stream] += 1
        if token != "batch":
            rows[(stream, int(token))] += pending.pop(stream)
            tokens[stream].append(int(token))
    with sqlite3.connect(db) as conn:
        for stream, seen in tokens.items():
            committed = Counter({(stream, t): n for t, n in conn.execute(
                f"SELECT stream_id, count(*) FROM demo_{stream} WHERE stream_id BETWEEN ? AND ? GROUP BY stream_id",
                (min(seen), max(seen)))})
            recorded = Counter({k: n for k, n in rows.items() if k[0] == stream})
            assert recorded == committed, (stream, committed - recorded, recorded - committed)
    return sum(rows.values())


def test_a_full_disk_stops_a_tcp_recorder_with_complete_files(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    proc, port = serve(f"sqlite:///{db}", "--produce", "--rate", "2000")
    rec_dir = tmp_path / "rec"
    try:
        rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--flush-interval", "0.2s",
                    preexec_fn=small_disk)
        status, err = wait_exit(rec, 30)
    finally:
        stop(proc)
    assert status == 1, err
    assert f"cannot write the capture files in --dir {rec_dir}: file too large" in err, err
    assert "recording stopped after" in err and no_traceback(err) and "Errno" not in err, err
    lines = check_files(rec_dir)
    stopped = int(err.split("recording stopped after ", 1)[1].split(" ", 1)[0])
    lost = int(err.split("; the ", 1)[1].split(" ", 1)[0])
    assert len(lines) == stopped - lost  # the counts it prints are what is on disk
    assert same_rows_as_db(db, lines) > 100


@pytest.mark.slow
def test_a_full_disk_stops_a_nats_recorder(tmp_path: Path, nats_url: str, deployment: str) -> None:
    db = tmp_path / "w.db"
    first = produce(db, nats_url, deployment, "--duration", "0.5")  # creates the stream
    wait_event(first, "produced")
    stop(first)
    rec_dir = tmp_path / "rec"
    rec = start("record", "--nats", nats_url, "--server-name", deployment, "--dir", str(rec_dir),
                "--flush-interval", "0.2s", preexec_fn=small_disk)
    time.sleep(2.0)  # its consumer starts at the end of the log
    writer = produce(db, nats_url, deployment, "--rate", "2000")
    try:
        status, err = wait_exit(rec, 30)  # it went on running, recording nothing, until signalled
    finally:
        stop(writer)
    assert status == 1, err
    assert "cannot write the capture files" in err and "file too large" in err, err
    assert no_traceback(err) and "never retrieved" not in err, err
    lines = check_files(rec_dir)
    assert rdata_rows(lines)


def test_a_removed_dir_stops_the_recorder_within_a_flush_interval(tmp_path: Path) -> None:
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--produce", "--rate", "300")
    rec_dir = tmp_path / "rec"
    try:
        rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--flush-interval", "0.2s")
        deadline = time.monotonic() + 20
        while not (rec_dir.is_dir() and os.listdir(rec_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        shutil.rmtree(rec_dir)
        rec_dir.write_text("not a directory any more\n")  # and a file where it was
        status, err = wait_exit(rec, 10)  # it wrote into the deleted file until the next rotation (1h)
    finally:
        stop(proc)
    assert status == 1, err
    assert "was removed while being written (was --dir deleted?)" in err and no_traceback(err), err
    assert "recording stopped after" in err
