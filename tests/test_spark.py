"""The Spark pipeline in local mode: every column of every line, Parquet layout, the report.

One SparkSession (local[2], UI off) serves the whole module. Without Java or
pyspark these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from factstream import wire
from factstream.errors import ProtocolError

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


_spec = importlib.util.spec_from_file_location("spark_archives", Path(__file__).with_name("spark_archives.py"))
assert _spec and _spec.loader
spark_archives = importlib.util.module_from_spec(_spec)
sys.modules["spark_archives"] = spark_archives
_spec.loader.exec_module(spark_archives)

EV_FIELDS = ["event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership", "rejected", "outlier"]
STATE_FIELDS = ["room_id", "type", "state_key", "event_id"]


def _require_spark() -> None:
    for mod in ("pyspark", "pyarrow", "pandas"):
        require(module=mod, how="pip install 'factstream[spark]' (make install)")
    if not os.environ.get("JAVA_HOME"):
        require(binary="java", how="apt-get install openjdk-17-jre-headless (make prerequisites), or set JAVA_HOME")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession shared by every Spark test."""
    _require_spark()
    from factstream.spark.session import make_session

    session = make_session(
        "local[2]",
        app_name="factstream-tests",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        },
        log_level="ERROR",
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[Any]]]:
    root = str(tmp_path_factory.mktemp("archives"))
    return root, spark_archives.write_archives(root, seed=7, count=400)


def expected_columns(exp: Any) -> dict[str, Any]:
    """What one line must look like, worked out from wire.parse_line on its payload."""
    cols: dict[str, Any] = dict.fromkeys(
        ["command", "stream", "instance", "token", "prev_token", "row", "data", "error", "raw", "ev_kind",
         "ev_event_id", "ev_room_id", "ev_type", "ev_state_key", "ev_redacts", "ev_relates_to", "ev_membership",
         "ev_rejected", "ev_outlier", "cache_func", "cache_keys", "cache_invalidation_ts"]
    )
    cols["direction"] = exp.direction
    cols["channel"] = exp.channel
    if exp.error:
        cols["error"] = "not a redis-cli MONITOR line"
        cols["raw"] = exp.payload.decode()
        return cols
    try:
        cmd = wire.parse_line(exp.payload)
    except ProtocolError as err:
        cols["error"] = str(err)
        cols["raw"] = exp.payload.decode("utf-8", "replace")
        return cols
    cols["command"] = cmd.NAME
    if isinstance(cmd, wire.RdataCommand):
        cols.update(stream=cmd.stream_name, instance=cmd.instance_name, token=cmd.token)
        cols["row"] = exp.payload.decode().split(" ", 4)[4]
        row = cmd.row
        if cmd.stream_name == "events":
            kind, data = row
            cols["ev_kind"] = kind
            fields = {"ev": EV_FIELDS, "state": STATE_FIELDS, "state-all": ["room_id"]}[kind]
            for name, value in zip(fields, data):
                cols[f"ev_{name}"] = value
        elif cmd.stream_name == "caches":
            func, keys, ts = row
            cols["cache_func"] = func
            cols["cache_keys"] = None if keys is None else [k if isinstance(k, str) else json.dumps(k) for k in keys]
            cols["cache_invalidation_ts"] = ts
    elif isinstance(cmd, wire.PositionCommand):
        cols.update(stream=cmd.stream_name, instance=cmd.instance_name, token=cmd.new_token, prev_token=cmd.prev_token)
    elif isinstance(cmd, wire.FederationAckCommand):
        cols.update(instance=cmd.instance_name, token=cmd.token)
    else:
        parts = exp.payload.decode().split(" ", 1)
        cols["data"] = parts[1] if len(parts) == 2 else None
    return cols


def expected_ts(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    if text.replace(".", "").isdigit():
        return dt.datetime.fromtimestamp(float(text), dt.timezone.utc).replace(tzinfo=None)
    value = dt.datetime.fromisoformat(text.replace(",", ".").replace("Z", "+00:00"))
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None)


def test_every_column_of_every_line(spark: Any, archives: tuple[str, dict[str, list[Any]]]) -> None:
    from factstream.spark.pipeline import parse_archives

    root, expected = archives
    # tiny chunks, sized for 1000 cores: plain files are cut in many places, line numbers must still be exact
    df = parse_archives(spark, [root], chunk_bytes=3000, parallelism=1000)
    got = {(r["source_file"], r["line_number"]): r.asDict() for r in df.collect()}
    want_keys = {(path, e.line_number) for path, exps in expected.items() for e in exps}
    assert set(got) == want_keys
    checked = errors = 0
    for path, exps in expected.items():
        for exp in exps:
            row = got[(path, exp.line_number)]
            want = expected_columns(exp)
            for name, value in want.items():
                actual = row[name]
                assert actual == value, (path, exp.line_number, name, actual, value)
            ts = expected_ts(exp.ts)
            assert row["ts"] == ts, (path, exp.line_number, row["ts"], exp.ts)
            assert row["date"] == (ts.date() if ts else None)
            checked += 1
            errors += want["error"] is not None
    assert checked > 1500 and errors > 50  # every format, and malformed lines among them


def test_files_are_cut_only_as_far_as_the_cores_need(spark: Any, archives: tuple[str, dict[str, list[Any]]],
                                                     tmp_path: Path) -> None:
    from factstream.spark.pipeline import parse_archives, plan

    root, _ = archives
    sc = spark.sparkContext
    # the session's two cores: fewer chunks than for 1000 cores, the same rows
    cut, sized = plan(spark, [root], chunk_bytes=3000, parallelism=1000), plan(spark, [root], chunk_bytes=3000)
    assert len({r[0] for r in sized}) < len(sized) < len(cut)
    key = ["source_file", "line_number"]
    assert parse_archives(spark, [root], chunk_bytes=3000).sort(key).collect() == parse_archives(
        spark, [root], chunk_bytes=3000, parallelism=1000).sort(key).collect()
    # eight equal files, two cores: one task per file, and no job counting lines before the parse
    for i in range(8):
        (tmp_path / f"cap{i}.log").write_text("".join(f"PING {100000 + i * 1000 + k}\n" for k in range(200)))  # 12-byte lines
    jobs = len(sc.statusTracker().getJobIdsForGroup())
    rows = plan(spark, [str(tmp_path)], chunk_bytes=100)
    assert [(r[1], r[2] == r[3]) for r in rows] == [(0, True)] * 8
    assert len(sc.statusTracker().getJobIdsForGroup()) == jobs
    rows = plan(spark, [str(tmp_path)], chunk_bytes=100, parallelism=8)  # 16 chunks: a count job numbers them
    assert len(rows) == 16 and len(sc.statusTracker().getJobIdsForGroup()) == jobs + 1
    assert [r[4] for r in rows[:2]] == [0, 100]
    # more chunks than two per core: several go into one Python task, and the rows are the same
    one_core = parse_archives(spark, [str(tmp_path)], chunk_bytes=100, parallelism=1)
    many = parse_archives(spark, [str(tmp_path)], chunk_bytes=100, parallelism=8)
    assert one_core.rdd.getNumPartitions() == 2 and many.rdd.getNumPartitions() == 16
    got = one_core.sort(key).collect()
    assert got == many.sort(key).collect() and len(got) == 1600


def test_formats_named_explicitly_and_header_only(spark: Any, archives: tuple[str, dict[str, list[Any]]]) -> None:
    from factstream.spark.lines import ParseOptions
    from factstream.spark.pipeline import parse_archives

    root, expected = archives
    path = os.path.join(root, "capture.csv")
    df = parse_archives(spark, [path], ParseOptions(format="redis-csv", typed=False))
    rows = df.orderBy("line_number").collect()
    assert [r["line_number"] for r in rows] == [e.line_number for e in expected[path]]
    assert all(r["ev_kind"] is None and r["cache_func"] is None for r in rows)
    assert sum(r["row"] is not None for r in rows) > 100
    # read as 'lines', the capture is all errors but nothing is lost
    df = parse_archives(spark, [path], ParseOptions(format="lines"))
    assert df.count() == len(expected[path]) + 2 and df.where("error IS NULL").count() == 0


def test_parse_text_column(spark: Any, archives: tuple[str, dict[str, list[Any]]]) -> None:
    from factstream.spark.pipeline import parse_text_column

    root, expected = archives
    path = os.path.join(root, "plain.log")
    df = parse_text_column(spark.read.text(path))
    want = [expected_columns(e) for e in expected[path]]
    got = df.select("command", "stream", "token", "error", "ev_type", "cache_keys").collect()
    assert [(r["command"], r["stream"], r["token"], r["error"], r["ev_type"], r["cache_keys"]) for r in got] == [
        (w["command"], w["stream"], w["token"], w["error"], w["ev_type"], w["cache_keys"]) for w in want
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run(
        [sys.executable, "-m", "factstream.cli", "logs", *args, "--master", "local[2]", "--conf", "spark.ui.enabled=false"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def report_dir(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    from factstream.spark.pipeline import parse_archives, write_parquet

    root = tmp_path_factory.mktemp("report")
    (root / "in").mkdir()
    (root / "in" / "session.log").write_text(spark_archives.REPORT_ARCHIVE)
    out = str(root / "parquet")
    write_parquet(parse_archives(spark, [str(root / "in")]), out)
    return out


def test_parquet_is_partitioned_by_date_and_stream(spark: Any, report_dir: str) -> None:
    layout = sorted(
        os.path.relpath(d, report_dir) for d, _, files in os.walk(report_dir) if any(f.endswith(".parquet") for f in files)
    )
    # the PING and the malformed line have no timestamp and no stream
    assert layout == [
        "date=2026-11-22/stream=caches",
        "date=2026-11-22/stream=events",
        "date=__HIVE_DEFAULT_PARTITION__/stream=__HIVE_DEFAULT_PARTITION__",
    ]
    back = spark.read.parquet(report_dir)
    assert back.count() == 13
    assert back.where("error IS NOT NULL").select("line_number").collect()[0][0] == 12


def test_report_figures_match_hand_computed(spark: Any, report_dir: str) -> None:
    from factstream.spark.report import build_report

    report = build_report(spark.read.parquet(report_dir), bucket_seconds=2)
    assert report["lines"] == 13 and report["malformed"] == 1
    assert report["commands"] == {"PING": 1, "POSITION": 3, "RDATA": 8}
    streams = {(s["stream"], s["writer"]): s for s in report["streams"]}
    ev = streams[("events", "master")]
    # tokens 10(P) 11 12 15 14 18->20(P): 14 goes back (line order); in token order 13 and 16..18 have no row
    # (14 and 15 both arrived: the late 14 fills its place) and 19..20 are the POSITION's jump
    assert {k: ev[k] for k in ("rows", "batch_rows", "positions", "min_token", "max_token")} == {
        "rows": 4, "batch_rows": 0, "positions": 2, "min_token": 10, "max_token": 20}
    assert (ev["backwards"], ev["gaps"], ev["skipped_tokens"]) == (1, 2, 4)
    assert (ev["position_jumps"], ev["position_jump_tokens"], ev["unterminated_batches"]) == (1, 2, 0)
    # RDATA at :01 | :02 :03 | :04 in 2 s buckets starting at :00; the mean is over the 9 s the archive
    # covers (:00 to :09), not over whole buckets
    assert ev["rows_per_second"] == {
        "mean": round(4 / 9, 3),
        "peak": 1.0,
        "series": [["2026-11-22T10:00:00Z", 0.5], ["2026-11-22T10:00:02Z", 1.0], ["2026-11-22T10:00:04Z", 0.5]],
    }
    ca = streams[("caches", "master")]
    assert {k: ca[k] for k in ("rows", "batch_rows", "positions", "min_token", "max_token")} == {
        "rows": 4, "batch_rows": 3, "positions": 1, "min_token": 7, "max_token": 9}
    assert (ca["backwards"], ca["gaps"], ca["skipped_tokens"], ca["position_jumps"], ca["unterminated_batches"]) == (
        0, 0, 0, 1, 1)
    assert report["malformed_samples"][0]["line"] == 12
    # A bucket longer than the archive: the rates are over the 9 s it covers (they were over the whole
    # minute: a 3 s capture of a writer at 87 rows/s reported 4.3 rows/s, mean and peak alike).
    minute = build_report(spark.read.parquet(report_dir), bucket_seconds=60)
    ev = {(s["stream"], s["writer"]): s for s in minute["streams"]}[("events", "master")]
    assert ev["rows_per_second"] == {"mean": round(4 / 9, 3), "peak": round(4 / 9, 3),
                                     "series": [["2026-11-22T10:00:00Z", round(4 / 60, 3)]]}


@pytest.mark.slow
def test_cli_parse_and_report(tmp_path: Path, archives: tuple[str, dict[str, list[Any]]]) -> None:
    root, expected = archives
    out = str(tmp_path / "pq")
    # sized for 100 cores, so that files are cut into chunks of 2 KB or more and numbered across them
    done = _cli("parse", root, "--out", out, "--chunk-mb", "0.002", "--conf", "spark.default.parallelism=100",
                "--progress", "always")
    assert done.returncode == 0, done.stderr
    assert "parsing:" in done.stderr and "task" in done.stderr  # the tqdm bar
    total = sum(len(v) for v in expected.values())
    assert f"wrote {total} lines" in done.stderr
    again = _cli("parse", root, "--out", out)
    assert again.returncode == 2 and "--mode overwrite" in again.stderr
    chart = str(tmp_path / "rate.png")
    rep = _cli("report", out, "--json", "--chart", chart)
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["lines"] == total
    bad = sum(expected_columns(e)["error"] is not None for v in expected.values() for e in v)
    assert report["malformed"] == bad
    with open(chart, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    text = _cli("report", out)
    assert text.returncode == 0 and "streams (per writer):" in text.stdout and "malformed lines per file:" in text.stdout


@pytest.mark.slow
def test_cli_reports_missing_input(tmp_path: Path) -> None:
    done = _cli("parse", str(tmp_path / "nope*.log"), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "no archive files found" in done.stderr


# Spark's own casts, as the pipeline used to run them in the JVM: the oracle
# for the timestamps the executors now compute themselves (spark/timestamps.py).
SPARK_TS_SQL = (
    "CASE WHEN t RLIKE '^[0-9]+(\\\\.[0-9]+)?$' "
    "THEN timestamp_seconds(try_cast(t AS DECIMAL(20,6))) "
    "ELSE try_cast(replace(t, ',', '.') AS TIMESTAMP) END"
)
TS_TEXTS = [
    "2026-11-22T01:02:03Z", "2026-11-22 01:02:03", "2026-11-22T01:02:03.123456789", "2026-11-22T01:02:03.1234565Z",
    "2026-11-22T01:02:03,5+01:00", "2026-11-22T01:02:03.5-0930", "2026-11-22T01:02:03+18:00",
    "2026-11-22T01:02:03-18:00", "2026-11-22T01:02:03+18:01", "2026-11-22T01:02:03+19:00", "2026-11-22T01:02:03+05:60",
    "2026-02-29T01:02:03Z", "2028-02-29T01:02:03", "2026-13-01T00:00:00", "2026-11-22T24:00:00", "2026-11-22T23:59:60",
    "2026-03-08T02:30:00", "2026-11-01T01:30:00", "2026-03-29T02:30:00", "2026-10-25T02:30:00", "1970-01-01T00:00:00",
    "1969-12-31T23:59:59.999999", "1795310678.449548", "1795310678", "1795310678.4495485", "1795310678.4495475",
    "0.0000005", "100000000000000", "0001-01-02T00:00:00Z", "9999-12-29T23:59:59.999999Z",
]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "+05:30", "-08:00"])
def test_timestamps_are_what_sparks_casts_give(spark: Any, zone: str) -> None:
    from factstream.spark import timestamps as T

    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        df = spark.createDataFrame([(t,) for t in TS_TEXTS], "t string").selectExpr("t", f"{SPARK_TS_SQL} AS ts")
        rows = df.selectExpr("t", "unix_micros(ts) AS micros", "unix_date(to_date(ts)) AS days").collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
    import pyarrow as pa

    ts, date = T.timestamp_columns(pa.array(TS_TEXTS, pa.string()), zone)
    mine = list(zip(TS_TEXTS, ts.cast(pa.int64()).to_pylist(), date.cast(pa.int32()).to_pylist()))
    assert mine == [(r["t"], r["micros"], r["days"]) for r in rows]


def test_timestamps_out_of_range_are_null_not_fatal() -> None:
    from factstream.spark import timestamps as T
    import pyarrow as pa

    texts = ["99999999999999.5", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999-18:00", "0000-01-01T00:00:00", None]
    ts, date = T.timestamp_columns(pa.array(texts, pa.string()), "Asia/Kolkata")
    assert ts.null_count == date.null_count == len(texts)


# ------------------------------------------------------------ rotated captures

def _rotated_lines() -> list[str]:
    """One connection's traffic: events tokens 2..31 with a batch run of caches around token 10."""
    lines = []
    for i, tok in enumerate(range(2, 32)):
        ts = f"2026-11-24T11:00:{i:02d}.000Z"
        if tok == 10:
            lines.append(f'{ts} > RDATA caches master batch ["f",["a"],1]')
            lines.append(f'{ts} > RDATA caches master batch ["f",["b"],1]')
            lines.append(f'{ts} > RDATA caches master 10 ["f",["c"],1]')
            continue
        lines.append(f'{ts} > RDATA events master {tok} ["state-all",["!r:hs"]]')
    return lines


def _figures(report: dict[str, Any]) -> dict[tuple[str, str], tuple[int, ...]]:
    keys = ("rows", "batch_rows", "backwards", "gaps", "skipped_tokens", "unterminated_batches")
    return {(s["stream"], s["writer"]): tuple(s[k] for k in keys) for s in report["streams"]}


def test_a_rotated_capture_is_judged_as_one_sequence(spark: Any, tmp_path: Path) -> None:
    from factstream.spark.pipeline import parse_archives
    from factstream.spark.report import build_report

    lines = _rotated_lines()
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "session.log").write_text("\n".join(lines) + "\n")
    # the recorder's naming: rotated inside the caches batch run (after line 9) and later; files in two
    # directories, and listed out of order on purpose (a later file sorts first by path)
    rot = tmp_path / "rotated"
    (rot / "b").mkdir(parents=True)
    (rot / "a").mkdir()
    parts = [
        (rot / "b" / "hs1-9092.20261124T110000000000Z.000000.log", lines[:9]),
        (rot / "a" / "hs1-9092.20261124T110009000000Z.000001.log", lines[9:20]),
        (rot / "b" / "hs1-9092.20261124T110020000000Z.000002.log", lines[20:]),
    ]
    for path, body in parts:
        path.write_text("\n".join(body) + "\n")
    want = build_report(parse_archives(spark, [str(whole)]))
    got = build_report(parse_archives(spark, [str(rot)]))
    assert _figures(want) == {("caches", "master"): (3, 2, 0, 0, 0, 0), ("events", "master"): (29, 0, 0, 1, 1, 0)}
    assert _figures(got) == _figures(want)
    assert got["captures"] == [
        {"capture": "hs1-9092", "files": [str(p) for p, _ in parts], "lines": len(lines), "disconnects": 0}
    ]


def test_files_not_named_by_the_recorder_need_a_capture_pattern(spark: Any, tmp_path: Path) -> None:
    from factstream.spark.pipeline import parse_archives
    from factstream.spark.report import build_report

    lines = _rotated_lines()
    for n, body in ((1, lines[:9]), (2, lines[9:20]), (3, lines[20:])):
        (tmp_path / f"cap-{n}.log").write_text("\n".join(body) + "\n")
    df = parse_archives(spark, [str(tmp_path)])
    # file by file: the batch run cut by a rotation looks unterminated
    alone = _figures(build_report(df))
    assert alone[("caches", "master")][5] == 1
    # one capture, its files ordered by the (?P<order>...) group
    report = build_report(df, capture_pattern=r"^(?P<capture>cap)-(?P<order>\d+)\.log$")
    assert _figures(report) == {("caches", "master"): (3, 2, 0, 0, 0, 0), ("events", "master"): (29, 0, 0, 1, 1, 0)}
    assert [c["capture"] for c in report["captures"]] == ["cap"]


def test_a_disconnect_marker_is_a_hole_not_a_gap(spark: Any) -> None:
    from factstream.spark.report import build_report

    schema = ("source_file string, line_number bigint, ts timestamp, command string, stream string, "
              "instance string, token bigint, prev_token bigint, error string")
    t0 = dt.datetime(2026, 11, 24, 11, 0, 0)

    def rows(marker: bool) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        f1 = "/cap/hs1-9092.20261124T110000000000Z.000000.log.gz"
        f2 = "/cap/hs1-9092.20261124T110100000000Z.000001.log.gz"
        for n, tok in enumerate([2, 3, 4]):
            out.append((f1, n + 1, t0, "RDATA", "events", "master", tok, None, None))
            out.append((f1, n + 10, t0, "RDATA", "caches", "w1", tok + 100, None, None))
        out.append((f1, 20, t0, "RDATA", "caches", "w1", None, None, None))  # a batch row cut by the disconnect
        if marker:
            out.append((f2, 1, t0, "#disconnected", None, None, None, None, None))
        out.append((f2, 2, t0, "RDATA", "events", "master", 9, None, None))
        out.append((f2, 3, t0, "POSITION", "caches", "w1", 120, 110, None))
        out.append((f2, 4, t0, "RDATA", "events", "master", 12, None, None))  # a real gap after the hole
        return out

    holes = build_report(spark.createDataFrame(rows(True), schema))
    gaps = build_report(spark.createDataFrame(rows(False), schema))
    # without the marker: 4 -> 9 and 104 -> POSITION 110 are gaps; with it, only 9 -> 12 is
    assert _figures(gaps)[("events", "master")][3:5] == (2, 6)
    assert _figures(holes)[("events", "master")][3:5] == (1, 2)
    assert _figures(gaps)[("caches", "w1")][3:] == (1, 6, 1)
    assert _figures(holes)[("caches", "w1")][3:] == (0, 0, 1)  # the cut batch stays unterminated
    assert holes["captures"][0]["disconnects"] == 1 and holes["captures"][0]["capture"] == "hs1-9092"


def test_writers_sharing_one_sequence_are_judged_together(spark: Any) -> None:
    """Synapse's event persisters take tokens from one sequence: only a token no writer sent is missing.

    Judged per writer, every writer's tokens skip the others' (A: 1, 4, 7, ... two tokens skipped each time)."""
    from factstream.spark.report import build_report, render_text

    schema = ("source_file string, line_number bigint, ts timestamp, command string, stream string, "
              "instance string, token bigint, prev_token bigint, error string")
    t0 = dt.datetime(2026, 11, 24, 11, 0, 0)
    owner = {t: "ABC"[(t - 1) % 3] for t in range(1, 28)}
    sent = [t for t in range(1, 28) if t not in (17, 24)]  # 17: B's row lost; 24: C's id rolled back
    sent[4], sent[5] = sent[5], sent[4]  # B's 5 arrives after C's 6
    lines = [("RDATA", owner[t], t, None) for t in sent if t <= 23]
    # every writer says it has nothing up to 24 (each from its own last position): 24 is nobody's row
    lines += [("POSITION", "A", 24, 22), ("POSITION", "B", 24, 23), ("POSITION", "C", 24, 21)]
    lines += [("RDATA", owner[t], t, None) for t in sent if t > 24]
    f = "/cap/hs1-9092.20261124T110000000000Z.000000.log"
    rows = [(f, n, t0 + dt.timedelta(seconds=n), cmd, "events", w, tok, prev, None)
            for n, (cmd, w, tok, prev) in enumerate(lines, 1)]
    report = build_report(spark.createDataFrame(rows, schema))
    per_writer = {s["writer"]: (s["gaps"], s["skipped_tokens"], s["backwards"]) for s in report["streams"]}
    # the one hole (17) is counted at the row that ends it: C's 18
    assert per_writer == {"A": (0, 0, 0), "B": (0, 0, 0), "C": (1, 1, 0)}
    assert report["sequences"] == [{"stream": "events", "writers": 3, "shared": True, "gaps": 1, "skipped_tokens": 1}]
    assert [(m["writer"], m["kind"], m["tokens"]) for m in report["marks"]["sequence"]] == [("C", "gap", 1)]
    # a jump of only some writers does not excuse a token: 24 without C's POSITION is missing
    report = build_report(spark.createDataFrame([r for r in rows if r[5] != "C" or r[3] != "POSITION"], schema))
    assert report["sequences"][0]["gaps"] == 2 and report["sequences"][0]["skipped_tokens"] == 2
    import io

    out = io.StringIO()
    render_text(report, out)
    assert "events: 3 writers share one sequence: 2 gaps, 2 tokens no writer sent a row for" in out.getvalue()


def test_cli_rejects_a_bad_capture_pattern(tmp_path: Path) -> None:
    for pattern, problem in (("(", "not a regular expression"), ("cap", "has no group"), ("(?P<a_b>x)", "letters")):
        done = _cli("report", str(tmp_path), "--capture-pattern", pattern)
        assert done.returncode == 2 and problem in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


# ------------------------------------------------------------ streaming sink

def test_publishing_a_batch_again_replaces_it(spark: Any, report_dir: str, tmp_path: Path) -> None:
    """A micro-batch re-run after a crash (same id, same rows) must not add its rows twice, nor touch the files
    another query published into the same output under the same batch id."""
    from factstream.spark.streaming import publish_batch

    df = spark.read.parquet(report_dir)
    caches = df.where("stream = 'caches'")
    out = str(tmp_path / "out")
    staging, other = str(tmp_path / "ck" / "staging"), str(tmp_path / "ck2" / "staging")
    assert publish_batch(df, 7, out, staging, "q1") > 0
    assert publish_batch(caches, 7, out, other, "q2") > 0  # another query's batch 7
    # an interrupted second attempt left its staging directory
    os.makedirs(os.path.join(staging, "batch-7", "date=2026-11-22", "stream=events"))
    published = publish_batch(df, 7, out, staging, "q1")
    assert (published.lines, published.malformed) == (df.count(), df.where("error IS NOT NULL").count())
    publish_batch(caches, 8, out, staging, "q1")
    back = spark.read.parquet(out)
    assert back.count() == df.count() + 2 * caches.count()
    assert sorted(map(tuple, back.where("stream = 'events'").select("line_number", "token").collect())) == sorted(
        map(tuple, df.where("stream = 'events'").select("line_number", "token").collect()))
    names = [p.name for p in (tmp_path / "out").rglob("*.parquet")]
    assert names and all(n.startswith(("part-q1-b000000000007-", "part-q1-b000000000008-", "part-q2-b000000000007-"))
                         for n in names), names
    assert not os.path.exists(os.path.join(staging, "batch-7"))
