"""``factstream logs parse --out URL``: the checks of an existing --out hold on every filesystem Spark writes to.

The installed executable in a subprocess. A local --out (an earlier output
with --mode append or overwrite) is checked before Spark starts: a regular
file where a partition directory goes, which Spark deletes without a word,
or anything else beside the partitions is refused (test_cli_logs_append_guard.py).
A URL of any other scheme bypassed that: Spark wrote into someone's
directory ("the Spark job failed: CONFLICTING_DIRECTORY_STRUCTURES", exit
1, their directory spoiled) and deleted a file in a partition's place,
exit 0. Here such a filesystem is ``viewfs://``, a Hadoop filesystem mounted
on a local directory, which os.path cannot see: now it is asked through
Spark's JVM (Hadoop's FileSystem API) before the job, with the same words.
``file:`` URLs Hadoop reads as local paths were half-understood: ``FILE:///x``
(the scheme in capitals) bypassed the checks, ``file:/x`` (Hadoop's own
spelling) was refused as a directory "file:" below the working directory,
``file://host/x`` likewise; now the first two are local paths, and a URL Hadoop
cannot use is said so at once.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli_run import ENV, FACTSTREAM, LOCAL_SPARK, no_traceback, require_spark_cli

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

ROW = '["!r:hs",["@a:hs"]]'
ARCHIVE = f"2026-11-24T11:00:00.000000Z > RDATA events master 1 {ROW}\nRDATA typing master 1 {ROW}\n"


def parse(tmp_path: Path, out: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``factstream logs parse ARCHIVE --out OUT ARGS`` in ``tmp_path`` (a relative --out lands there) with
    viewfs:///data mounted on it; Spark's log under ``tmp_path/tmp``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    mount = ("--conf", f"spark.hadoop.fs.viewfs.mounttable.default.link./data=file://{tmp_path}")
    return subprocess.run([FACTSTREAM, "logs", "parse", str(tmp_path / "wire.log"), "--out", out, *args, *LOCAL_SPARK,
                           *mount], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**ENV, "TMPDIR": str(tmp)})


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in [root, *root.rglob("*")]}


@pytest.fixture()
def mine(tmp_path: Path) -> Path:
    """The archive, and someone's directory that is no 'logs parse' output."""
    require_spark_cli("pandas")
    (tmp_path / "wire.log").write_text(ARCHIVE)
    out = tmp_path / "mine"
    (out / "photos").mkdir(parents=True)
    (out / "photos" / "a.jpg").write_bytes(b"\xff\xd8 a photo")
    (out / "notes.txt").write_text("my notes\n")
    return out


def refused(done: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and no_traceback(done.stderr)
    assert "the Spark job failed" not in done.stderr
    assert sorted((tmp_path / "tmp").glob("factstream-spark-*")) == []  # the user's path: no log kept


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_directory_on_another_filesystem_is_checked_before_the_job(mine: Path, tmp_path: Path, mode: str) -> None:
    before = snapshot(mine)
    url = "viewfs:///data/mine"
    done = parse(tmp_path, url, "--mode", mode)
    refused(done, tmp_path)
    assert done.stderr == (f"factstream logs: --out {url} is not the output of 'logs parse' (it holds {url}/notes.txt, "
                           f"{url}/photos): --mode {mode} adds only to such a directory; choose a new --out, or move "
                           "those out of it (nothing was written)\n"), done.stderr
    assert snapshot(mine) == before


def test_a_file_where_a_partition_goes_on_another_filesystem_is_kept(mine: Path, tmp_path: Path) -> None:
    """Spark deleted it (exit 0, not a word): an earlier output, and a file of the user's named like a partition."""
    url = "viewfs:///data/out"
    done = parse(tmp_path, url)
    assert done.returncode == 0, done.stderr
    precious = tmp_path / "out" / "date=2026-11-24" / "stream=events"
    for part in precious.iterdir():
        part.unlink()
    precious.rmdir()
    precious.write_bytes(b"the user's own file\n")
    before = snapshot(tmp_path / "out")
    done = parse(tmp_path, url, "--mode", "append")
    refused(done, tmp_path)
    assert done.stderr == (f"factstream logs: {url}/date=2026-11-24/stream=events is a file where 'logs parse' writes a "
                           f"partition directory: move it out of {url}, or choose another --out (nothing was written)\n")
    assert snapshot(tmp_path / "out") == before
    # and what is 'logs parse' output is still added to, there too
    done = parse(tmp_path, "viewfs:///data/fresh")
    assert done.returncode == 0 and done.stderr.endswith("wrote 2 lines (0 malformed) to viewfs:///data/fresh\n")
    done = parse(tmp_path, "viewfs:///data/fresh", "--mode", "append")
    assert done.returncode == 0 and done.stderr.endswith("wrote 4 lines (0 malformed) to viewfs:///data/fresh\n")
    done = parse(tmp_path, "viewfs:///data/fresh")
    refused(done, tmp_path)
    assert done.stderr == "factstream logs: viewfs:///data/fresh already exists; use --mode overwrite or --mode append\n"


def test_a_file_as_out_on_another_filesystem_and_a_scheme_hadoop_lacks(mine: Path, tmp_path: Path) -> None:
    done = parse(tmp_path, "viewfs:///data/mine/notes.txt", "--mode", "append")
    refused(done, tmp_path)
    assert done.stderr == ("factstream logs: --out viewfs:///data/mine/notes.txt is a file, not a directory: name a new "
                           "directory for the Parquet, or the output of an earlier 'logs parse' with --mode append or "
                           "overwrite\n")
    done = parse(tmp_path, "nofs:///data/x")
    refused(done, tmp_path)
    assert done.stderr == ('factstream logs: --out nofs:///data/x: No FileSystem for scheme "nofs"; this Spark has no '
                           "filesystem for nofs://: add its Hadoop connector with --conf "
                           "spark.jars.packages=GROUP:ARTIFACT:VERSION (nothing was written)\n")
    done = parse(tmp_path, "s3a://bucket/x")  # a scheme Hadoop knows, whose connector is not on Spark's classpath
    refused(done, tmp_path)
    assert "S3AFileSystem not found; this Spark has no filesystem for s3a://" in done.stderr, done.stderr
    assert "org.apache.hadoop:hadoop-aws" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my notes\n"


@pytest.mark.parametrize("form", ["FILE://{}", "file:{}", "File:{}"])
def test_file_urls_hadoop_reads_as_local_paths_are_checked_as_such(
    mine: Path, tmp_path: Path, form: str
) -> None:
    """Checked before Spark starts, as the plain path is: no Spark log made at all."""
    before = snapshot(mine)
    url = form.format(mine)
    done = parse(tmp_path, url, "--mode", "append")
    refused(done, tmp_path)
    assert done.stderr == (f"factstream logs: --out {url} is not the output of 'logs parse' (it holds {url}/notes.txt, "
                           f"{url}/photos): --mode append adds only to such a directory; choose a new --out, or move "
                           "those out of it (nothing was written)\n"), done.stderr
    assert snapshot(mine) == before
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("url", ["file://localhost{}", "file:mine"])
def test_a_file_url_hadoop_cannot_use_is_said_at_once(mine: Path, tmp_path: Path, url: str) -> None:
    url = url.format(mine)
    done = parse(tmp_path, url, "--mode", "append")
    refused(done, tmp_path)
    assert done.stderr == (f"factstream logs: --out {url}: a file: URL names a local path, absolute and without a host: "
                           "file:///PATH, or the path itself\n"), done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "tmp", "wire.log"]  # (was written to ./file:mine)


def test_a_file_url_is_written_where_it_says(tmp_path: Path) -> None:
    """file:/x is /x: a new output there, written beside it under a hidden name and renamed."""
    require_spark_cli("pandas")
    (tmp_path / "wire.log").write_text(ARCHIVE)
    done = parse(tmp_path, f"file:{tmp_path}/pq")
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(f"wrote 2 lines (0 malformed) to file:{tmp_path}/pq\n"), done.stderr
    assert len(list((tmp_path / "pq").rglob("part-*.parquet"))) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pq", "tmp", "wire.log"]


def test_a_report_on_a_scheme_whose_connector_spark_lacks_says_to_add_it(tmp_path: Path) -> None:
    """``logs report s3a://...`` without hadoop-aws said only Java's "Class ...S3AFileSystem not found"."""
    require_spark_cli()
    done = subprocess.run([FACTSTREAM, "logs", "report", "s3a://bucket/parsed", *LOCAL_SPARK], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env={**ENV, "TMPDIR": str(tmp_path)})
    assert done.returncode == 2 and no_traceback(done.stderr), done
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("factstream logs: cannot read Parquet from s3a://bucket/parsed: "), done.stderr
    assert "this Spark has no filesystem for s3a://: add its Hadoop connector with --conf spark.jars.packages=" \
        in done.stderr and "hadoop-aws" in done.stderr, done.stderr
