"""``factstream record --nats`` and ``factstream status --nats``, run as the installed executable.

A ``serve --nats --produce`` writer fills a fresh deployment on the shared
JetStream server; the recorder must have written every committed row (its
capture read back by ``logs parse`` / ``logs report``), and status must show
per (stream, writer) the log's sequence and token and the named reader's
consumer with its pending messages and lag.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli, no_traceback, start, stop
from nats_helpers import deployment, nats_url
from test_cli_record import capture_lines, db_rows, rdata_rows

__all__ = ["deployment", "nats_url"]


def produce(db: Path, url: str, name: str, *extra: str) -> Any:
    return start("serve", "--db", f"sqlite:///{db}", "--nats", url, "--server-name", name, "--status", "--produce",
                 *extra)


def wait_event(proc: Any, event: str, timeout: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        msg: dict[str, Any] = json.loads(line)
        if msg.get("event") == event:
            return msg
        assert time.monotonic() < deadline, f"no {event!r} within {timeout}s"
    raise AssertionError(f"the writer exited before {event!r}: {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.slow
def test_a_recorded_nats_run_holds_every_committed_row(tmp_path: Path, nats_url: str, deployment: str) -> None:
    db = tmp_path / "w.db"
    first = produce(db, nats_url, deployment, "--duration", "0.5")  # creates the stream, so the recorder can start
    wait_event(first, "produced")
    stop(first)
    before = db_rows(db)
    rec_dir = tmp_path / "rec"
    rec = start("record", "--nats", nats_url, "--server-name", deployment, "--dir", str(rec_dir))
    time.sleep(2.0)  # its consumer starts at the end of the log
    writer = produce(db, nats_url, deployment, "--duration", "2", "--rate", "500")
    try:
        wait_event(writer, "produced")
        time.sleep(1.0)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(writer)
    assert rec.returncode == 0, err
    assert no_traceback(err) and "connection lost" not in err, err
    sent = db_rows(db) - before
    lines = capture_lines(rec_dir)
    assert rdata_rows(lines) == sent  # every row committed while recording, once
    assert lines[0].split(" ", 2)[1] == "#" and "connected nats" in lines[0]
    pq = tmp_path / "pq"
    parsed = cli("logs", "parse", str(rec_dir), "--out", str(pq), timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    report = cli("logs", "report", str(pq), "--json", timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    doc = json.loads(report.stdout)
    got: Counter[str] = Counter()
    for s in doc["streams"]:
        got[s["stream"]] += s["rows"]
    assert got == sent
    assert doc["malformed"] <= sum(line.split(" ", 2)[1] == "#" for line in lines)


def test_status_shows_sequences_and_the_readers_pending_and_lag(tmp_path: Path, nats_url: str,
                                                                deployment: str) -> None:
    db = tmp_path / "w.db"
    writer = produce(db, nats_url, deployment, "--rate", "300")
    reader = None
    try:
        wait_event(writer, "listening")
        reader = start("tail", "--nats", nats_url, "--server-name", deployment, "--db", f"sqlite:///{db}",
                       "--name", "reader-a")
        time.sleep(2.5)
        out = cli("status", "--nats", nats_url, "--server-name", deployment, "--json", "--interval", "1.5")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["server"] == deployment and doc["stream"] == f"FACTSTREAM_{deployment}"
        streams = {r["stream"]: r for r in doc["streams"]}
        assert set(streams) == {"caches", "receipts", "to_device"}
        for r in streams.values():
            assert r["writer"] == "master" and r["token"] > 0 and r["rows_per_s"] > 10, r
            assert r["sequence"] > 0 and r["messages"] > 0, r  # (the log grows between reads)
        names = {r["name"]: r for r in doc["readers"]}
        a = names["reader-a"]
        assert a["role"] == "reader" and a["sequence"] > 0 and a["pending"] >= 0
        assert a["lag_seconds"] is not None and 0 <= a["lag_seconds"] < 30
        text = cli("status", "--nats", nats_url, "--server-name", deployment, "--interval", "0.5")
        assert text.returncode == 0, text.stderr
        assert "reader-a" in text.stdout and "PENDING" in text.stdout and "SEQUENCE" in text.stdout
    finally:
        if reader is not None:
            stop(reader)
        stop(writer)


async def _stall_a_reader(url: str, server_name: str, name: str) -> dict[tuple[str, int], int]:
    """A reader's consumer that stopped reading half-way: (subject, seq) of every message, and its start.

    The consumer is a push consumer whose delivery subject nobody listens to, so
    JetStream keeps everything from its start sequence pending for it, the
    state of a reader process that hung. What it should report is counted here
    from the messages themselves.
    """
    import nats

    from factstream.transport.nats import JetStreamLayout

    layout = JetStreamLayout.for_server(server_name)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(layout.stream)
        first, last = info.state.first_seq, info.state.last_seq
        seqs: dict[tuple[str, int], int] = {}
        for seq in range(first, last + 1):
            msg = await js.get_msg(layout.stream, seq)
            seqs[(msg.subject, seq)] = seq
        start_at = (first + last) // 2
        await nc.request(f"$JS.API.CONSUMER.CREATE.{layout.stream}", json.dumps({
            "stream_name": layout.stream,
            "config": {"description": f"factstream reader {name}", "deliver_subject": f"nobody.listens.{name}",
                       "deliver_policy": "by_start_sequence", "opt_start_seq": start_at, "ack_policy": "none",
                       "inactive_threshold": 60 * 1_000_000_000},
        }).encode(), timeout=5)
        seqs[("", -1)] = start_at
        return seqs
    finally:
        await nc.close()


async def _probes_left(url: str, server_name: str) -> int:
    import nats

    from factstream.transport.nats import JetStreamLayout
    from factstream.transport.nats.inspect import PROBE_DESCRIPTION

    nc = await nats.connect(url)
    try:
        infos = await nc.jetstream().consumers_info(JetStreamLayout.for_server(server_name).stream)
        return sum(1 for c in infos if c.config.description == PROBE_DESCRIPTION)
    finally:
        await nc.close()


@pytest.mark.slow
def test_status_shows_what_a_stalled_reader_misses_per_stream_and_writer(tmp_path: Path, nats_url: str,
                                                                          deployment: str) -> None:
    import asyncio

    db = tmp_path / "w.db"
    writer = produce(db, nats_url, deployment, "--rate", "400")
    try:
        wait_event(writer, "listening")
        time.sleep(3)
    finally:
        stop(writer)  # the log stops growing: every count below is exact
    seqs = asyncio.run(_stall_a_reader(nats_url, deployment, "stalled-b"))
    start_at = seqs.pop(("", -1))
    expected = Counter(subject for subject, seq in seqs if seq >= start_at)
    assert len(expected) >= 2, expected  # several (stream, writer) subjects are behind
    out = cli("status", "--nats", nats_url, "--server-name", deployment, "--json", "--interval", "0.2")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    stalled = {r["name"]: r for r in doc["readers"]}["stalled-b"]
    assert stalled["sequence"] == start_at - 1
    assert stalled["pending"] == sum(expected.values())
    per = {s["subject"]: s for s in stalled["streams"]}
    assert {k: v["pending"] for k, v in per.items() if v["pending"]} == dict(expected)
    for subject, s in per.items():
        assert s["writer"] == "master" and s["stream"] in {"caches", "receipts", "to_device"}, s
        if s["pending"]:
            assert s["lag_seconds"] is not None and 0 < s["lag_seconds"] < 120, s
    assert stalled["lag_seconds"] == max(s["lag_seconds"] for s in per.values())
    assert asyncio.run(_probes_left(nats_url, deployment)) == 0  # the counting consumers are gone
    text = cli("status", "--nats", nats_url, "--server-name", deployment, "--interval", "0.2")
    assert text.returncode == 0, text.stderr
    assert "behind, per (stream, writer)" in text.stdout
    for subject, n in expected.items():
        stream = per[subject]["stream"]
        assert any(stream in line and f" {n} " in f"{line} " for line in text.stdout.splitlines()
                   if line.startswith("stalled-b")), (stream, n, text.stdout)


@pytest.mark.parametrize(
    ("argv", "status", "needle"),
    [
        (["status", "--nats", "nats://127.0.0.1:4222"], 2, "--nats needs --server-name"),
        (["status", "--nats", "nats://127.0.0.1:4222", "--server-name", "x", "--metrics", "127.0.0.1:1"], 2,
         "read from JetStream"),
        (["status", "--nats", "nats://127.0.0.1:4222", "--redis", "redis://127.0.0.1:6379", "--server-name", "x"], 2,
         "exactly one"),
        (["status", "--nats", "nats://alice:s3cret@127.0.0.1:1", "--server-name", "x"], 1,
         "cannot reach NATS at nats://alice:***@127.0.0.1:1"),
        (["status", "--nats", "nats://127.0.0.1:4222", "--server-name", "nobody-here-x", "--interval", "0.2"], 1,
         "no JetStream stream"),
        (["record", "--nats", "nats://127.0.0.1:4222"], 2, "--nats needs --server-name"),
        (["record", "--nats", "nats://127.0.0.1:4222", "--server-name", "x", "--user-ip"], 2, "--user-ip"),
        (["record", "--nats", "127.0.0.1:4222", "--server-name", "x"], 2, "bad NATS URL"),
        (["record", "--nats", "nats://alice:s3cret@127.0.0.1:1", "--server-name", "x"], 1, "cannot reach NATS"),
    ],
)
def test_nats_status_and_record_mistakes_get_a_clear_error(argv: list[str], status: int, needle: str,
                                                           nats_url: str, tmp_path: Path) -> None:
    if argv[0] == "record":
        argv = [*argv, "--dir", str(tmp_path)]
    out = cli(*argv)
    assert out.returncode == status, out.stderr
    assert needle in out.stderr
    assert no_traceback(out.stderr) and "s3cret" not in out.stderr + out.stdout


def test_record_with_a_mistyped_server_name_fails_like_tail_and_status(nats_url: str, tmp_path: Path) -> None:
    """It flooded 'stream not found; retrying' and exited 0 with only its own notes recorded."""
    rec_dir = tmp_path / "rec"
    out = cli("record", "--nats", nats_url, "--server-name", "nobody-here-x", "--duration", "2", "--dir", str(rec_dir))
    assert out.returncode == 1 and no_traceback(out.stderr), out.stderr
    assert out.stderr.strip() == ("factstream record: no JetStream stream FACTSTREAM_nobody-here-x at "
                                  f"{nats_url}: no writer of deployment 'nobody-here-x' has published there yet "
                                  "(check --server-name)")
    assert not rec_dir.exists()
