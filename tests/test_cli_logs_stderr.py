"""What ``factstream logs`` leaves on stderr when a Spark job fails: our one line, nothing before it.

The installed executable in a subprocess. pyspark logged a JSON record of
every failed query (stack included) on stderr before our line, and a Java
failure that escaped became an "internal error" line thousands of
characters long, Java's stack inside: a corrupt part file, a
--capture-pattern Python accepts and Java refuses. Now a user's mistake is
one line saying what is wrong; anything else is one line naming Spark's log,
kept with the details. One Spark start per path; the Parquet is written
with pyarrow (someone else's, as a user would have it), not by Spark.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_run import LOCAL_SPARK, PYARROW_HOW, cli, logs_cli, no_traceback, require_spark_cli
from conftest import require

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


def spark_logs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("factstream-spark-*"))


def write_parquet(root: Path, name: str = "part-0.parquet", token: Any = None, times: Any = None) -> Path:
    """One part file of 'logs parse' output (its columns and partitions), written by pyarrow; ``token``
    and ``times`` replace the token and ts columns' values (a column of another type)."""
    pa = require(module="pyarrow", how=PYARROW_HOW)
    pq = require(module="pyarrow.parquet", how=PYARROW_HOW)
    from factstream.spark.report import REQUIRED_COLUMNS

    ts = dt.datetime(2026, 11, 24, 11, 0, tzinfo=dt.timezone.utc)
    n = 3
    columns = {
        "source_file": pa.array(["/data/wire.log"] * n),
        "line_number": pa.array([1, 2, 3], pa.int64()),
        "ts": (pa.array([ts + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC"))
               if times is None else pa.array(times)),
        "direction": pa.array([">"] * n),
        "command": pa.array(["RDATA"] * n),
        "instance": pa.array(["master"] * n),
        "token": pa.array([1, 2, 3], pa.int64()) if token is None else pa.array(token),
        "prev_token": pa.array([None] * n, pa.int64()),
        "row": pa.array(['["!r:hs",["@a:hs"]]'] * n),
        "data": pa.array([None] * n, pa.string()),
        "error": pa.array([None] * n, pa.string()),
    }
    assert set(REQUIRED_COLUMNS) - {"stream"} <= set(columns), "the report reads columns this fixture lacks"
    part = root / "date=2026-11-24" / "stream=typing"
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), part / name)
    return part / name


def test_a_failed_job_is_one_line_naming_spark_log(tmp_path: Path) -> None:
    """The executors' Python does not start (not the user's input): one line, Java's stack in Spark's log, kept."""
    require_spark_cli("pandas")
    (tmp_path / "wire.log").write_text('RDATA typing master 1 ["!r:hs",["@a:hs"]]\n')
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # Twelve logs kept by earlier failed runs (oldest first) and the log of a run still going, older than all.
    earlier = [tmp / f"factstream-spark-kept-old{i:02}.log" for i in range(12)]
    running = tmp / "factstream-spark-running.log"
    for age, path in enumerate([running, *earlier]):
        path.write_text("an earlier run's log\n")
        os.utime(path, (1_700_000_000 + age, 1_700_000_000 + age))
    done = cli("logs", "parse", str(tmp_path / "wire.log"), "--out", str(tmp_path / "out"), *LOCAL_SPARK, timeout=600,
               TMPDIR=str(tmp), PYSPARK_PYTHON="/bin/false")
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    found = re.fullmatch(r"factstream logs: the Spark job failed: [^\n]*pyspark\.daemon[^\n]* \(the executors' "
                         r"Python did not start: check PYSPARK_PYTHON or spark\.pyspark\.python[^\n]*\) "
                         r"\(details in Spark's log: (\S+)\)\n", done.stderr)
    assert found, done.stderr
    log = Path(found.group(1))
    assert log.parent == tmp and log.name.startswith("factstream-spark-kept-")
    # kept with the newest nine of the earlier kept logs (ten in all); the running job's log is not touched
    assert spark_logs(tmp) == sorted([log, running, *earlier[3:]])
    assert "at org.apache.spark." in log.read_text()  # the stack is there, not on stderr
    assert no_traceback(done.stderr)


def test_pysparks_query_context_record_goes_to_the_handler_not_stderr(tmp_path: Path) -> None:
    """A failed cast makes pyspark log a JSON record of the query, stack included, on its own stderr handler.

    The report no longer reaches one (a token of strings is refused before
    Spark runs), so the routing is checked on a query of its own.
    """
    require_spark_cli("pandas")
    script = tmp_path / "cast.py"
    script.write_text(
        "import logging, sys\n"
        "from pyspark.sql import SparkSession, functions as F\n"
        "from factstream.spark.session import route_query_context_logs\n"
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')\n"
        "         .config('spark.sql.ansi.enabled', 'true').getOrCreate())\n"
        "spark.sparkContext.setLogLevel('OFF')\n"
        f"route_query_context_logs(logging.FileHandler({str(tmp_path / 'records.log')!r}))\n"
        "try:\n"
        "    spark.range(1).select(F.lit('abc').cast('int')).collect()\n"
        "except Exception as err:\n"
        "    print('failed:', type(err).__name__)\n"
        "spark.stop()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert "failed:" in done.stdout, (done.stdout, done.stderr)  # the cast failed, as ANSI mode makes it
    assert "QueryContextLogger" not in done.stderr, done.stderr
    assert "QueryContextLogger" in (tmp_path / "records.log").read_text()


def test_a_ts_column_of_strings_is_named_not_an_internal_error(tmp_path: Path) -> None:
    """The report turns ts into datetimes in Python: a string column failed there ("internal error: TypeError")."""
    require_spark_cli("pandas")
    write_parquet(tmp_path / "pq", times=["2026-11-24T11:00:00Z"] * 3)
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(tmp_path / "pq"))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (f"factstream logs: {tmp_path / 'pq'} is not the output of 'factstream logs parse' or "
                           "'logs stream': its column ts is string, not a timestamp\n"), done.stderr
    assert spark_logs(tmp) == []


def test_a_corrupt_part_file_is_named_in_one_line(tmp_path: Path) -> None:
    require_spark_cli("pandas")
    write_parquet(tmp_path / "pq")
    bad = tmp_path / "pq" / "date=2026-11-24" / "stream=typing" / "part-1.parquet"
    bad.write_bytes(b"this was a Parquet file once")  # sorts after the good one: Spark takes the schema from that
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(tmp_path / "pq"))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert re.fullmatch(rf"factstream logs: cannot read {re.escape(str(bad))}: not a Parquet file\. Expected magic "
                        r"number at tail, but found \[[-\d, ]+\]\n", done.stderr), done.stderr
    assert spark_logs(tmp) == []  # the user's mistake: no log to look at, none left behind


def test_a_lone_corrupt_part_file_is_named_in_one_line(tmp_path: Path) -> None:
    """The only part file corrupt: Spark fails reading the schema, before any job (was "calling o46.parquet.")."""
    require_spark_cli("pandas")
    bad = tmp_path / "pq" / "date=2026-11-24" / "stream=typing" / "part-0.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"this was a Parquet file once")
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(tmp_path / "pq"))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert re.fullmatch(r"factstream logs: cannot read [^\n]*part-0\.parquet[^\n]*\n", done.stderr), done.stderr
    assert "calling o" not in done.stderr and no_traceback(done.stderr)


def test_a_capture_pattern_java_refuses_is_a_usage_error(tmp_path: Path) -> None:
    """(?#...) is a comment to Python, an unknown inline modifier to Java, which matches it in Spark."""
    require_spark_cli("pandas")
    write_parquet(tmp_path / "pq")
    pattern = r"(?P<capture>[a-z]+)(?#the capture)"
    assert re.search(pattern, "wire.log")
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(tmp_path / "pq"), "--capture-pattern", pattern)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert re.fullmatch(rf"factstream logs: --capture-pattern '{re.escape(pattern)}' is valid in Python but not in "
                        r"Java, whose regular expressions Spark matches it with: Unknown inline modifier near index "
                        rf"\d+ in '{re.escape(pattern.replace('(?P<', '(?<'))}'; write it in the syntax both share\n",
                        done.stderr), done.stderr
    assert spark_logs(tmp) == []


def test_parse_into_a_partition_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """--mode overwrite into an OUT where a partition directory is a file: refused before Spark, the file kept."""
    require_spark_cli("pandas")
    (tmp_path / "wire.log").write_text('RDATA typing master 1 ["!r:hs",["@a:hs"]]\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "date=__HIVE_DEFAULT_PARTITION__").write_text("not a directory\n")  # where lines without a timestamp go
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "parse", str(tmp_path / "wire.log"), "--out", str(out), "--mode", "overwrite")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (f"factstream logs: {out}/date=__HIVE_DEFAULT_PARTITION__ is a file where 'logs parse' "
                           f"writes a partition directory: move it out of {out}, or choose another --out "
                           "(nothing was written)\n"), done.stderr
    assert (out / "date=__HIVE_DEFAULT_PARTITION__").read_text() == "not a directory\n"
    assert spark_logs(tmp) == []


def test_a_conf_value_spark_refuses_is_the_users_one_line(tmp_path: Path) -> None:
    """A --conf value Spark cannot use is the user's to correct: exit 2, Spark's words, no log kept."""
    require_spark_cli("pandas")
    write_parquet(tmp_path / "pq")
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(tmp_path / "pq"), "--conf", "spark.sql.session.timeZone=Mars/Olympus")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert re.fullmatch(r"factstream logs: \[INVALID_CONF_VALUE\.TIME_ZONE\] The value 'Mars/Olympus' in the config "
                        r"\"spark\.sql\.session\.timeZone\" is invalid\.[^\n]*\n", done.stderr), done.stderr
    assert spark_logs(tmp) == []
