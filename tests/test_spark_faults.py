"""`factstream logs stream` and `logs parse` on a cluster, under the faults an operator meets.

Each case runs the installed executable against real services: a writer's
PostgreSQL database that stops accepting connections mid-stream, a
checkpoint deleted while the output keeps its facts, a standalone Spark
master with no worker, queries of other sources (SQLite writers, closed
files) sharing one output, and a file read while its last line is still
being written. Counts are compared with the databases row for row.
Slow (each case starts Spark); runs under CI=true, where a missing Java,
pyspark or PostgreSQL fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_run import FACTSTREAM, require_spark_cli
from spark_stream_run import SPARK, Proc, db_rows, parquet_rows, produce, run_stream, stream_env

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning")]


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
    require_spark_cli()
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    produce(postgres_dsn, 2, seed=5)
    cmd = [FACTSTREAM, "logs", "stream", "--db", postgres_dsn, "--out", out, "--checkpoint", ck, "--trigger", "0.5",
           "--stop-when-idle", "12", *SPARK]
    job = Proc(cmd)
    try:
        job.wait_for(lambda line: line.startswith("batch 0:"), 300)
        _allow_connections(postgres_dsn, False)
        time.sleep(6)  # a dozen triggers while the database refuses every connection
        _allow_connections(postgres_dsn, True)
        produce(postgres_dsn, 2, seed=6)  # facts written after the outage must arrive too
        rc = job.finish(300)
    finally:
        _allow_connections(postgres_dsn, True)
        job.kill()
    assert rc == 0, "".join(job.lines[-40:])
    want = db_rows(postgres_dsn)
    assert sum(want.values()) > 300
    assert parquet_rows(out) == want  # nothing lost, nothing twice

    # the checkpoint is lost (deleted while the output stays): a new one would stream every fact again
    shutil.rmtree(ck)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=stream_env())
    assert again.returncode == 2, again.stderr  # refused before the query starts: the user's to fix
    assert "a second time" in again.stderr and f"--checkpoint {ck}" in again.stderr, again.stderr
    assert "the streaming query failed" not in again.stderr
    assert "Traceback" not in again.stderr
    assert parquet_rows(out) == want  # the output is as it was


def test_a_cluster_without_workers_fails_in_bounded_time_and_leaves_the_master(tmp_path: Path) -> None:
    """No worker alive: Spark itself queues the job forever ("Initial job has not accepted any resources",
    in its own log only); logs parse must say so and exit, and its application must leave the master."""
    require_spark_cli()
    from factstream.spark.cluster import start_standalone

    archive = tmp_path / "a.log"
    archive.write_bytes(b"RDATA events master 1 [\"$e1\",\"!r:x\",null,null,null,null,null]\n")
    cluster = start_standalone(str(tmp_path / "cluster"), workers=0)
    try:
        job = subprocess.Popen(
            [FACTSTREAM, "logs", "parse", f"file://{archive}", "--out", str(tmp_path / "pq"), "--master", cluster.url,
             "--conf", "spark.ui.enabled=false", "--conf", "spark.factstream.executorTimeout=10s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stream_env(), start_new_session=True)
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
    require_spark_cli()
    import gzip

    captures = tmp_path / "captures"
    captures.mkdir()
    with gzip.open(captures / "hs1-9092.20261124T110000000000Z.000000.log.gz", "wb") as fh:
        for tok in range(1, 51):
            fh.write(b"2026-11-24T11:00:%02d.000Z > POSITION events master %d %d\n" % (tok, tok - 1, tok))
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", out, "--checkpoint", ck,
           "--trigger", "0.5", "--stop-when-idle", "3", *SPARK]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=stream_env())
    assert first.returncode == 0, first.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(out).num_rows == 50
    shutil.rmtree(ck)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=stream_env())
    assert again.returncode == 2 and "a second time" in again.stderr, again.stderr
    assert f"--checkpoint {ck}" in again.stderr and "Traceback" not in again.stderr
    assert pq.read_table(out).num_rows == 50
    # a checkpoint that cannot be written is named before the query starts (Spark: "error ... calling o64.start")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    bad_cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", str(tmp_path / "pq2"),
               "--checkpoint", str(blocker / "ck"), "--stop-when-idle", "3", *SPARK]
    bad = subprocess.run(bad_cmd, capture_output=True, text=True, timeout=300, env=stream_env())
    assert bad.returncode == 2, bad.stderr
    assert f"cannot write the checkpoint directory {blocker / 'ck'}" in bad.stderr, bad.stderr
    assert "Not a directory" in bad.stderr and "Traceback" not in bad.stderr


def test_queries_sharing_an_output_delete_only_their_own_files(tmp_path: Path) -> None:
    """Two writers' databases and a directory of closed files streamed into one --out by three queries, each
    with its own checkpoint (other sources: allowed). Each query's batch 0 deleted every batch-0 file in the
    output (part-b000000000000-*), so only the last query's rows were left. A batch Spark runs again (its
    commit record lost, as in a crash after the files were published) replaces its own files and no others."""
    require_spark_cli()
    import gzip

    import pyarrow.parquet as pq

    db1, db2 = (f"sqlite:///{tmp_path / name}.sqlite" for name in ("w1", "w2"))
    produce(db1, 2, seed=1)
    produce(db2, 2, seed=2)
    captures = tmp_path / "captures"
    captures.mkdir()
    with gzip.open(captures / "hs1-9092.20261124T110000000000Z.000000.log.gz", "wb") as fh:
        for tok in range(1, 41):
            fh.write(b"2026-11-24T11:00:%02d.000Z > POSITION events hs1 %d %d\n" % (tok, tok - 1, tok))
    out = str(tmp_path / "pq")

    def stream(source: list[str], checkpoint: str) -> str:
        done = run_stream(*source, "--out", out, "--checkpoint", str(tmp_path / checkpoint), "--trigger", "0.5",
                          "--stop-when-idle", "3")
        assert done.returncode == 0 and "batch 0: " in done.stderr, done.stderr
        return done.stderr

    def holds_every_query_once() -> None:
        assert parquet_rows(out, db1 + "#") == want1
        assert parquet_rows(out, db2 + "#") == want2
        table = pq.read_table(out, columns=["source_file", "line_number", "error"]).to_pylist()
        lines = sorted(r["line_number"] for r in table if not r["source_file"].startswith("sqlite:"))
        assert lines == list(range(1, 41))

    stream(["--db", db1], "ck1")
    stream(["--db", db2], "ck2")
    stream(["--files", str(captures)], "ck3")
    want1, want2 = db_rows(db1), db_rows(db2)
    assert sum(want1.values()) > 100 and sum(want2.values()) > 100
    holds_every_query_once()
    commits = tmp_path / "ck1" / "query" / "commits"
    last = max(int(name) for name in os.listdir(commits) if name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    assert f"batch {last}: " in stream(["--db", db1], "ck1")  # run again: its earlier files replaced
    holds_every_query_once()


def test_a_file_read_while_cut_mid_line_is_a_malformed_row_the_stream_names(tmp_path: Path) -> None:
    """--files whose --glob matches a file still being written: its last line, without its newline yet
    ("POSITION events master 10 12" of ... 123), is a malformed row (never token 12), counted in the batch's
    line, and a warning names the file (a file stream reads each file once)."""
    require_spark_cli()
    import pyarrow.parquet as pq

    from factstream.spark.formats import ENDS_MID_LINE

    captures = tmp_path / "captures"
    captures.mkdir()
    growing = captures / "tcp-hs1.log"
    cut = "2026-11-24T11:00:11.000Z > POSITION events master 10 12"
    growing.write_text("".join(f"2026-11-24T11:00:{tok:02d}.000Z > POSITION events master {tok - 1} {tok}\n"
                               for tok in range(1, 11)) + cut)
    out = str(tmp_path / "pq")
    done = run_stream("--files", str(captures), "--glob", "*.log", "--out", out, "--checkpoint",
                      str(tmp_path / "ck"), "--trigger", "0.5", "--stop-when-idle", "3")
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(out, columns=["line_number", "command", "token", "error", "raw"]).to_pylist()
    assert sorted(r["line_number"] for r in rows) == list(range(1, 12))
    assert [r for r in rows if r["error"] is not None] == [
        {"line_number": 11, "command": None, "token": None, "error": ENDS_MID_LINE, "raw": cut}]
    assert "batch 0: " in done.stderr and "11 lines (1 malformed)" in done.stderr, done.stderr
    assert f"{growing} ends mid-line" in done.stderr and "closed files only" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
