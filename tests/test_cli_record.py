"""``factstream record``: the flight recorder, as a process, against real writers over TCP and Redis;
its files are read back by ``logs parse`` / ``logs report`` and compared with what the writer sent."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli, no_traceback, serve, start, stop

NAME = re.compile(r"^(?P<capture>[^.]+)\.(?P<stamp>\d{8}T\d{12}Z)\.(?P<seq>\d{6})\.log\.gz$")
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3,6}Z [<>#] ")


@contextmanager
def redis_recording(tmp_path: Path) -> Iterator[tuple[Any, str, Path, Any]]:
    """A private redis-server and ``factstream record`` of its channel ``hs``: (server, url, capture dir, recorder).

    Both are stopped at the end, whatever the test did to them (a test stops the recorder itself to read its
    exit status and summary)."""
    from synapse_deployment import PrivateRedis

    server = PrivateRedis()
    server.start()
    url = f"redis://127.0.0.1:{server.port}"
    rec_dir = tmp_path / "rec"
    rec = start("record", "--redis", url, "--server-name", "hs", "--dir", str(rec_dir), "--flush-interval", "0.2")
    try:
        yield server, url, rec_dir, rec
    finally:
        stop(rec)
        server.stop()


def capture_lines(directory: Any) -> list[str]:
    files = sorted(os.listdir(directory))
    assert files and all(NAME.match(f) for f in files), files
    lines: list[str] = []
    for f in files:
        with gzip.open(os.path.join(directory, f), "rt") as fh:
            lines.extend(fh.read().splitlines())
    return lines


def rdata_rows(lines: list[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in lines:
        parts = line.split(" ", 3)
        if parts[1] == ">" and parts[2] == "RDATA":
            out[parts[3].split(" ", 1)[0]] += 1
    return out


def db_rows(path: Any) -> Counter[str]:
    with sqlite3.connect(path) as conn:
        return Counter({s: conn.execute(f"SELECT count(*) FROM demo_{s}").fetchone()[0]
                        for s in ("caches", "receipts", "to_device")})


def test_tcp_recording_rotates_marks_disconnects_and_finishes_on_sigterm(tmp_path: Any) -> None:
    db = tmp_path / "w.db"
    proc, port = serve(f"sqlite:///{db}", "--produce", "--rate", "300")
    rec_dir = tmp_path / "rec"
    rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--name", "hs1-9092",
                "--rotate-time", "1s", "--flush-interval", "0.3s")
    try:
        time.sleep(2.5)
        stop(proc)  # the writer goes away: a hole
        time.sleep(1.0)
        proc = start("serve", "--db", f"sqlite:///{db}", "--port", str(port), "--server-name", "hs1",
                     "--produce", "--rate", "300")
        time.sleep(2.5)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(proc)
    assert rec.returncode == 0, err
    assert not [f for f in os.listdir(rec_dir) if f.endswith(".part")]
    files = sorted(os.listdir(rec_dir))
    assert len(files) >= 3 and [NAME.match(f)["seq"] for f in files] == [f"{i:06d}" for i in range(len(files))]  # type: ignore[index]
    lines = capture_lines(rec_dir)
    assert all(LINE.match(line) for line in lines), [line for line in lines if not LINE.match(line)][:3]
    notes = [line.split(" ", 2)[2] for line in lines if line.split(" ", 2)[1] == "#"]
    assert notes[0].startswith("connected tcp") and any(n.startswith("disconnected") for n in notes[1:-1])
    assert sum(n.startswith("connected") for n in notes) == 2
    assert any(" < REPLICATE" in line for line in lines) and any(" > SERVER hs1" in line for line in lines)
    assert rdata_rows(lines) and "WARNING" in err and no_traceback(err)


def test_a_killed_recorder_loses_at_most_the_open_member(tmp_path: Any) -> None:
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--produce", "--rate", "300")
    rec_dir = tmp_path / "rec"
    try:
        rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--flush-interval", "0.2s")
        time.sleep(3)
        stop(rec, signal.SIGKILL)
        parts = [f for f in os.listdir(rec_dir) if f.endswith(".part")]
        assert len(parts) == 1
        again = cli("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--duration", "1")
        assert again.returncode == 0 and "left behind" in again.stderr, again.stderr
    finally:
        stop(proc)
    lines = capture_lines(rec_dir)  # every file complete and readable, the recovered one first
    assert rdata_rows(lines) and sorted(os.listdir(rec_dir))[0].endswith(".000000.log.gz")


def test_connect_failures_are_one_line(tmp_path: Any) -> None:
    out = cli("record", "127.0.0.1:1", "--dir", str(tmp_path), "--connect-timeout", "0.5")
    assert out.returncode == 1 and "connection refused" in out.stderr and no_traceback(out.stderr)
    out = cli("record", "--dir", str(tmp_path))
    assert out.returncode == 2
    out = cli("record", "127.0.0.1:1", "--rotate-size", "lots")
    assert out.returncode == 2 and "--rotate-size" in out.stderr


@pytest.mark.slow
def test_a_recorded_redis_run_reports_what_was_sent(tmp_path: Any, redis_url: str, channel_prefix: str) -> None:
    import redis

    rec_dir = tmp_path / "rec"
    rec = start("record", "--redis", redis_url, "--server-name", channel_prefix, "--dir", str(rec_dir))
    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 30
    while r.pubsub_numsub(channel_prefix)[0][1] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    r.close()
    db = tmp_path / "w.db"
    writer = start("serve", "--db", f"sqlite:///{db}", "--redis", redis_url, "--server-name", channel_prefix,
                   "--status", "--produce", "--duration", "2", "--rate", "500")
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            if json.loads(line)["event"] == "produced":
                break
        time.sleep(1.0)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(writer)
    assert rec.returncode == 0, err
    sent = db_rows(db)
    lines = capture_lines(rec_dir)
    assert rdata_rows(lines) == sent  # every committed row was heard and written
    pq = tmp_path / "pq"
    parsed = cli("logs", "parse", str(rec_dir), "--out", str(pq), timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    report = cli("logs", "report", str(pq), "--json", timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    doc = json.loads(report.stdout)
    got = Counter()
    for s in doc["streams"]:
        got[s["stream"]] += s["rows"]
    assert got == sent
    assert doc["lines"] == len(lines)
    markers = sum(line.split(" ", 2)[1] == "#" for line in lines)
    assert doc["malformed"] <= markers  # nothing but recorder notes may be refused


def test_rotation_by_size(tmp_path: Any) -> None:
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--produce", "--rate", "4000")
    rec_dir = tmp_path / "rec"
    try:
        out = cli("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--rotate-size", "64k",
                  "--flush-interval", "0.1s", "--duration", "4s")
    finally:
        stop(proc)
    assert out.returncode == 0, out.stderr
    files = sorted(os.listdir(rec_dir))
    assert len(files) >= 2, files
    sizes = [os.path.getsize(rec_dir / f) for f in files]
    assert all(s < 65536 + 65536 for s in sizes[:-1]), sizes  # rotated once past 64k (plus the member in progress)
    assert rdata_rows(capture_lines(rec_dir))


def test_record_option_mistakes_are_refused_before_connecting(tmp_path: Any) -> None:
    """A file as --dir, an empty --name, --user-ip over TCP and a tiny --rotate-size were accepted (or a raw
    [Errno 17]); each is now one line and exit 2."""
    a_file = tmp_path / "ok.txt"
    a_file.write_text("x\n")
    cases = [
        (["--dir", str(a_file)], f"--dir {a_file} is a file, not a directory"),
        (["--name", ""], "--name: capture name '' must be non-empty"),
        (["--user-ip"], "--user-ip applies to --redis"),
        (["--rotate-size", "1"], "must be at least 64k"),
        (["--rotate-size", "63k"], "must be at least 64k"),
    ]
    for extra, needle in cases:
        out = cli("record", "127.0.0.1:1", "--connect-timeout", "30", "--dir", str(tmp_path / "d"), *extra)
        assert out.returncode == 2 and needle in out.stderr and no_traceback(out.stderr), (extra, out.stderr)
        assert "Errno" not in out.stderr
    # TCP's TLS options with Redis or NATS would record over a plaintext link the user believed encrypted
    for carrier, needle in ((["--redis", "redis://:s3cret@127.0.0.1:6379"], "use a rediss:// URL"),
                            (["--nats", "nats://127.0.0.1:4222"], "use a tls:// URL")):
        out = cli("record", *carrier, "--server-name", "x", "--tls", "--dir", str(tmp_path / "d"))
        assert out.returncode == 2 and needle in out.stderr and "s3cret" not in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()


def test_a_dir_made_for_a_failed_connection_is_removed(tmp_path: Any) -> None:
    new = tmp_path / "new" / "deeper"
    out = cli("record", "127.0.0.1:1", "--dir", str(new), "--connect-timeout", "0.5")
    assert out.returncode == 1 and "connection refused" in out.stderr, out.stderr
    assert not (tmp_path / "new").exists()  # both levels it made, and nothing else
    assert "lines in" not in out.stderr  # no summary of a recording that never started
    kept = tmp_path / "kept"
    kept.mkdir()
    out = cli("record", "127.0.0.1:1", "--dir", str(kept), "--connect-timeout", "0.5")
    assert out.returncode == 1 and kept.is_dir()  # a directory the user made stays


def test_a_recorder_hears_redis_soon_after_it_is_back(tmp_path: Any) -> None:
    """Redis gone for 12 s, then back: the recorder hears what is published 3 s later (it waited up to 30 s
    between attempts, so it was still deaf then, and pub/sub keeps nothing for it), with few WARNINGs."""
    import redis

    with redis_recording(tmp_path) as (server, url, rec_dir, rec):

        def publish_when_heard(line: str, within: float) -> bool:
            client = redis.Redis.from_url(url, socket_connect_timeout=1)
            try:
                deadline = time.monotonic() + within
                while time.monotonic() < deadline:
                    try:
                        if client.pubsub_numsub("hs")[0][1] >= 1:
                            client.publish("hs", line)
                            return True
                    except redis.RedisError:
                        pass
                    time.sleep(0.05)
                return False
            finally:
                client.close()

        assert publish_when_heard("POSITION events master 1 1", 30)
        server.stop()
        time.sleep(12)
        server.start()
        time.sleep(3)
        # published whether or not the recorder is subscribed: a subscriber that is not there misses it
        client = redis.Redis.from_url(url)
        client.publish("hs", "POSITION events master 2 2")
        client.close()
        time.sleep(1)
        _, err = stop(rec, signal.SIGTERM)
    assert rec.returncode == 0, err
    no_traceback(err)
    heard = [line.split(" ", 2)[2] for line in capture_lines(rec_dir) if line.split(" ", 2)[1] == ">"]
    assert heard == ["POSITION events master 1 1", "POSITION events master 2 2"], heard
    warnings = [line for line in err.splitlines() if "WARNING" in line and "reconnecting" in line]
    assert 1 <= len(warnings) <= 6, err  # about 7 attempts in 12 s: the 1st-4th said, then the 8th
