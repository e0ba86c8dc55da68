"""``factstream logs parse|report`` as a user meets them: the installed executable in a subprocess.

Usage errors answer before the JVM starts, Java's notices stay hidden, the
progress bar ends full, damaged gzip inputs are named with where they broke
while the others are parsed, Ctrl-C leaves nothing half-written, and the
chart shows outages, gaps and backwards tokens.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import shutil
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, cli, no_traceback, require_spark_cli
from conftest import PG_HOST, PG_PORT, PG_USER

SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
#: A Java that does not exist: any command that started the JVM would fail on it, not with its usage error.
NO_JAVA = {"JAVA_HOME": "/nonexistent/java-home"}




def logs(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    return cli("logs", *args, timeout=timeout, **env)


def _ev(token: int) -> str:
    return f'["ev",["$e{token}:hs","!r:hs","m.room.message",null,null,null,null,false,false]]'


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


START = dt.datetime(2026, 11, 24, 10, 0, 0)


def outage_archive() -> tuple[str, dict[str, Any]]:
    """10 min of traffic, a 15 min outage, 10 min of traffic ending 20 s into a minute; one gap, one backwards token."""
    lines = []
    facts: dict[str, Any] = {}
    token = 0
    t = START
    for phase in range(2):
        for i in range(600 if phase == 0 else 620):
            token += 1
            if phase == 1 and i == 100:
                token += 5  # 5 tokens skipped: a gap
                facts["gap_at"] = t
            if phase == 1 and i == 300:
                lines.append(f"{_stamp(t)} > RDATA events master {token - 50} {_ev(token - 50)}")  # backwards
                facts["back_at"] = t
            lines.append(f"{_stamp(t)} > RDATA events master {token} {_ev(token)}")
            if i % 2 == 0:
                lines.append(f"{_stamp(t)} > RDATA events worker1 {token} {_ev(token)}")
            t += dt.timedelta(seconds=1)
        if phase == 0:
            t += dt.timedelta(minutes=15)
    facts["last"] = t - dt.timedelta(seconds=1)
    return "\n".join(lines) + "\n", facts


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The outage archive parsed once by the CLI (with the progress bar on)."""
    require_spark_cli("pandas", "matplotlib")
    root = tmp_path_factory.mktemp("outage")
    text, facts = outage_archive()
    (root / "in").mkdir()
    (root / "in" / "hs1-9092.20261124T100000000000Z.000000.log").write_text(text)
    out = root / "pq"
    done = logs("parse", str(root / "in"), "--out", str(out), "--progress", "always", *SPARK)
    assert done.returncode == 0, done.stderr
    return {"root": root, "out": out, "parse": done, **facts}


# --------------------------------------------------------- before the JVM


@pytest.mark.parametrize(
    "args, message",
    [
        (("parse", "{tmp}/nothing-*.log.gz", "--out", "{tmp}/o"), "no archive files found for: {tmp}/nothing-*.log.gz"),
        (("parse", "{tmp}/in", "--out", "{tmp}/exists"), "{tmp}/exists already exists; use --mode overwrite"),
        (("parse", "{tmp}/in", "--out", "{tmp}/no/such/dir/o"), "directory {tmp}/no/such/dir does not exist"),
        (("parse", "{tmp}/in", "--out", "{tmp}/o", "--conf", "nokeyvalue"), "--conf expects KEY=VALUE"),
        (("parse", "{tmp}/in", "--out", "{tmp}/o", "--chunk-mb", "-1"), "argument --chunk-mb: must be at least 0, got -1"),
        (("report", "{tmp}/missing"), "{tmp}/missing: no such directory"),
        (("report", "{tmp}/in"), "holds no Parquet files (archives?): parse them first with 'factstream logs parse"),
        (("report", "{tmp}/empty"), "{tmp}/empty holds no Parquet files: the 'logs parse' that wrote it found no lines"),
        (("report", "{tmp}/exists", "--bucket", "0"), "argument --bucket: must be at least 1, got 0"),
        (("report", "{tmp}/exists", "--log-scale"), "--by-writer and --log-scale shape the chart: add --chart PNG"),
        (("report", "{tmp}/exists", "--chart", "{tmp}/nodir/c.png"), "--chart {tmp}/nodir/c.png: directory"),
        (("report", "{tmp}/exists", "--capture-pattern", "(unclosed"), "capture"),
        (("stream", "--files", "{tmp}/missing", "--out", "{tmp}/o", "--checkpoint", "{tmp}/ck"),
         "--files {tmp}/missing: not a directory (the recorder's --dir)"),
        (("stream", "--db", "sqlite:///{tmp}/w.db", "--out", "{tmp}/o", "--checkpoint", "{tmp}/ck", "--streams", "nosuch"),
         "--streams nosuch: unknown stream(s) nosuch; known: caches, receipts, to_device"),
        (("stream", "--db", "sqlite:///{tmp}/w.db", "--out", "{tmp}/o", "--checkpoint", "{tmp}/ck", "--glob", "*.log"),
         "--glob only works with --files DIR"),
        (("stream", "--files", "{tmp}/in", "--out", "{tmp}/o", "--checkpoint", "{tmp}/ck", "--streams", "caches"),
         "--streams only works with --db URL"),
    ],
)
def test_usage_errors_answer_before_the_jvm_starts(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.log").write_text("2026-11-24T10:00:00Z > POSITION events master 1 2\n")
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "part-0.parquet").write_bytes(b"PAR1")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "w.db").write_bytes(b"")
    argv = [a.format(tmp=tmp_path) for a in args]
    began = time.monotonic()
    done = logs(*argv, *SPARK, timeout=60, **NO_JAVA)
    took = time.monotonic() - began
    # With JAVA_HOME pointing nowhere, a command that reached Spark would fail on Java instead.
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message.format(tmp=tmp_path) in done.stderr
    assert "java" not in done.stderr.lower() and "spark did not start" not in done.stderr.lower()
    assert done.stdout == "" and no_traceback(done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert took < 30  # generous: the JVM alone takes 5-9 s here, and it never starts
    assert not (tmp_path / "ck").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["missing-postgres-db", "empty-sqlite"])
def test_stream_from_a_database_without_the_tables_fails_before_the_jvm(tmp_path: Path, where: str) -> None:
    """The real reason, in one line, at once; the password masked; no checkpoint left to trip the next run."""
    if where == "missing-postgres-db":
        url = f"postgresql://{PG_USER}:s3cret@{PG_HOST}:{PG_PORT}/factstream_nosuchdb_x"
        reason = 'database "factstream_nosuchdb_x" does not exist'
    else:
        (tmp_path / "e.db").write_bytes(b"")
        url, reason = f"sqlite:///{tmp_path}/e.db", "has no usable table for stream(s) caches (demo_caches)"
    done = logs("stream", "--db", url, "--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "ck"),
                "--streams", "caches", *SPARK, timeout=60, **NO_JAVA)
    assert done.returncode == 1, done.stderr
    assert reason in done.stderr and done.stderr.startswith("factstream logs: ")
    assert len(done.stderr.strip().splitlines()) == 1 and no_traceback(done.stderr), done.stderr
    assert "s3cret" not in done.stdout + done.stderr and "java" not in done.stderr.lower()
    assert not (tmp_path / "ck").exists() and not (tmp_path / "o").exists()


def test_report_on_archives_suggests_parse(tmp_path: Path) -> None:
    (tmp_path / "archives").mkdir()
    with gzip.open(tmp_path / "archives" / "hs1.log.gz", "wt") as fh:
        fh.write("2026-11-24T10:00:00Z > POSITION events master 1 2\n")
    done = logs("report", str(tmp_path / "archives"), **NO_JAVA)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"factstream logs: {tmp_path}/archives holds no Parquet files (archives?): parse them first with "
        f"'factstream logs parse {tmp_path}/archives --out PARQUET_DIR', then report on PARQUET_DIR"
    )


# ------------------------------------------------------- quiet, and 100%


def test_parse_is_quiet_and_the_bar_ends_full(outage: dict[str, Any]) -> None:
    err = outage["parse"].stderr
    assert no_traceback(err)
    for noise in ("WARN", "log4j", "NativeCodeLoader", "Setting default log level", "SLF4J"):
        assert noise not in err, err
    # the tqdm bar's last state is complete: "parsing: 100%|...| N/N"
    last = err.replace("\r", "\n").split("\n")
    bars = [ln for ln in last if ln.startswith("parsing:")]
    assert bars, err
    final = bars[-1]
    assert "100%" in final, final
    done, total = final.split("|")[-1].split("[")[0].strip().split()[0].split("/")
    assert done == total
    lines = [ln for ln in last if ln.strip() and not ln.startswith("parsing:")]
    assert lines == [f"wrote 1831 lines (0 malformed) to {outage['out']}"], err


# ------------------------------------------------------- damaged gzip


def _good_lines(n: int, first_token: int = 1) -> str:
    return "".join(
        f"2026-11-24T10:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z > RDATA events master {first_token + i} {_ev(first_token + i)}\n"
        for i in range(n)
    )


def test_truncated_and_corrupt_gzip_are_named_and_the_rest_is_parsed(tmp_path: Path) -> None:
    require_spark_cli("pandas", "matplotlib")
    src = tmp_path / "in"
    src.mkdir()
    (src / "good.log.gz").write_bytes(gzip.compress(_good_lines(300).encode()))
    (src / "plain.log").write_text(_good_lines(200, 1000))
    whole = gzip.compress(_good_lines(40000, 5000).encode())
    (src / "truncated.log.gz").write_bytes(whole[: len(whole) // 2])
    broken = bytearray(gzip.compress(_good_lines(40000, 90000).encode()))
    mid = len(broken) // 2
    broken[mid: mid + 64] = bytes(64)
    (src / "corrupt.log.gz").write_bytes(bytes(broken))
    out = tmp_path / "pq"
    done = logs("parse", str(src), "--out", str(out), *SPARK)
    assert done.returncode == 2, done.stderr
    assert no_traceback(done.stderr)
    assert "ERROR" not in done.stderr and "Exception" not in done.stderr and "at org." not in done.stderr
    err_lines = done.stderr.strip().splitlines()
    assert len(err_lines) <= 5, done.stderr
    trunc = [ln for ln in err_lines if "truncated.log.gz" in ln]
    corrupt = [ln for ln in err_lines if "corrupt.log.gz" in ln]
    assert len(trunc) == 1 and "truncated gzip (the file ends inside a compressed member) after line " in trunc[0]
    assert len(corrupt) == 1 and "corrupt gzip" in corrupt[0]
    assert "2 of 4 inputs could not be read to their end" in done.stderr
    trunc_at = int(trunc[0].split("after line ")[1].split(";")[0])
    given = zlib.decompressobj(wbits=31).decompress(whole[: len(whole) // 2])  # everything before the cut
    assert trunc_at == given.count(b"\n") and 0 < trunc_at < 40000 and not given.endswith(b"\n")
    # what was parsed: all of the good inputs, and the damaged ones up to where they broke
    rep = logs("report", str(out), "--json", *SPARK)
    assert rep.returncode == 0, rep.stderr
    per_capture = {os.path.basename(c["capture"]): c["lines"] for c in json.loads(rep.stdout)["captures"]}
    assert per_capture["good.log.gz"] == 300 and per_capture["plain.log"] == 200
    assert per_capture["truncated.log.gz"] == trunc_at + 1  # and the line the cut cut short: a malformed row
    # deflate finds damage late (here at the CRC check); the lines before that point are kept, malformed or not
    corrupt_at = int(corrupt[0].split("after line ")[1].split(";")[0])
    assert per_capture["corrupt.log.gz"] == corrupt_at > 0


def test_inputs_that_hold_no_line_at_all_write_an_empty_result_not_an_error(tmp_path: Path) -> None:
    """A gzip file cut off inside its header is the only input: nothing to parse, and the output has no
    Parquet file. That used to end in "internal error: AnalysisException: [UNABLE_TO_INFER_SCHEMA]"."""
    require_spark_cli("pandas", "matplotlib")
    src = tmp_path / "in"
    src.mkdir()
    (src / "cut.log.gz").write_bytes(gzip.compress(_good_lines(10).encode())[:6])
    out = tmp_path / "pq"
    done = logs("parse", str(src), "--out", str(out), *SPARK)
    assert done.returncode == 2 and no_traceback(done.stderr), done.stderr
    assert "internal error" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert f"wrote 0 lines (0 malformed) to {out}" in done.stderr
    assert "cut.log.gz: truncated gzip" in done.stderr and "1 of 1 inputs could not be read to their end" in done.stderr
    rep = logs("report", str(out), *SPARK)
    assert rep.returncode == 2 and "found no lines" in rep.stderr and no_traceback(rep.stderr), rep.stderr


# ------------------------------------------------------------- Ctrl-C


def test_ctrl_c_exits_130_and_leaves_no_output(tmp_path: Path) -> None:
    require_spark_cli("pandas", "matplotlib")
    src = tmp_path / "in"
    src.mkdir()
    for k in range(4):
        (src / f"cap{k}.log").write_text(_good_lines(60000, k * 100000))
    out = tmp_path / "pq"
    proc = subprocess.Popen(
        [FACTSTREAM, "logs", "parse", str(src), "--out", str(out), "--chunk-mb", "0.5", "--master", "local[1]",
         "--conf", "spark.ui.enabled=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            staging = [p for p in tmp_path.iterdir() if p.name.startswith(".pq.factstream-tmp-")]
            if staging and any(staging[0].rglob("*")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground group gets it
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert no_traceback(err), err
    assert f"interrupted; nothing written to {out}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    again = logs("parse", str(src), "--out", str(out), "--header-only", *SPARK)
    assert again.returncode == 0, again.stderr
    assert "wrote 240000 lines" in again.stderr


def test_py4j_tracebacks_stay_out_of_what_the_cli_writes(capsys: pytest.CaptureFixture[str]) -> None:
    """py4j logs on loggers of its own (``py4j.clientserver``...), whose records only propagate to the root
    logger's handler: the filter ``logs parse`` installs (Ctrl-C cuts a py4j call short, and py4j logs its
    traceback) must drop those too, and nothing else."""
    import logging
    import sys

    from factstream.cli.logs import quiet_py4j

    root = logging.getLogger()
    saved = (root.handlers[:], root.filters[:], root.level)
    handler = logging.StreamHandler(sys.stderr)
    root.handlers[:] = [handler]
    try:
        quiet_py4j()
        for name in ("py4j.clientserver", "py4j.java_gateway", ""):
            log = logging.getLogger(name)
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                record = log.makeRecord(log.name, logging.ERROR, f"{os.sep}site-packages{os.sep}py4j{os.sep}x.py", 1,
                                        "Exception occurred while shutting down connection", (), sys.exc_info())
            log.handle(record)
        logging.getLogger("factstream.x").error("ours stays")
    finally:
        root.handlers[:], root.filters[:], _ = saved
        root.setLevel(saved[2])
    err = capsys.readouterr().err
    assert err == "ours stays\n"


# -------------------------------------------------------------- chart


def _bucket(t: dt.datetime) -> str:
    return t.replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_json_series_shows_the_outage_and_marks(outage: dict[str, Any], tmp_path: Path) -> None:
    chart = tmp_path / "rate.png"
    done = logs("report", str(outage["out"]), "--json", "--chart", str(chart), *SPARK)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ev = {s["writer"]: s for s in report["streams"]}["master"]
    series = ev["rows_per_second"]["series"]
    # 10 + 15 + 11 minutes, every one of them a point: the outage is 15 zeros, not a missing stretch
    assert len(series) == 36
    assert [r for _, r in series[10:25]] == [0] * 15
    assert series[0] == ["2026-11-24T10:00:00Z", 1.0]
    assert series[-1][0] == _bucket(outage["last"])
    # the archive ends 20 s into its last minute: the report says so
    assert report["last_bucket_seconds"] == 19.0
    kinds = {(m["kind"], m["writer"], m["ts"][:19]) for m in report["marks"]["sequence"]}
    assert ("gap", "master", outage["gap_at"].strftime("%Y-%m-%dT%H:%M:%S")) in kinds
    assert ("backwards", "master", outage["back_at"].strftime("%Y-%m-%dT%H:%M:%S")) in kinds
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "chart written to" in done.stderr


def test_capture_pattern_matching_no_file_is_refused(outage: dict[str, Any]) -> None:
    """A pattern that names no capture changes nothing: refused, not silently ignored."""
    done = logs("report", str(outage["out"]), "--capture-pattern", r"^(?P<capture>nomatch)-", *SPARK)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr.strip() == (
        f"factstream logs: --capture-pattern '^(?P<capture>nomatch)-' matches none of the file names in {outage['out']} "
        "(hs1-9092.20261124T100000000000Z.000000.log): fix it (it is searched in each base name; its capture "
        "group must not be empty) or leave it out"
    )


def test_chart_by_writer_and_log_scale(outage: dict[str, Any], tmp_path: Path) -> None:
    chart = tmp_path / "by-writer.png"
    done = logs("report", str(outage["out"]), "--chart", str(chart), "--by-writer", "--log-scale", *SPARK)
    assert done.returncode == 0, done.stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "streams (per writer):" in done.stdout
    # keep a copy for a person to look at
    keep = os.environ.get("FACTSTREAM_KEEP_CHARTS")
    if keep:
        shutil.copy(chart, keep)


def test_chart_of_an_archive_without_timestamps_is_a_message(tmp_path: Path) -> None:
    require_spark_cli("pandas", "matplotlib")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bare.log").write_text("".join(f"RDATA events master {t} {_ev(t)}\n" for t in range(1, 50)))
    out = tmp_path / "pq"
    quiet = logs("parse", str(tmp_path / "in"), "--out", str(out), "-v", *SPARK)
    assert quiet.returncode == 0, quiet.stderr
    assert "WARN" not in quiet.stderr  # -v is our INFO lines; Java's notices are tracebacks' kin: -vv
    loud = logs("parse", str(tmp_path / "in"), "--out", str(tmp_path / "pq2"), "-vv", *SPARK)
    assert loud.returncode == 0, loud.stderr
    assert "WARN" in loud.stderr  # -vv lets Java's notices through (hidden by default: test above)
    chart = tmp_path / "c.png"
    done = logs("report", str(out), "--chart", str(chart), *SPARK)
    assert done.returncode == 1
    assert "no chart drawn: no RDATA line has a timestamp" in done.stderr
    assert not chart.exists()
    assert "49 lines, 0 malformed" in done.stdout  # the report itself is still printed


def test_stream_that_fails_in_its_first_batch_leaves_no_checkpoint(tmp_path: Path) -> None:
    """A row the reader cannot decode fails batch 0: one line, exit 1, and no checkpoint that recorded nothing."""
    import sqlite3

    require_spark_cli("pandas", "matplotlib")
    db = tmp_path / "w.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE demo_caches (stream_id BIGINT, instance_name TEXT, cache_func TEXT, keys TEXT, "
                     "invalidation_ts TEXT)")
        conn.execute("INSERT INTO demo_caches VALUES (1, 'master', 'notjson', '[', 1)")
        conn.execute("CREATE TABLE stream_positions (stream_name TEXT, instance_name TEXT, stream_id BIGINT)")
        conn.execute("INSERT INTO stream_positions VALUES ('caches', 'master', 1)")
    done = logs("stream", "--db", f"sqlite:///{db}", "--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "ck"),
                "--streams", "caches", "--stop-when-idle", "3", *SPARK, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "factstream logs: the streaming query failed: " in done.stderr and no_traceback(done.stderr), done.stderr
    assert not (tmp_path / "ck").exists()
