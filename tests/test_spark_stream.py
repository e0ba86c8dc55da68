"""`factstream logs stream`: a writer's facts streamed into Parquet exactly once, across a crash.

A real writer (`factstream serve --produce` on PostgreSQL, with rollbacks,
holes and multi-row tokens) produces facts while the streaming query runs on
local Spark; the query's whole process group is SIGKILLed mid-stream and
started again on the same checkpoint. At the end the Parquet output holds
exactly the rows of the writer's tables: none lost, none twice. Slow; runs
under CI=true (a missing PostgreSQL or Java fails there).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import IN_CI

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.postgres,
              pytest.mark.filterwarnings("ignore::ResourceWarning")]

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")


def _require_spark() -> None:
    problems = [f"{m} is not installed" for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        problems.append("Java is not installed (apt-get install openjdk-17-jre-headless)")
    if problems:
        if IN_CI:
            pytest.fail("; ".join(problems) + " (CI=true: Spark tests must run)")
        pytest.skip("; ".join(problems))


class Proc:
    """A subprocess in its own process group whose stderr (or stdout) lines are collected."""

    def __init__(self, args: list[str], stream: str = "stderr") -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        self.p = subprocess.Popen(
            args, stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
            text=True, env=env, start_new_session=True,
        )
        self.lines: list[str] = []
        pipe = self.p.stderr if stream == "stderr" else self.p.stdout
        assert pipe is not None
        self.t = threading.Thread(target=lambda: self.lines.extend(iter(pipe.readline, "")), daemon=True)
        self.t.start()

    def wait_for(self, pred: Any, timeout: float) -> str:
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

    def killpg(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass


def _db_rows(dsn: str) -> collections.Counter[tuple[str, str, int, str]]:
    import psycopg

    from factstream.demo.tables import DEMO_TABLES

    out: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
    with psycopg.connect(dsn) as conn:
        for t in DEMO_TABLES:
            for row in conn.execute(f"SELECT stream_id, instance_name, {', '.join(t.columns)} FROM {t.table}"):
                out[(t.stream, row[1], int(row[0]), json.dumps(t.to_row(tuple(row[2:])), sort_keys=True))] += 1
    return out


def _parquet_rows(path: str) -> collections.Counter[tuple[str, str, int, str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["stream", "instance", "token", "row", "command", "error"])
    out: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
    for r in table.to_pylist():
        assert r["command"] == "RDATA" and r["error"] is None, r
        out[(str(r["stream"]), r["instance"], r["token"], json.dumps(json.loads(r["row"]), sort_keys=True))] += 1
    return out


def _data_batch(at_least: int) -> Any:
    """A predicate on stream stderr lines: a batch numbered at least ``at_least`` published files."""
    def pred(line: str) -> bool:
        parts = line.split()
        return (len(parts) > 2 and parts[0] == "batch" and parts[2] != "0"
                and int(parts[1].rstrip(":")) >= at_least)
    return pred


def test_stream_killed_and_restarted_matches_the_writers_database(postgres_dsn: str, tmp_path: Path) -> None:
    _require_spark()
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    spark_args = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=768m"]
    stream_cmd = [FACTSTREAM, "logs", "stream", "--db", postgres_dsn, "--out", out, "--checkpoint", ck,
                  "--trigger", "0.5", *spark_args]
    # the writer produces until told to stop (SIGTERM: it stops producing, records its positions and exits)
    writer = Proc([FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", "100",
                   "--seed", "3", "--status"], stream="stdout")
    first = second = None
    try:
        writer.wait_for(lambda line: '"listening"' in line, 60)
        first = Proc(stream_cmd)
        # a few batches with data published, then the whole query dies at once (driver, JVM, Python workers)
        first.wait_for(_data_batch(2), 600)
        first.killpg(signal.SIGKILL)
        first.p.wait(timeout=60)
        time.sleep(3)  # the writer goes on meanwhile
        second = Proc([*stream_cmd, "--stop-when-idle", "10"])
        second.wait_for(_data_batch(0), 600)  # resumed while the writer still writes
        time.sleep(3)
        writer.killpg(signal.SIGTERM)
        assert writer.p.wait(timeout=60) == 0
        produced = writer.wait_for(lambda line: '"produced"' in line, 10)
        assert second.p.wait(timeout=600) == 0, "".join(second.lines[-60:])
    finally:
        for proc in (first, second, writer):
            if proc is not None and proc.p.poll() is None:
                proc.killpg(signal.SIGKILL)
                proc.p.wait(timeout=30)
    want = _db_rows(postgres_dsn)
    got = _parquet_rows(out)
    assert sum(want.values()) > 300, json.loads(produced)
    assert got == want  # same rows, each as often: nothing lost, nothing twice
    # the second run resumed from the checkpoint: its first batch id continues the first run's
    batches = [int(line.split()[1].rstrip(":")) for line in second.lines if line.startswith("batch ")]
    assert batches and batches[0] >= 2
    # logs report reads the streamed output like a parsed one
    rep = subprocess.run([FACTSTREAM, "logs", "report", out, "--json", *spark_args], capture_output=True, text=True,
                         timeout=600, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["lines"] == sum(want.values()) and report["malformed"] == 0
    assert {s["stream"] for s in report["streams"]} == {k[0] for k in want}
    assert all(s["backwards"] == 0 for s in report["streams"])


def _file_lines(directory: Path) -> collections.Counter[tuple[str, int, str]]:
    """(file name, line number, line) of every closed capture file: what the stream must hold, once each."""
    import gzip

    out: collections.Counter[tuple[str, int, str]] = collections.Counter()
    for path in sorted(directory.glob("w1.*.log.gz")):
        with gzip.open(path, "rb") as fh:
            for number, line in enumerate(fh.read().split(b"\n")[:-1], 1):
                out[(path.name, number, line.decode())] += 1
    return out


def test_file_stream_over_recorder_files_killed_and_restarted_holds_each_closed_file_once(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """`logs stream --files`: `factstream record` rotates closed files while the stream runs; crash; restart."""
    _require_spark()
    captures, out, ck = tmp_path / "captures", str(tmp_path / "pq"), str(tmp_path / "ck")
    captures.mkdir()
    import gzip

    with gzip.open(captures / "notes.log.gz", "wb") as fh:  # a closed file in no known format: skipped, warned
        fh.write(b"not a replication archive\n")
    spark_args = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=768m"]
    stream_cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", out, "--checkpoint", ck,
                  "--trigger", "0.5", *spark_args]
    writer = Proc([FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", "100",
                   "--seed", "5", "--status"], stream="stdout")
    recorder = first = second = None
    try:
        port = json.loads(writer.wait_for(lambda line: '"listening"' in line, 60))["port"]
        recorder = Proc([FACTSTREAM, "record", f"127.0.0.1:{port}", "--dir", str(captures), "--name", "w1",
                         "--rotate-time", "1s", "--flush-interval", "0.5s"])
        first = Proc(stream_cmd)
        first.wait_for(_data_batch(2), 600)
        first.killpg(signal.SIGKILL)
        first.p.wait(timeout=60)
        time.sleep(3)  # the recorder closes more files meanwhile
        second = Proc([*stream_cmd, "--stop-when-idle", "8"])
        second.wait_for(_data_batch(0), 600)
        recorder.killpg(signal.SIGTERM)  # closes (renames) its last file
        assert recorder.p.wait(timeout=60) == 0, "".join(recorder.lines[-30:])
        assert second.p.wait(timeout=600) == 0, "".join(second.lines[-60:])
    finally:
        for proc in (first, second, recorder, writer):
            if proc is not None and proc.p.poll() is None:
                proc.killpg(signal.SIGKILL)
                proc.p.wait(timeout=30)
    import pyarrow.parquet as pq

    want = _file_lines(captures)
    assert len({name for name, _, _ in want}) >= 3, sorted(os.listdir(captures))  # rotated: several closed files
    assert not list(captures.glob("*.part"))
    table = pq.read_table(out, columns=["source_file", "line_number"]).to_pylist()
    got = collections.Counter((os.path.basename(r["source_file"]), r["line_number"]) for r in table)
    assert got == collections.Counter((name, number) for name, number, _ in want)  # every line of every closed file, once: nothing lost, nothing twice
    assert any("notes.log.gz" in line and "not detected" in line for line in first.lines + second.lines)
    batches = [int(line.split()[1].rstrip(":")) for line in second.lines if line.startswith("batch ")]
    assert batches and batches[0] >= 2  # resumed from the checkpoint
