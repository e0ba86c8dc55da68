"""``factstream logs report`` (and ``logs parse --mode append``) on a dataset whose part files disagree on a column's type.

The installed executable in a subprocess. Spark takes a dataset's types
from one of its part files and reads the others as those types: one part
file of other types (another program's, or one rewritten) among a 'logs
parse' output stopped the report with Spark's words ("cannot read FILE:
Data type mismatches ...", which says nothing of what to do) or, when Spark
happened to take the types from the odd file, with "DIR is not the output of
'factstream logs parse'", though all but one file were; a part file without
the ``error`` column was read as nulls, its malformed lines not counted; a
32-bit ``token`` in one file and a 64-bit one in another failed or not
depending on which file Spark read first. Now a local directory's part
files are all read (their footers) before Spark starts: the odd ones are
named in one line, exit 2, and integer columns of other widths are read
alike and reported. A directory on another filesystem (here ``viewfs://``
mounted on a local one) is named by Spark's schema merge or by the file it
cannot read, in one line saying what to do. 'logs parse --mode append' no
longer adds part files to a dataset whose files it would disagree with.
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
#: Two part files: date=2026-11-24/stream=events, and the malformed line's (no stream: Spark's default partition).
ARCHIVE = (
    f"2026-11-24T11:00:00.000000Z > RDATA events master 1 {ROW}\n"
    f"2026-11-24T11:00:01.000000Z > RDATA events master 2 {ROW}\n"
    "2026-11-24T11:00:02.000000Z > RDATA events master\n"
)


def report_refused(tmp_path: Path, pq_dir: Path, said: str) -> None:
    """'logs report PQ_DIR' refuses it before Spark starts, in one line: the part files disagree, ``said`` how."""
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "report", str(pq_dir))
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr == (
        f"factstream logs: the part files of {pq_dir} disagree on a column: {said}, as the others hold it: move those "
        f"out of {pq_dir} (another program wrote or rewrote them), or parse the archives again into a new directory\n"
    ), done.stderr
    assert list(tmp.iterdir()) == []  # no Spark log: refused before Spark started


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_spark_cli("pandas")
    root = tmp_path_factory.mktemp("report_mixed")
    (root / "wire.log").write_text(ARCHIVE)
    done = cli("logs", "parse", str(root / "wire.log"), "--out", str(root / "pq"), *LOCAL_SPARK, timeout=600)
    assert done.returncode == 0, done.stderr
    assert len(part_files(root / "pq")) == 2
    return root / "pq"


def part_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("part-*.parquet"))


def mixed(parsed: Path, dest: Path, which: int, change: str) -> tuple[Path, str]:
    """``parsed`` copied to ``dest`` (without Hadoop's checksum files) with its ``which``-th part file rewritten by
    pyarrow: its token column made strings ("string") or 32-bit ("int32"), or its error column left out
    ("no error"). Returns (dest, the part file changed)."""
    pa = require(module="pyarrow", how=PYARROW_HOW)
    pq = require(module="pyarrow.parquet", how=PYARROW_HOW)
    shutil.copytree(parsed, dest, ignore=shutil.ignore_patterns("*.crc"))
    rel = part_files(dest)[which]
    path = dest / rel
    table = pq.read_table(path, partitioning=None).replace_schema_metadata(None)
    table = table.set_column(table.column_names.index("ts"), "ts", table["ts"].cast(pa.timestamp("us", tz="UTC")))
    if change == "no error":
        table = table.drop_columns(["error"])
    else:
        column: Any = table["token"]
        values = column.to_pylist()
        column = pa.array([None if v is None else str(v) for v in values], pa.string()) if change == "string" \
            else pa.array(values, pa.int32())
        table = table.set_column(table.column_names.index("token"), "token", column)
    pq.write_table(table, path)
    return dest, rel


@pytest.mark.parametrize("which", [0, 1])
def test_a_part_file_of_other_types_is_named_before_spark_starts(parsed: Path, tmp_path: Path, which: int) -> None:
    """Whichever file Spark would have taken the types from: the odd one is named, with what to do."""
    pq_dir, odd = mixed(parsed, tmp_path / "pq", which, "string")
    report_refused(tmp_path, pq_dir, f"column token is string in 1 of the 2 part files ({pq_dir}/{odd}), where "
                                     "'logs parse' writes an integer")


def test_a_part_file_without_a_column_is_named_not_read_as_nulls(parsed: Path, tmp_path: Path) -> None:
    """Spark read the missing error column as nulls when it took the types from the other file: the report then
    counted no malformed line."""
    malformed = next(i for i, p in enumerate(part_files(parsed)) if "stream=events" not in p)
    pq_dir, odd = mixed(parsed, tmp_path / "pq", malformed, "no error")
    report_refused(tmp_path, pq_dir, f"column error is missing from 1 of the 2 part files ({pq_dir}/{odd}), where "
                                     "'logs parse' writes a string")


@pytest.fixture(scope="module")
def reported(parsed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    done = logs_cli(tmp_path_factory.mktemp("report_mixed_tmp"), "report", str(parsed), "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["lines"] == 3 and report["malformed"] == 1
    return report


@pytest.mark.parametrize("which", [0, 1])
def test_integers_of_other_widths_are_read_alike(
    parsed: Path, reported: dict[str, Any], tmp_path: Path, which: int
) -> None:
    """A 32-bit token in one file, 64-bit in the other: the same report (it failed when Spark read the 32-bit file
    first: "Expected Spark type int, actual Parquet type INT64")."""
    pq_dir, _ = mixed(parsed, tmp_path / "pq", which, "int32")
    done = logs_cli(tmp_path / "tmp", "report", str(pq_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == reported


@pytest.mark.parametrize("which", [0, 1])
def test_on_another_filesystem_the_odd_file_is_said_in_one_line(parsed: Path, tmp_path: Path, which: int) -> None:
    """viewfs:// (a Hadoop filesystem os.path cannot read, mounted here on the local one): no footer is read before
    Spark starts; Spark's schema merge (when it took the types from the odd file) or the file it cannot read says it."""
    pq_dir, odd = mixed(parsed, tmp_path / "pq", which, "string")
    tmp = tmp_path / "tmp"
    url = "viewfs:///data/pq"
    done = logs_cli(tmp, "report", url, "--conf", f"spark.hadoop.fs.viewfs.mounttable.default.link./data=file://{tmp_path}")
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr in (
        f"factstream logs: the part files of {url} disagree on a column: column token is bigint in some, string in "
        f"others, where 'logs parse' writes an integer: move the ones that do not hold it so out of {url} (another "
        "program wrote or rewrote them), or parse the archives again into a new directory\n",
        f"factstream logs: cannot read {url}/{odd}: its column token is BINARY, where another part file of the same "
        "dataset has bigint: the part files of one dataset must agree on each column's type; move that one out of the "
        "dataset's directory (another program wrote or rewrote it), or parse the archives again into a new directory\n",
    ), done.stderr
    assert sorted(tmp.glob("factstream-spark-*")) == []  # the user's data, not the job: no log kept


def test_appending_to_a_dataset_of_other_types_is_refused(parsed: Path, tmp_path: Path) -> None:
    """The append would have made the mix the report above refuses; nothing is written."""
    pq_dir, odd = mixed(parsed, tmp_path / "pq", 0, "string")
    before = sorted(p for p in pq_dir.rglob("*"))
    (tmp_path / "wire.log").write_text(ARCHIVE)
    tmp = tmp_path / "tmp"
    done = logs_cli(tmp, "parse", str(tmp_path / "wire.log"), "--out", str(pq_dir), "--mode", "append")
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr == (
        f"factstream logs: --out {pq_dir} holds part files that 'logs parse' did not write as it writes them now: "
        f"column token is string in 1 of the 2 part files ({pq_dir}/{odd}), where 'logs parse' writes an integer: "
        "--mode append would mix in part files that disagree with them, which 'logs report' cannot read together; "
        f"move those out of {pq_dir}, or choose a new --out (nothing was written)\n"), done.stderr
    assert sorted(p for p in pq_dir.rglob("*")) == before
    assert list(tmp.iterdir()) == []
