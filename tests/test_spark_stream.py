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
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_run import FACTSTREAM, require_spark_cli
from spark_stream_run import SPARK, Proc, data_batch, db_rows, parquet_rows, stream_env

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.postgres,
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def test_stream_killed_and_restarted_matches_the_writers_database(postgres_dsn: str, tmp_path: Path) -> None:
    require_spark_cli()
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    stream_cmd = [FACTSTREAM, "logs", "stream", "--db", postgres_dsn, "--out", out, "--checkpoint", ck,
                  "--trigger", "0.5", *SPARK]
    # the writer produces until told to stop (SIGTERM: it stops producing, records its positions and exits)
    writer = Proc([FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", "100",
                   "--seed", "3", "--status"], stream="stdout")
    first = second = None
    try:
        writer.wait_for(lambda line: '"listening"' in line, 60)
        first = Proc(stream_cmd)
        # a few batches with data published, then the whole query dies at once (driver, JVM, Python workers)
        first.wait_for(data_batch(2), 600)
        first.killpg(signal.SIGKILL)
        first.p.wait(timeout=60)
        time.sleep(3)  # the writer goes on meanwhile
        second = Proc([*stream_cmd, "--stop-when-idle", "10"])
        second.wait_for(data_batch(0), 600)  # resumed while the writer still writes
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
    want = db_rows(postgres_dsn)
    got = parquet_rows(out)
    assert sum(want.values()) > 300, json.loads(produced)
    assert got == want  # same rows, each as often: nothing lost, nothing twice
    # the second run resumed from the checkpoint: its first batch id continues the first run's
    batches = [int(line.split()[1].rstrip(":")) for line in second.lines if line.startswith("batch ")]
    assert batches and batches[0] >= 2
    # logs report reads the streamed output like a parsed one
    rep = subprocess.run([FACTSTREAM, "logs", "report", out, "--json", *SPARK], capture_output=True, text=True,
                         timeout=600, env=stream_env())
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
    require_spark_cli()
    captures, out, ck = tmp_path / "captures", str(tmp_path / "pq"), str(tmp_path / "ck")
    captures.mkdir()
    import gzip

    with gzip.open(captures / "notes.log.gz", "wb") as fh:  # a closed file in no known format: skipped, warned
        fh.write(b"not a replication archive\n")
    stream_cmd = [FACTSTREAM, "logs", "stream", "--files", str(captures), "--out", out, "--checkpoint", ck,
                  "--trigger", "0.5", *SPARK]
    writer = Proc([FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", "100",
                   "--seed", "5", "--status"], stream="stdout")
    recorder = first = second = None
    try:
        port = json.loads(writer.wait_for(lambda line: '"listening"' in line, 60))["port"]
        recorder = Proc([FACTSTREAM, "record", f"127.0.0.1:{port}", "--dir", str(captures), "--name", "w1",
                         "--rotate-time", "1s", "--flush-interval", "0.5s"])
        first = Proc(stream_cmd)
        first.wait_for(data_batch(2), 600)
        first.killpg(signal.SIGKILL)
        first.p.wait(timeout=60)
        time.sleep(3)  # the recorder closes more files meanwhile
        second = Proc([*stream_cmd, "--stop-when-idle", "8"])
        second.wait_for(data_batch(0), 600)
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
