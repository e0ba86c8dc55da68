"""``factstream logs parse --out OUT`` into an OUT that exists: nothing of the user's is destroyed without a word.

The installed executable in a subprocess. Spark's commit puts a partition
directory where a regular file of that name is (OUT/date=..., or
OUT/date=.../stream=...) by deleting the file: --mode append did so at both
levels and --mode overwrite at the stream level, exit 0, no message. And a
directory holding other things was written into all the same, then failed
the count ("the Spark job failed: CONFLICTING_DIRECTORY_STRUCTURES", exit 1),
left unreadable as one dataset. Now an existing OUT is checked before Spark
starts: what is not 'logs parse' output is refused in one line naming it
(exit 2), every byte left as it was. An earlier output, hidden files and a
'logs stream' note beside it, is still added to.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli_run import cli, no_traceback, require_spark_cli

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
ROW = '["!r:hs",["@a:hs"]]'
#: One line of 2026-11-24 on stream events, one without a timestamp on typing: the partitions
#: date=2026-11-24/stream=events and date=__HIVE_DEFAULT_PARTITION__/stream=typing.
ARCHIVE = f"2026-11-24T11:00:00.000000Z > RDATA events master 1 {ROW}\nRDATA typing master 1 {ROW}\n"


def parse(tmp: Path, archive: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``factstream logs parse ARCHIVE --out OUT ARGS``, its temporary files (Spark's log) under ``tmp``."""
    tmp.mkdir(exist_ok=True)
    return cli("logs", "parse", str(archive), "--out", str(out), *args, *SPARK, timeout=600, TMPDIR=str(tmp))


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (itself included) and a file's bytes (None: a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in [root, *root.rglob("*")]}


@pytest.fixture()
def archive(tmp_path: Path) -> Path:
    require_spark_cli("pandas")
    path = tmp_path / "wire.log"
    path.write_text(ARCHIVE)
    return path


@pytest.mark.parametrize("mode", ["append", "overwrite"])
@pytest.mark.parametrize(
    "where", ["date=2026-11-24/stream=events", "date=2026-11-24", "date=__HIVE_DEFAULT_PARTITION__/stream=typing"]
)
def test_a_file_where_a_partition_goes_is_refused_and_kept(archive: Path, tmp_path: Path, mode: str, where: str) -> None:
    out = tmp_path / "out"
    precious = out / where
    precious.parent.mkdir(parents=True)
    precious.write_bytes(b"the user's own file\n\x00\xff")
    before = snapshot(out)
    done = parse(tmp_path / "tmp", archive, out, "--mode", mode)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (f"factstream logs: {precious} is a file where 'logs parse' writes a partition directory: "
                           f"move it out of {out}, or choose another --out (nothing was written)\n"), done.stderr
    assert precious.read_bytes() == b"the user's own file\n\x00\xff"
    assert snapshot(out) == before  # nothing beside it either
    assert list((tmp_path / "tmp").iterdir()) == []  # refused before Spark started: no log of it


@pytest.mark.parametrize("mode", ["error", "append", "overwrite"])
def test_an_out_that_is_a_file_is_refused_and_kept(archive: Path, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out.parquet"
    out.write_bytes(b"PAR1 not a directory")
    done = parse(tmp_path / "tmp", archive, out, "--mode", mode)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (f"factstream logs: --out {out} is a file, not a directory: name a new directory for the "
                           "Parquet, or the output of an earlier 'logs parse' with --mode append or overwrite\n")
    assert out.read_bytes() == b"PAR1 not a directory"


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_directory_that_is_not_logs_parse_output_is_refused_untouched(
    archive: Path, tmp_path: Path, mode: str
) -> None:
    """Someone's directory: Spark wrote its partitions beside the user's things, then failed reading them back."""
    out = tmp_path / "mine"
    (out / "photos").mkdir(parents=True)
    (out / "photos" / "a.jpg").write_bytes(b"\xff\xd8 a photo")
    (out / "notes.txt").write_text("my notes\n")
    (out / "date=2026-11-24").mkdir()  # looks like a partition, holds something else
    (out / "date=2026-11-24" / "todo").write_text("later\n")
    before = snapshot(out)
    done = parse(tmp_path / "tmp", archive, out, "--mode", mode)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert done.stderr == (f"factstream logs: --out {out} is not the output of 'logs parse' (it holds "
                           f"{out}/date=2026-11-24/todo, {out}/notes.txt, {out}/photos): --mode {mode} adds only to "
                           "such a directory; choose a new --out, or move those out of it (nothing was written)\n")
    assert snapshot(out) == before


def test_logs_parse_output_is_still_added_to_and_overwritten(archive: Path, tmp_path: Path) -> None:
    """The normal cases: an empty directory, then an earlier output with Spark's and 'logs stream''s hidden names."""
    out = tmp_path / "out"
    out.mkdir()
    done = parse(tmp_path / "tmp", archive, out, "--mode", "append")
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(f"wrote 2 lines (0 malformed) to {out}\n"), done.stderr
    (out / "_factstream_streams").mkdir()  # what 'logs stream' leaves beside the partitions
    (out / "_factstream_streams" / "query").write_text("{}\n")
    (out / ".DS_Store").write_bytes(b"\x00")
    done = parse(tmp_path / "tmp", archive, out, "--mode", "append")
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(f"wrote 4 lines (0 malformed) to {out}\n"), done.stderr  # OUT's lines in all
    assert len(list((out / "date=2026-11-24" / "stream=events").glob("part-*.parquet"))) == 2
    done = parse(tmp_path / "tmp", archive, out, "--mode", "overwrite")
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(f"wrote 2 lines (0 malformed) to {out}\n"), done.stderr
    assert (out / "_factstream_streams" / "query").read_text() == "{}\n" and (out / ".DS_Store").exists()
