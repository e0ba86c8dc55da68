"""`factstream logs stream` resuming a batch that an earlier version left interrupted.

Versions before ``<checkpoint>/staging/published.json`` named the files of
batch N ``part-b<N:012d>-...`` and, re-running a batch, deleted every such
file. A batch interrupted under such a version and re-run by this one finds
no note naming its files: they must go all the same, or the batch's rows are
in the output twice. The earlier version's state is built by hand: a
checkpoint whose offset log started batch 0 and whose commit log does not
record it, and an output holding that batch's rows as that version named them.
"""

from __future__ import annotations

import collections
import gzip
import datetime as dt
import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from cli_run import require_spark_cli
from conftest import require
from spark_stream_run import db_rows, parquet_rows, produce, run_stream

_OLD0 = "part-b000000000000-"


def _write_part(path: Path, table: object) -> None:
    """One Parquet file as Spark's partitioned writer leaves it: no date/stream columns, INT96 timestamps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert isinstance(table, pa.Table)
    table = table.drop_columns(["date", "stream"])
    table = table.set_column(table.schema.get_field_index("ts"), "ts", table["ts"].cast(pa.timestamp("ns")))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)


def _old_version_state(db: str, out: Path, ck: Path) -> tuple[int, int]:
    """Batch 0 (every fact of ``db``) published by an earlier version, then interrupted before Spark's commit.

    Also two bystanders in ``out`` that must stay: another query's files of
    batch 0 under this version's naming, and an earlier version's batch 1 of
    another source. Returns the number of (date, stream) directories and the bystanders' row count.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from factstream.demo.tables import DEMO_TABLES
    from factstream.spark.streaming import FactRange, read_range

    conn = sqlite3.connect(db.removeprefix("sqlite://"))
    try:
        positions = conn.execute("SELECT stream_name, instance_name, stream_id FROM stream_positions").fetchall()
    finally:
        conn.close()
    tables = {t.stream: t for t in DEMO_TABLES}
    offsets: dict[str, dict[str, int]] = {s: {} for s in sorted(tables)}
    for stream, writer, token in positions:
        if stream in tables:
            offsets[stream][writer] = int(token)
    batches = [b for stream, writers in offsets.items() for writer, token in writers.items()
               for b in read_range(db, tables[stream], FactRange(stream, writer, 0, token))]
    rows = pa.Table.from_batches(batches)
    bystanders = 0
    run = uuid.uuid4()
    dirs = sorted({(r["date"], r["stream"]) for r in rows.select(["date", "stream"]).to_pylist()})
    for n, (date, stream) in enumerate(dirs):
        part = rows.filter(pc.and_(pc.equal(rows["date"], date), pc.equal(rows["stream"], stream)))
        where = out / f"date={date.isoformat()}" / f"stream={stream}"
        _write_part(where / f"{_OLD0}part-{n:05d}-{run}.c000.snappy.parquet", part)
        other = part.slice(0, 3)
        other = other.set_column(other.schema.get_field_index("source_file"), "source_file",
                                 pa.array([f"sqlite:///elsewhere.sqlite#{stream}/x"] * len(other)))
        _write_part(where / f"part-{uuid.uuid4()}-b000000000000-part-00000-{run}.c000.snappy.parquet", other)
        _write_part(where / f"part-b000000000001-part-00000-{uuid.uuid4()}.c000.snappy.parquet", other)
        bystanders += 2 * len(other)
    query = ck / "query"
    (query / "offsets").mkdir(parents=True)
    (query / "commits").mkdir()
    (ck / "staging").mkdir()
    (query / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    now = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    (query / "offsets" / "0").write_text(
        "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": now, "conf": {}}) + "\n" + json.dumps(offsets))
    return len(dirs), bystanders


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_batch_interrupted_by_an_earlier_version_is_not_written_twice(tmp_path: Path) -> None:
    """Re-run by this version, the batch's old ``part-b<batch>-`` files are replaced: each fact once; files of
    other batches and of other queries stay."""
    require_spark_cli()
    import pyarrow.parquet as pq

    db = f"sqlite:///{tmp_path / 'w.sqlite'}"
    produce(db, 2, seed=4)
    out, ck = tmp_path / "pq", tmp_path / "ck"
    dirs, bystanders = _old_version_state(db, out, ck)
    want = db_rows(db)
    assert sum(want.values()) > 100
    assert parquet_rows(str(out), db + "#") == want  # what the interrupted attempt had published

    done = run_stream("--db", db, "--out", str(out), "--checkpoint", str(ck), "--trigger", "0.5",
                      "--stop-when-idle", "3")
    assert done.returncode == 0 and "batch 0: " in done.stderr, done.stderr
    got = parquet_rows(str(out), db + "#")
    assert got == want, f"{sum(got.values())} rows for {sum(want.values())} facts"
    sources = collections.Counter(pq.read_table(out, columns=["source_file"])["source_file"].to_pylist())
    assert sum(n for s, n in sources.items() if s.startswith("sqlite:///elsewhere.sqlite#")) == bystanders
    names = [p.name for p in out.rglob("*.parquet")]
    assert not [n for n in names if n.startswith(_OLD0)], names
    assert sum(n.startswith("part-b000000000001-") for n in names) == dirs


def test_only_a_batch_an_earlier_version_left_unfinished_is_taken_for_one(tmp_path: Path) -> None:
    """old_version_rerun: a checkpoint without published.json whose last started batch is not committed names it;
    any other start (a new checkpoint, one whose batches all finished) gets an empty note instead, so an
    interrupted attempt of this version is never taken for an earlier version's."""
    require(module="pyspark", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")
    require(module="pyarrow", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")
    from factstream.spark.streaming import PUBLISHED, old_version_rerun

    new = tmp_path / "new"
    assert old_version_rerun(str(new)) is None
    assert json.loads((new / "staging" / PUBLISHED).read_text()) == {"batch": -1, "files": []}
    (new / "query" / "offsets").mkdir(parents=True)
    (new / "query" / "offsets" / "0").write_text("v1\n{}\n{}")
    assert old_version_rerun(str(new)) is None  # this version's batch 0, interrupted: not an earlier version's

    old = tmp_path / "old"
    for log, ids in (("offsets", (0, 1, 2)), ("commits", (0, 1))):
        (old / "query" / log).mkdir(parents=True)
        for i in ids:
            (old / "query" / log / str(i)).write_text("v1\n{}\n{}")
            (old / "query" / log / f".{i}.crc").write_text("")
    (old / "staging").mkdir()
    assert old_version_rerun(str(old)) == 2
    assert not (old / "staging" / PUBLISHED).exists()  # written by the batch, once its old files are gone
    (old / "query" / "commits" / "2").write_text("v1\n{}")
    assert old_version_rerun(str(old)) is None  # every batch finished: nothing to re-run
    assert (old / "staging" / PUBLISHED).exists()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_files_batch_interrupted_by_an_earlier_version_is_not_written_twice(tmp_path: Path) -> None:
    """``--files``: batch 0 published and not committed, its files under the earlier version's names and no
    note (made from a run of this version: files renamed, note and commit removed); the re-run leaves each line once."""
    require_spark_cli()
    import pyarrow.dataset as ds

    src = tmp_path / "in"
    src.mkdir()
    lines = 0
    for f in range(3):
        text = "".join(f"POSITION events master {t - 1} {t}\n" for t in range(1 + f * 100, 101 + f * 100))
        (src / f"hs1.{f}.log.gz").write_bytes(gzip.compress(text.encode()))
        lines += 100
    out, ck = tmp_path / "pq", tmp_path / "ck"
    args = ("--files", str(src), "--out", str(out), "--checkpoint", str(ck), "--trigger", "0.5", "--stop-when-idle", "3")

    def rows() -> int:
        return ds.dataset(str(out), format="parquet").count_rows()

    done = run_stream(*args)
    assert done.returncode == 0 and rows() == lines, done.stderr
    published = list(out.rglob("part-*-b000000000000-*.parquet"))
    assert published, sorted(p.name for p in out.rglob("*.parquet"))
    for path in published:  # as the earlier version named them
        path.rename(path.with_name(_OLD0 + path.name.split("-b000000000000-", 1)[1]))
    (ck / "staging" / "published.json").unlink()
    for name in ("0", ".0.crc"):
        (ck / "query" / "commits" / name).unlink(missing_ok=True)
    assert rows() == lines

    done = run_stream(*args)
    assert done.returncode == 0 and "batch 0" in done.stderr, done.stderr
    assert rows() == lines, f"{rows()} rows for {lines} lines"
    assert not [p.name for p in out.rglob(f"{_OLD0}*")]
