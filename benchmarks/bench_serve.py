"""``factstream serve --produce --rate 0``: rows delivered to a reader per second (issue 17, target 4).

The installed executable writes synthetic facts into a fresh database (SQLite file or PostgreSQL
database, one per round) as fast as it can; ``factstream tail`` in its own process reads them over
TCP and prints them into a pipe this process counts. A round is timed from the first row the
reader printed to the N-th, so start-up is not in it: the measured time is the writer's rows
produced, committed, read back by its publisher, sent and printed by the reader.

extra_info: ``rows_per_s`` (wall clock, the target's figure), ``rows_per_serve_cpu_s`` (rows per
second of the serve process's CPU time over the same round, which a loaded machine does not
distort), what the writer reported producing (``produced_rows``, its ``transactions``), and the load
average at the end of the round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import factstream

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
ROWS = {"sqlite": 400_000, "postgres": 200_000}
ROUNDS = 3


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def databases(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``make()`` -> the URL of a fresh database of the engine under test (dropped afterwards)."""
    engine = request.node.callspec.params["engine"]
    made: list[str] = []

    def make() -> str:
        if engine == "sqlite":
            return f"sqlite:///{tmp_path / f'serve-{uuid.uuid4().hex[:8]}.db'}"
        import psycopg
        from conftest import PG_HOST, PG_PORT, PG_START, pg_dsn, require_service

        require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
        name = f"factstream_bench_serve_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return pg_dsn(name)

    yield make
    if made:
        import psycopg
        from conftest import pg_dsn

        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Round:
    """One writer and one reader, started; :meth:`read` times N rows from the first one."""

    def __init__(self, db_url: str, rows: int) -> None:
        self.rows = rows
        self.serve = subprocess.Popen(
            [FACTSTREAM, "serve", "--produce", "--rate", "0", "--db", db_url, "--port", "0", "--status", "--seed", "1"],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.serve.stdout is not None
        port = None
        for line in self.serve.stdout:
            event = json.loads(line)
            if event["event"] == "listening":
                port = event["port"]
                break
        assert port, "serve did not start listening"
        self.tail = subprocess.Popen(
            [FACTSTREAM, "tail", f"127.0.0.1:{port}", "--count", str(rows)], stdout=subprocess.PIPE
        )
        assert self.tail.stdout is not None
        self.fd = self.tail.stdout.fileno()
        first = os.read(self.fd, 1 << 20)  # the round starts with the first row printed
        assert first, "tail printed nothing"
        self.seen = first.count(b"\n")
        self.cpu0 = _cpu_seconds(self.serve.pid)
        self.seconds = 0.0
        self.cpu = 0.0

    def read(self) -> None:
        t0 = time.perf_counter()
        seen = self.seen
        while seen < self.rows:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                break
            seen += chunk.count(b"\n")
        self.seconds = time.perf_counter() - t0
        self.cpu = _cpu_seconds(self.serve.pid) - self.cpu0
        assert seen >= self.rows, f"tail stopped after {seen} rows"
        self.delivered = seen - self.seen

    def close(self) -> dict[str, Any]:
        """Stop both; the writer's last status (what it produced)."""
        self.tail.wait(timeout=60)
        self.serve.terminate()
        assert self.serve.stdout is not None
        last: dict[str, Any] = {}
        for line in self.serve.stdout:
            last = json.loads(line)
        self.serve.wait(timeout=60)
        self.serve.stdout.close()
        assert self.tail.stdout is not None
        self.tail.stdout.close()
        return last


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_serve_produce_rows_to_a_reader(benchmark: Any, databases: Any, engine: str) -> None:
    rows = ROWS[engine]
    done: list[tuple[Round, dict[str, Any]]] = []
    current: list[Round] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        if current:
            done.append((current[0], current[0].close()))
            current.clear()
        current.append(Round(databases(), rows))
        return (), {}

    def once() -> None:
        current[0].read()

    benchmark.group = "cli-serve-produce"
    try:
        benchmark.pedantic(once, setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        if current:
            done.append((current[0], current[0].close()))
    rates = [r.delivered / r.seconds for r, _ in done]
    cpu_rates = [r.delivered / r.cpu for r, _ in done if r.cpu > 0]
    best = max(range(len(done)), key=lambda i: rates[i])
    produced = done[best][1]
    assert produced.get("event") == "produced" and produced["rows"] >= rows
    benchmark.extra_info["rows"] = round(sum(r.delivered for r, _ in done) / len(done))
    benchmark.extra_info["impl"] = factstream.IMPL
    benchmark.extra_info["engine"] = engine
    benchmark.extra_info["rows_per_s"] = round(max(rates))
    benchmark.extra_info["rows_per_s_rounds"] = [round(r) for r in rates]
    benchmark.extra_info["rows_per_serve_cpu_s"] = round(max(cpu_rates)) if cpu_rates else None
    benchmark.extra_info["produced_rows"] = produced["rows"]
    benchmark.extra_info["transactions"] = produced["transactions"]
    benchmark.extra_info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
