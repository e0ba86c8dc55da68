"""Running `factstream logs stream` and real writers for the streaming tests, and what they compare.

`Proc` is a factstream command (a stream, a writer, a recorder) in its own
process group, its stderr (or stdout) lines collected as they come, so a
test can wait for a line and SIGKILL the whole query (driver, JVM, Python
workers) at once. The row counters compare a writer's database with the
Parquet a stream wrote, row for row.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from cli_run import FACTSTREAM

#: Local Spark for the streaming commands: two cores, no UI, a small driver.
SPARK = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=768m"]

Row = tuple[str, str, int, str]


def stream_env() -> dict[str, str]:
    """The environment of a streaming command: this venv's own Python for Spark's workers, on the loopback."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


class Proc:
    """A command in its own process group whose stderr (or, with ``stream="stdout"``, stdout) lines are collected."""

    def __init__(self, args: list[str], stream: str = "stderr") -> None:
        pipe = subprocess.PIPE
        self.p = subprocess.Popen(
            args, stdout=pipe if stream == "stdout" else subprocess.DEVNULL,
            stderr=pipe if stream == "stderr" else subprocess.DEVNULL, text=True, env=stream_env(),
            start_new_session=True,
        )
        self.lines: list[str] = []
        out = self.p.stdout if stream == "stdout" else self.p.stderr
        assert out is not None
        self.t = threading.Thread(target=lambda: self.lines.extend(iter(out.readline, "")), daemon=True)
        self.t.start()

    def wait_for(self, pred: Callable[[str], bool], timeout: float) -> str:
        """The first line ``pred`` accepts; AssertionError with the last lines if none came within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if pred(line):
                    return line
            if self.p.poll() is not None:
                time.sleep(0.5)
                break
            time.sleep(0.1)
        raise AssertionError(f"not seen within {timeout} s (exit {self.p.poll()}):\n" + "".join(self.lines[-60:]))

    def finish(self, timeout: float) -> int:
        """Wait for the exit status, and for the last lines."""
        try:
            return self.p.wait(timeout=timeout)
        finally:
            self.t.join(timeout=10)

    def killpg(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (no wait)."""
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the process group if it still runs, and reap it."""
        if self.p.poll() is None:
            self.killpg(signal.SIGKILL)
            self.p.wait(timeout=30)


def run_stream(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``factstream logs stream ARGS`` on local Spark, to completion (give it ``--stop-when-idle``)."""
    return subprocess.run([FACTSTREAM, "logs", "stream", *args, *SPARK], capture_output=True, text=True,
                          timeout=timeout, env=stream_env())


def produce(db_url: str, seconds: float, seed: int) -> None:
    """Run a real writer (``serve --produce``) on ``db_url`` for ``seconds``, then stop it (SIGTERM: it records
    its positions and exits 0)."""
    writer = subprocess.Popen([FACTSTREAM, "serve", "--produce", "--db", db_url, "--port", "0", "--rate", "200",
                               "--duration", str(seconds), "--seed", str(seed)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=stream_env(), start_new_session=True)
    try:
        time.sleep(seconds + 2)
        writer.send_signal(signal.SIGTERM)
        _, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=30)
    assert writer.returncode == 0, err


def db_rows(db_url: str) -> collections.Counter[Row]:
    """(stream, writer, token, row as sorted JSON) of every fact in a writer's database (PostgreSQL or SQLite)."""
    from factstream.demo.tables import DEMO_TABLES

    out: collections.Counter[Row] = collections.Counter()

    def count(fetch: Callable[[str], list[tuple[Any, ...]]]) -> None:
        for t in DEMO_TABLES:
            for row in fetch(f"SELECT stream_id, instance_name, {', '.join(t.columns)} FROM {t.table}"):
                out[(t.stream, str(row[1]), int(row[0]), json.dumps(t.to_row(tuple(row[2:])), sort_keys=True))] += 1

    if db_url.startswith("sqlite:"):
        import sqlite3

        conn = sqlite3.connect(db_url.removeprefix("sqlite://"))
        try:
            count(lambda sql: conn.execute(sql).fetchall())
        finally:
            conn.close()
        return out
    import psycopg

    with psycopg.connect(db_url) as pg:
        count(lambda sql: pg.execute(sql).fetchall())
    return out


def parquet_rows(path: str, source_prefix: str = "") -> collections.Counter[Row]:
    """The same of the facts a stream wrote to ``path`` (those whose source_file starts with ``source_prefix``).

    Every one must be a well-formed RDATA row.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["source_file", "stream", "instance", "token", "row", "command", "error"])
    out: collections.Counter[Row] = collections.Counter()
    for r in table.to_pylist():
        if not r["source_file"].startswith(source_prefix):
            continue
        assert r["command"] == "RDATA" and r["error"] is None, r
        out[(str(r["stream"]), r["instance"], r["token"], json.dumps(json.loads(r["row"]), sort_keys=True))] += 1
    return out


def data_batch(at_least: int) -> Callable[[str], bool]:
    """A predicate on stream stderr lines: a batch numbered at least ``at_least`` published files."""
    def pred(line: str) -> bool:
        parts = line.split()
        return (len(parts) > 2 and parts[0] == "batch" and parts[2] != "0"
                and int(parts[1].rstrip(":")) >= at_least)
    return pred
