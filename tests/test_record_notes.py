"""``factstream record``'s notes and its crash bound, as a process against real servers.

A SIGTERM while the carrier was gone wrote a second ``# disconnected`` note for the one hole
(``disconnected recorder stopped`` after ``disconnected Redis ...``); a SIGKILL lost up to
--flush-interval + 0.5 s of a quiet capture, as members were finished by a 0.5 s tick, not at
--flush-interval after their first line.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from cli_run import cli, no_traceback, serve, start, stop
from test_cli_record import capture_lines, redis_recording


def notes(directory: Path) -> list[str]:
    """The recorder's ``#`` notes of a capture, without their times."""
    return [line.split(" ", 2)[2] for line in capture_lines(directory) if line.split(" ", 2)[1] == "#"]


def test_a_stop_while_redis_is_gone_writes_one_disconnected_note(tmp_path: Path) -> None:
    import redis

    with redis_recording(tmp_path) as (server, url, rec_dir, rec):
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 30
        while client.pubsub_numsub("hs")[0][1] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.close()
        server.stop()
        time.sleep(1.5)  # it has noticed and is retrying
        _, err = stop(rec, signal.SIGTERM)
    assert rec.returncode == 0 and no_traceback(err), err
    got = notes(rec_dir)
    assert len(got) == 2, got
    assert got[0].startswith("connected redis") and got[1].startswith(f"disconnected Redis {url}"), got
    assert "(1 disconnects," in err, err


def test_tcp_notes_one_disconnected_per_hole_and_one_at_a_stop_while_connected(tmp_path: Path) -> None:
    """A hole that ends in a reconnect, a second one that lasts until SIGTERM: two disconnected notes (a third was
    written at the stop); a stop while connected still gets its ``disconnected recorder stopped``."""
    db = f"sqlite:///{tmp_path}/w.db"
    proc, port = serve(db)
    rec_dir = tmp_path / "rec"
    rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--flush-interval", "0.2")
    try:
        time.sleep(1.0)
        stop(proc)
        time.sleep(0.3)
        proc = start("serve", "--db", db, "--port", str(port), "--server-name", "hs1")
        time.sleep(2.5)  # reconnected (attempts at most 2 s apart)
        stop(proc)
        time.sleep(1.5)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(rec)
        stop(proc)
    assert rec.returncode == 0 and no_traceback(err), err
    kinds = [n.split(" ", 2)[:2] for n in notes(rec_dir)]
    assert kinds == [["connected", "tcp"], ["disconnected", f"127.0.0.1:{port}"]] * 2, kinds
    assert "(2 disconnects," in err, err

    proc, port = serve(db)
    again = tmp_path / "again"
    rec = start("record", f"127.0.0.1:{port}", "--dir", str(again))
    try:
        time.sleep(1.0)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(proc)
    assert rec.returncode == 0, err
    got = notes(again)
    assert len(got) == 2 and got[1] == "disconnected recorder stopped", got
    assert "(0 disconnects," in err, err


def test_a_stop_while_nats_is_gone_writes_one_disconnected_note(tmp_path: Path) -> None:
    from nats_helpers import NatsServer

    server = NatsServer(tmp_path / "js")
    server.start()
    db = tmp_path / "w.db"
    writer = start("serve", "--db", f"sqlite:///{db}", "--nats", server.url, "--server-name", "hs1", "--status",
                   "--produce", "--duration", "0.3")
    rec: Any = None
    try:
        assert writer.stdout is not None
        for line in writer.stdout:  # the stream exists once something was produced
            if json.loads(line)["event"] == "produced":
                break
        stop(writer)
        rec_dir = tmp_path / "rec"
        rec = start("record", "--nats", server.url, "--server-name", "hs1", "--dir", str(rec_dir))
        time.sleep(2.0)
        server.kill()
        time.sleep(1.5)
        _, err = stop(rec, signal.SIGTERM)
    finally:
        stop(writer)
        if rec is not None:
            stop(rec)
        server.stop()
    assert rec.returncode == 0 and no_traceback(err), err
    got = notes(rec_dir)
    assert len(got) == 2 and got[0].startswith("connected nats") and got[1].startswith("disconnected NATS"), got


def test_a_killed_recorder_keeps_a_quiet_line_written_flush_interval_ago(tmp_path: Path) -> None:
    """Killed 1.3 s after its first line with --flush-interval 1.1s, the recorder kept that line: the member is
    finished at 1.1 s (it was finished by the first 0.5 s tick after that, at 1.5 s, and the kill lost it)."""
    proc, port = serve(f"sqlite:///{tmp_path}/w.db")  # no traffic after the handshake: a quiet capture
    rec_dir = tmp_path / "rec"
    try:
        rec = start("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--flush-interval", "1.1s")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the file is made by its first line, the '# connected' note
            if rec_dir.is_dir() and os.listdir(rec_dir):
                break
            time.sleep(0.002)
        first_line = time.monotonic()
        time.sleep(max(0.0, first_line + 1.3 - time.monotonic()))
        stop(rec, signal.SIGKILL)
        [part] = os.listdir(rec_dir)
        size = os.path.getsize(rec_dir / part)
        again = cli("record", f"127.0.0.1:{port}", "--dir", str(rec_dir), "--duration", "0.5")
    finally:
        stop(proc)
    assert size > 0, "nothing of the first 1.3 s was on disk when the recorder was killed"
    assert again.returncode == 0 and "left behind" in again.stderr, again.stderr
    lines = capture_lines(rec_dir)
    assert sum(" # connected tcp " in line for line in lines) == 2  # the killed recorder's and the second's
    assert " # connected tcp " in lines[0] and " > SERVER hs1" in lines[3], lines[:4]
