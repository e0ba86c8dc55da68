"""``factstream logs report`` on Parquet whose columns have other types than 'logs parse' writes.

The installed executable in a subprocess. Only ``ts`` was type-checked: a
token column of strings ended in Spark's cast error ("the Spark job failed:
[CAST_INVALID_INPUT] ...", exit 1, Spark's log kept as if the job were at
fault), and other columns failed likewise or deeper. Now every column the
report reads is checked before any job: one line naming the column, its type
and the type wanted, exit 2, no log kept. The Parquet is a real 'logs parse'
output rewritten by pyarrow with one column's values of another type, as a
user's own tools would leave it. Partition values stay names: a stream
called "1" is reported, not refused as an integer.
"""

from __future__ import annotations

import json
import shutil
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

ROW = '["!r:hs",["@a:hs"]]'
NOT_OURS = "is not the output of 'factstream logs parse' or 'logs stream'"


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 'logs parse' output: a recorder capture (with its notes' data column) and bare lines."""
    require_spark_cli("pandas")
    root = tmp_path_factory.mktemp("report_types")
    (root / "in").mkdir()
    (root / "in" / "hs1.20261124T110000000000Z.000000.log").write_text(
        "2026-11-24T11:00:00.000000Z # connected tcp 127.0.0.1:9092 server hs1\n"
        f"2026-11-24T11:00:00.100000Z > RDATA events master 1 {ROW}\n"
        "2026-11-24T11:00:00.200000Z > POSITION events master 1 3\n"
        f"2026-11-24T11:00:01.100000Z > RDATA events master 4 {ROW}\n"
        "2026-11-24T11:00:02.000000Z # disconnected recorder stopped\n"
    )
    (root / "in" / "wire.log").write_text(f"RDATA typing master 1 {ROW}\nRDATA typing master 2 {ROW}\n")
    done = cli("logs", "parse", str(root / "in"), "--out", str(root / "pq"), *LOCAL_SPARK, timeout=600)
    assert done.returncode == 0, done.stderr
    return root / "pq"


def rewrite(parsed: Path, dest: Path, change: dict[str, str]) -> Path:
    """``parsed`` copied to ``dest`` with the columns of ``change`` turned into "string" values (1 -> "1"), "words"
    (1 -> "t1": what no cast makes a number) or "int64" ones (a string's length)."""
    pa = require(module="pyarrow", how=PYARROW_HOW)
    pq = require(module="pyarrow.parquet", how=PYARROW_HOW)
    files = sorted(parsed.rglob("part-*.parquet"))
    assert files
    for path in files:
        table = pq.read_table(path, partitioning=None).replace_schema_metadata(None)  # no Spark schema to trust
        for name in table.column_names:
            column: Any = table[name]
            if name == "ts":
                column = column.cast(pa.timestamp("us", tz="UTC"))
            if name in change:
                values = column.to_pylist()
                if change[name] == "int64":
                    column = pa.array([len(v or "") for v in values], pa.int64())
                else:
                    prefix = "t" if change[name] == "words" else ""
                    column = pa.array([None if v is None else f"{prefix}{v}" for v in values], pa.string())
            table = table.set_column(table.column_names.index(name), name, column)
        target = dest / path.relative_to(parsed)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target)
    return dest


def test_the_rewritten_output_reports_as_it_is(parsed: Path, tmp_path: Path) -> None:
    """The rewriting itself changes nothing the report reads: what the refusals below differ in is the type."""
    pq_dir = rewrite(parsed, tmp_path / "pq", {})
    done = logs_cli(tmp_path / "tmp", "report", str(pq_dir), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["lines"] == 7
    assert {(s["stream"], s["min_token"], s["max_token"]) for s in report["streams"]} == {
        ("events", 1, 4), ("typing", 1, 2)}


@pytest.mark.parametrize(
    "change, said",
    [
        # strings Spark cannot cast: "the Spark job failed: [CAST_INVALID_INPUT] ...", exit 1, its log kept
        ({"token": "words"}, "its column token is string, not an integer"),
        # strings it can: exit 0, the tokens' range compared as text ("10" < "9")
        ({"token": "string"}, "its column token is string, not an integer"),
        ({"prev_token": "string"}, "its column prev_token is string, not an integer"),
        ({"line_number": "string"}, "its column line_number is string, not an integer"),
        ({"instance": "int64"}, "its column instance is bigint, not a string"),
        ({"command": "int64"}, "its column command is bigint, not a string"),
        ({"data": "int64"}, "its column data is bigint, not a string"),
        ({"token": "string", "source_file": "int64"},
         "its column source_file is bigint, not a string; its column token is string, not an integer"),
    ],
)
def test_a_column_of_another_type_is_named_in_one_line(
    parsed: Path, tmp_path: Path, change: dict[str, str], said: str
) -> None:
    pq_dir = rewrite(parsed, tmp_path / "pq", change)
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(pq_dir))
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr == f"factstream logs: {pq_dir} {NOT_OURS}: {said}\n", done.stderr
    assert sorted(tmp.glob("factstream-spark-*")) == []  # the user's data, not the job: no log kept


def test_a_stream_partition_named_like_a_number_is_a_name(parsed: Path, tmp_path: Path) -> None:
    """Spark reads stream=1 as the integer 1 unless told otherwise (the JSON said 1, not "1"); the type check
    must not refuse it either."""
    src = next(parsed.glob("date=2026-11-24/stream=events"))
    pq_dir = tmp_path / "pq"
    shutil.copytree(src, pq_dir / "date=2026-11-24" / "stream=1")
    done = logs_cli(tmp_path / "tmp", "report", str(pq_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert [s["stream"] for s in json.loads(done.stdout)["streams"]] == ["1"]
