"""Crash and concurrency of stream ids with real processes on the real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

import factstream

HELPER = str(Path(__file__).with_name("helpers_ids_procs.py"))
ENV = dict(os.environ, PYTHONPATH=str(Path(factstream.__file__).resolve().parent.parent))

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def create_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE facts (stream_id BIGINT PRIMARY KEY, instance_name TEXT NOT NULL, body TEXT)"
        )


def rows(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {int(i): str(n) for i, n in conn.execute("SELECT stream_id, instance_name FROM facts").fetchall()}


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, HELPER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )


def events(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> list[list[str]]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"helper failed ({proc.returncode}):\n{err}"
    return events(out)


def test_sigkill_mid_transaction_then_restart(postgres_dsn: str) -> None:
    create_table(postgres_dsn)
    proc = spawn("crash", postgres_dsn, "w1", "--writers", "w1,w2", "--count", "4")
    committed: list[int] = []
    doomed = None
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while doomed is None:
        assert time.monotonic() < deadline, "crash helper never reached its transaction"
        line = proc.stdout.readline()
        assert line, f"crash helper exited early: {proc.stderr.read() if proc.stderr else ''}"
        kind, *rest = line.split()
        if kind == "COMMITTED":
            committed.append(int(rest[0]))
        elif kind == "IN_TXN":
            doomed = int(rest[0])
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)  # reap it and close its pipes
    assert proc.returncode == -signal.SIGKILL

    restarted = finish(spawn("restart", postgres_dsn, "w1", "--writers", "w1,w2"))
    pos_before, new_id, pos_after = int(restarted[0][1]), int(restarted[1][1]), int(restarted[2][1])
    assert pos_before == committed[-1]  # recovered from the database: the last committed fact
    assert new_id > doomed  # the uncommitted id is a hole, never handed out again
    assert pos_after == new_id  # and the position moved past it
    table = rows(postgres_dsn)
    assert sorted(table) == committed + [new_id]  # nothing committed lost, nothing doomed kept
    assert doomed not in table


def test_three_writers_and_a_reader(postgres_dsn: str, tmp_path: Path) -> None:
    create_table(postgres_dsn)
    stop = tmp_path / "stop"
    reader = spawn("reader", postgres_dsn, "reader", "--stop-file", str(stop))
    # The writers start once the reader has loaded its positions: a reader starting after they had
    # finished (a loaded machine) would find the final position already there and see no move.
    assert reader.stdout is not None
    ready = reader.stdout.readline().split()
    assert ready and ready[0] == "READY", f"reader did not start: {ready} {reader.stderr.read() if reader.stderr else ''}"
    writers = {
        name: spawn(
            "writer", postgres_dsn, name, "--count", "80", "--tasks", "6", "--fail-rate", "0.25",
            "--max-delay", "0.01", "--seed", str(seed),
        )
        for seed, name in enumerate(("w1", "w2", "w3"))
    }
    out = {name: finish(proc) for name, proc in writers.items()}
    stop.touch()
    follow = finish(reader)
    table = rows(postgres_dsn)

    all_reserved: list[int] = []
    for name, evs in out.items():
        reserved = [int(e[1]) for e in evs if e[0] == "RESERVED"]
        committed = {int(e[1]) for e in evs if e[0] == "COMMITTED"}
        failed = {int(e[1]) for e in evs if e[0] == "FAILED"}
        all_reserved += reserved
        assert len(reserved) == 81 and committed.isdisjoint(failed) and committed | failed == set(reserved)
        assert failed, "the test should inject some failures"
        # every committed fact is in the table under its writer; no failed one is
        assert {i for i, n in table.items() if n == name} == committed
        # the writer's listener reports are contiguous and only move forward
        moves = [(int(e[1]), int(e[2])) for e in evs if e[0] == "POS"]
        assert all(new > old for old, new in moves)
        assert all(b[0] == a[1] for a, b in zip(moves, moves[1:]))
        final = int(next(e[1] for e in evs if e[0] == "FINAL"))
        last_committed = int(next(e[1] for e in reversed(evs) if e[0] == "COMMITTED"))
        assert final == last_committed == max(reserved)
        assert moves[-1][1] == final
    assert len(all_reserved) == len(set(all_reserved)), "an id was handed out twice"

    # what the reader saw at each reported position was already complete then
    snaps = [e for e in follow if e[0] == "SNAP"]
    linear = [e for e in follow if e[0] == "LINEAR"]
    assert snaps and linear
    last: dict[str, int] = defaultdict(int)
    for _, name, pos, count in snaps:
        assert int(pos) > last[name], "a position went backwards"
        last[name] = int(pos)
        assert sum(1 for i, n in table.items() if n == name and i <= int(pos)) == int(count), (
            f"{name} reported {pos} before all its facts at or below it were committed"
        )
    prev = 0
    for _, pos, count in linear:
        assert int(pos) > prev
        prev = int(pos)
        assert sum(1 for i in table if i <= int(pos)) == int(count)
    assert {name: last[name] for name in out} == {
        name: int(next(e[1] for e in evs if e[0] == "FINAL")) for name, evs in out.items()
    }
