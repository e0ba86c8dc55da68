"""``factstream logs report`` as an operator meets it on awkward archives.

The installed executable in a subprocess (exit status, stdout, stderr), and
the report's arithmetic on a local Spark session, on what went wrong before:
tokens near 2**63 crashed the job (ARITHMETIC_OVERFLOW), someone else's
Parquet was an "internal error", one stray timestamp months off filled the
series with hundreds of thousands of buckets, a cleanly stopped recorder
counted as a disconnect hole, the chart drew one row in a partly covered
last bucket as ten rows/s where the report said one, and wide figures ran
together in the text table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli, no_traceback, require_spark_cli

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
BIG = 2**63 - 1
ROW = '["!r:hs",["@a:hs"]]'


def logs(*args: str, timeout: float = 600) -> Any:
    return cli("logs", *args, timeout=timeout)


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three captures parsed once: huge tokens (bare lines), a stray old timestamp, a reconnect then a clean stop."""
    require_spark_cli("pandas", "matplotlib")
    root = tmp_path_factory.mktemp("report_user")
    src = root / "in"
    src.mkdir()
    (src / "tokens.log").write_text(
        f"RDATA typing master 1 {ROW}\n"
        f"RDATA typing master {BIG - 1} {ROW}\n"
        f"RDATA typing master 0 {ROW}\n"
        f"RDATA typing master {BIG} {ROW}\n"
        f"POSITION typing master 0 {BIG}\n"
        f"RDATA presence master 1 {ROW}\n"
        f"RDATA presence master {BIG} {ROW}\n"
    )
    # 2026-06-01 .. 2026-11-24 is 250,000 minutes: more buckets of 60 s than a report draws
    (src / "old.20261124T110000000000Z.000000.log").write_text(
        '2026-06-01T00:00:00.000000Z > RDATA to_device master 1 ["@u:hs"]\n'
        '2026-11-24T11:00:00.100000Z > RDATA to_device master 2 ["@u:hs"]\n'
    )
    (src / "hs1.20261124T110000000000Z.000000.log").write_text(
        "2026-11-24T11:00:00.000000Z # connected tcp 127.0.0.1:9092 server hs1\n"
        f"2026-11-24T11:00:00.100000Z > RDATA receipts master 1 {ROW}\n"
        "2026-11-24T11:00:03.000000Z # disconnected connection reset by peer\n"
        "2026-11-24T11:00:33.000000Z # connected tcp 127.0.0.1:9092 server hs1\n"
        f"2026-11-24T11:00:34.100000Z > RDATA receipts master 41 {ROW}\n"
        f"2026-11-24T11:00:35.100000Z > RDATA receipts master 45 {ROW}\n"
        "2026-11-24T11:00:36.000000Z # disconnected recorder stopped\n"
    )
    out = root / "pq"
    done = logs("parse", str(src), "--out", str(out), *SPARK)
    assert done.returncode == 0, done.stderr
    return out


def test_json_and_chart_on_huge_tokens_a_stray_timestamp_and_a_clean_stop(parsed: Path, tmp_path: Path) -> None:
    chart = tmp_path / "rate.png"
    done = logs("report", str(parsed), "--json", "--chart", str(chart), *SPARK)
    assert done.returncode == 0, done.stderr
    assert no_traceback(done.stderr) and "internal error" not in done.stderr and "OVERFLOW" not in done.stderr
    report = json.loads(done.stdout)
    streams = {s["stream"]: s for s in report["streams"]}
    typing = streams["typing"]
    # 2**63-2 -> 0 goes back; the POSITION 0 -> 2**63-1 passes over every token between: none is missing
    assert (typing["gaps"], typing["skipped_tokens"], typing["backwards"]) == (0, 0, 1)
    # 1 -> 2**63-1 with no row between: 2**63-3 tokens (computed past a long's range)
    assert (streams["presence"]["gaps"], streams["presence"]["skipped_tokens"]) == (1, BIG - 2)
    assert (typing["position_jumps"], typing["position_jump_tokens"], typing["max_token"]) == (1, BIG, BIG)
    # 250,000 one-minute buckets would be drawn: widened (to a multiple of 60 s) and said so
    assert report["bucket_seconds_requested"] == 60
    assert report["bucket_seconds"] % 60 == 0 and report["bucket_seconds"] > 60
    assert len(streams["to_device"]["rows_per_second"]["series"]) <= 100_000
    assert f"--bucket 60 widened to {report['bucket_seconds']} s" in done.stderr
    # one reconnect is one hole; "recorder stopped" on the last line is where the recording ended
    hs1 = {c["capture"]: c for c in report["captures"]}["hs1"]
    assert hs1["disconnects"] == 1
    assert report["marks"]["holes"] == [{"capture": "hs1", "from": "2026-11-24T11:00:03Z", "to": "2026-11-24T11:00:33Z"}]
    assert streams["receipts"]["gaps"] == 1 and streams["receipts"]["skipped_tokens"] == 3  # 41 -> 45, not 1 -> 41
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_keeps_wide_figures_apart(parsed: Path) -> None:
    done = logs("report", str(parsed), *SPARK)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # stream writer rows batch POSITION tokens back gaps skipped jumps open mean peak
    row = next(line for line in lines if line.strip().startswith("typing"))
    assert row.split()[:10] == ["typing", "master", "4", "0", "1", f"0..{BIG}", "1", "0", "0", "1"], row
    row = next(line for line in lines if line.strip().startswith("presence"))
    assert row.split()[:10] == ["presence", "master", "2", "0", "0", f"1..{BIG}", "0", "1", str(BIG - 2), "0"], row
    assert "1 disconnect holes" in done.stdout


def test_someone_elses_parquet_is_named_not_an_internal_error(tmp_path: Path) -> None:
    require_spark_cli()
    import pyarrow as pa
    import pyarrow.parquet as pq

    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), str(other / "data.parquet"))
    done = logs("report", str(other), *SPARK)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"factstream logs: {other} is not the output of 'factstream logs parse'")
    assert "source_file" in lines[0] and "internal error" not in lines[0]


# ------------------------------------------------------ the report's arithmetic


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    require_spark_cli("pandas", "matplotlib")
    from factstream.spark.session import make_session

    session = make_session(
        "local[2]", app_name="factstream-report-user",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        log_level="ERROR",
    )
    yield session
    session.stop()


SCHEMA = ("source_file string, line_number bigint, ts timestamp, command string, stream string, "
          "instance string, token bigint, prev_token bigint, error string, data string")


def test_one_line_archive_is_drawn_at_the_reports_rate(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A last bucket covered for less than a second is taken over a second, in the chart as in the peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from factstream.spark.chart import render_chart
    from factstream.spark.report import build_report

    t = dt.datetime(2026, 11, 24, 11, 0, 0, 100000)
    f = "/c/o.20261124T110000000000Z.000000.log"
    rows = [(f, 1, t, "RDATA", "typing", "master", 5, None, None, None)]
    report = build_report(spark.createDataFrame(rows, SCHEMA))
    s = report["streams"][0]
    assert s["rows_per_second"]["peak"] == 1.0 and s["rows_per_second"]["mean"] == 1.0
    assert report["last_bucket_seconds"] == 0.0  # from its first timestamp to its last, not from the bucket's start
    # two rows 0.4 s apart in the last bucket, the first bucket full: peak and chart say 2 rows/s
    rows2 = [(f, i, dt.datetime(2026, 11, 24, 10, 59, 0) + dt.timedelta(seconds=i), "RDATA", "typing", "master",
              i, None, None, None) for i in range(1, 60)]
    rows2 += [(f, 100, t, "RDATA", "typing", "master", 100, None, None, None),
              (f, 101, t + dt.timedelta(seconds=0.4), "RDATA", "typing", "master", 101, None, None, None)]
    report2 = build_report(spark.createDataFrame(rows2, SCHEMA))
    assert report2["streams"][0]["rows_per_second"]["peak"] == 2.0

    drawn: list[Any] = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    try:
        render_chart(report, str(tmp_path / "one.png"))
        render_chart(report2, str(tmp_path / "two.png"))
    finally:
        monkeypatch.setattr(plt, "close", real_close)
    tops = []
    for fig in drawn:
        ys = [y for line in fig.axes[0].get_lines() for y in line.get_ydata()]
        tops.append(max(ys))
        plt.close(fig)
    # (the series is rounded to 3 decimals: 1/60 -> 0.017, drawn as 1.02)
    assert tops == [pytest.approx(1.0, abs=0.05), pytest.approx(2.0, abs=0.05)]  # were 10.2 and 4.0


def test_a_slow_stream_is_not_drawn_as_an_outage(spark: Any) -> None:
    """One row an hour in hourly buckets is 0.000278 rows/s, not 0.0 (rounded to 3 decimals it read as an outage)."""
    from factstream.spark.report import build_report

    f = "/c/s.20261124T110000000000Z.000000.log"
    rows = [(f, 1, dt.datetime(2026, 11, 24, 11, 0, 0), "RDATA", "presence", "master", 1, None, None, None),
            (f, 2, dt.datetime(2026, 11, 24, 13, 30, 0), "RDATA", "presence", "master", 2, None, None, None)]
    rate = build_report(spark.createDataFrame(rows, SCHEMA), bucket_seconds=3600)["streams"][0]["rows_per_second"]
    assert [v for _, v in rate["series"]] == [0.000278, 0.0, 0.000278]
    assert rate["mean"] == 0.000222 and rate["peak"] == 0.001  # 1 row in the 1800 s covered of the last hour
