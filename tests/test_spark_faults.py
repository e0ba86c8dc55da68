"""`factstream logs stream` and `logs parse` on a cluster, under the faults an operator meets.

Each case runs the installed executable against real services: a writer's
PostgreSQL database that stops accepting connections mid-stream, a
checkpoint deleted while the output keeps its facts, and a standalone Spark
master with no worker. Counts are compared with the database row for row.
Slow (each case starts Spark); runs under CI=true, where a missing Java,
pyspark or PostgreSQL fails instead of skipping.
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

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning")]

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
SPARK = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=768m"]


def _require_spark() -> None:
    problems = [f"{m} is not installed" for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        problems.append("Java is not installed (apt-get install openjdk-17-jre-headless)")
    if problems:
        if IN_CI:
            pytest.fail("; ".join(problems) + " (CI=true: Spark tests must run)")
        pytest.skip("; ".join(problems))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


class Proc:
    """A subprocess in its own process group whose stderr lines are collected."""

    def __init__(self, args: list[str]) -> None:
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
                                  start_new_session=True)
        self.lines: list[str] = []
        assert self.p.stderr is not None
        pipe = self.p.stderr
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

    def finish(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout=timeout)
        finally:
            self.t.join(timeout=10)

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(timeout=30)


def _produce(dsn: str, seconds: float, seed: int) -> None:
    """Run a real writer for ``seconds``, then stop it (SIGTERM: it records its positions and exits 0)."""
    writer = subprocess.Popen([FACTSTREAM, "serve", "--produce", "--db", dsn, "--port", "0", "--rate", "200",
                               "--duration", str(seconds), "--seed", str(seed)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        time.sleep(seconds + 2)
        writer.send_signal(signal.SIGTERM)
        _, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=30)
    assert writer.returncode == 0, err


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

    table = pq.read_table(path, columns=["stream", "instance", "token", "row"])
    out: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
    for r in table.to_pylist():
        out[(str(r["stream"]), r["instance"], r["token"], json.dumps(json.loads(r["row"]), sort_keys=True))] += 1
    return out


def _allow_connections(dsn: str, allow: bool) -> None:
    """Open or close the test's own database to new connections (the shared server keeps running)."""
    import psycopg

    name = dsn.rsplit("/", 1)[1].split("?")[0]
    admin = dsn.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:  # and no connection left over: the next query must connect anew
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


@pytest.mark.postgres
def test_stream_rides_out_a_database_outage_and_refuses_a_lost_checkpoint(postgres_dsn: str, tmp_path: Path) -> None:
    """A database closed for some seconds pauses the query (exact counts after); a new checkpoint on the same
    output is refused (it would stream every fact again) instead of silently writing duplicates."""
    _require_spark()
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    _produce(postgres_dsn, 2, seed=5)
    cmd = [FACTSTREAM, "logs", "stream", "--db", postgres_dsn, "--out", out, "--checkpoint", ck, "--trigger", "0.5",
           "--stop-when-idle", "12", *SPARK]
    job = Proc(cmd)
    try:
        job.wait_for(lambda line: line.startswith("batch 0:"), 300)
        _allow_connections(postgres_dsn, False)
        time.sleep(6)  # a dozen triggers while the database refuses every connection
        _allow_connections(postgres_dsn, True)
        _produce(postgres_dsn, 2, seed=6)  # facts written after the outage must arrive too
        rc = job.finish(300)
    finally:
        _allow_connections(postgres_dsn, True)
        job.kill()
    assert rc == 0, "".join(job.lines[-40:])
    want = _db_rows(postgres_dsn)
    assert sum(want.values()) > 300
    assert _parquet_rows(out) == want  # nothing lost, nothing twice

    # the checkpoint is lost (deleted while the output stays): a new one would stream every fact again
    shutil.rmtree(ck)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 2, again.stderr  # refused before the query starts: the user's to fix
    assert "a second time" in again.stderr and f"--checkpoint {ck}" in again.stderr, again.stderr
    assert "the streaming query failed" not in again.stderr
    assert "Traceback" not in again.stderr
    assert _parquet_rows(out) == want  # the output is as it was


def test_a_cluster_without_workers_fails_in_bounded_time_and_leaves_the_master(tmp_path: Path) -> None:
    """No worker alive: Spark itself queues the job forever ("Initial job has not accepted any resources",
    in its own log only); logs parse must say so and exit, and its application must leave the master."""
    _require_spark()
    from factstream.spark.cluster import start_standalone

    archive = tmp_path / "a.log"
    archive.write_bytes(b"RDATA events master 1 [\"$e1\",\"!r:x\",null,null,null,null,null]\n")
    cluster = start_standalone(str(tmp_path / "cluster"), workers=0)
    try:
        job = subprocess.Popen(
            [FACTSTREAM, "logs", "parse", f"file://{archive}", "--out", str(tmp_path / "pq"), "--master", cluster.url,
             "--conf", "spark.ui.enabled=false", "--conf", "spark.factstream.executorTimeout=10s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
        try:
            _, err = job.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)
            raise AssertionError("logs parse still waited for executors after 150 s") from None
        assert job.returncode == 2, err
        assert "no executor joined within 10 s" in err and "start workers" in err, err
        assert "Traceback" not in err and not (tmp_path / "pq").exists()
        apps = cluster.state()
        assert not apps.get("activeapps"), apps  # the application was stopped, not left waiting
    finally:
        cluster.stop()


def test_file_stream_refuses_a_lost_checkpoint_and_an_unwritable_one(tmp_path: Path) -> None:
    """--files with a new checkpoint on an output that holds the files already would parse them all again;
    a checkpoint that cannot be written is said to be so, not as Spark's "error occurred while calling o64.start"."""
    _require_spark()
    import gzip

    captures = tmp_path / "captures"
    captures.mkdir()
    with gzip.open(captures / "hs1-9092.20261124T110000000000Z.000000.log.gz", "wb") as fh:
        for tok in range(1, 51):
            fh.write(b"2026-11-24T11:00:%02d.000Z > POSITION events master %d %d\n" % (tok, tok - 1, tok))
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", out, "--checkpoint", ck,
           "--trigger", "0.5", "--stop-when-idle", "3", *SPARK]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert first.returncode == 0, first.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(out).num_rows == 50
    shutil.rmtree(ck)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 2 and "a second time" in again.stderr, again.stderr
    assert f"--checkpoint {ck}" in again.stderr and "Traceback" not in again.stderr
    assert pq.read_table(out).num_rows == 50
    # a checkpoint that cannot be written is named before the query starts (Spark: "error ... calling o64.start")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    bad_cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", str(tmp_path / "pq2"),
               "--checkpoint", str(blocker / "ck"), "--stop-when-idle", "3", *SPARK]
    bad = subprocess.run(bad_cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert bad.returncode == 2, bad.stderr
    assert f"cannot write the checkpoint directory {blocker / 'ck'}" in bad.stderr, bad.stderr
    assert "Not a directory" in bad.stderr and "Traceback" not in bad.stderr
