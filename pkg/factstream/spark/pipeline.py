"""The Spark job: archive files -> typed DataFrame -> Parquet.

The driver lists the files and cuts them into chunks (see :mod:`.sources`);
one Spark task per chunk reads its lines and parses them with
:func:`.lines.parse_file_blocks` inside ``mapInArrow`` (why ``mapInArrow`` and not an
Arrow pandas UDF: BENCHMARKS.md). Columns are described in docs/spark.md.
"""

from __future__ import annotations

import functools
import gc
import heapq
import os
from contextlib import contextmanager
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .lines import SPARK_DDL, ParseOptions, parse_block, parse_file_blocks
from .sources import (
    CHUNKS_PER_CORE,
    DEFAULT_CHUNK_BYTES,
    Chunk,
    archive_formats,
    count_newlines,
    list_files,
    plan_chunks,
    read_chunk_blocks,
)
from .session import session_cores

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from .damage import DamagedInputs

__all__ = ["parse_archives", "parse_text_column", "write_parquet", "plan", "TASK_DDL", "PARTITION_COLUMNS", "output_clashes",
           "HadoopPath"]

#: One row per Spark task: a chunk, where its line numbering starts, its format.
TASK_DDL = "path string, start bigint, end bigint, size bigint, newlines_before bigint, format string"

def plan(
    spark: SparkSession,
    inputs: Sequence[str],
    fmt: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    parallelism: int | None = None,
) -> list[tuple[str, int, int, int, int, str]]:
    """The task rows (see TASK_DDL) for ``inputs``: files found, formats detected, chunks numbered.

    Files are cut for ``parallelism`` cores (default: the session's, see
    :func:`.session.session_cores`) as :func:`.sources.plan_chunks` says.
    """
    return _plan(spark, inputs, fmt, chunk_bytes, parallelism)[0]


def _plan(
    spark: SparkSession, inputs: Sequence[str], fmt: str, chunk_bytes: int, parallelism: int | None,
    skipped: list[str] | None = None,
) -> tuple[list[tuple[str, int, int, int, int, str]], int | None]:
    """:func:`plan`'s rows, and the cores they were planned for (None: unknown, or it made no difference).

    ``skipped`` (if given) gets the files left out: unreadable, or in no format.
    """
    files = list_files(inputs)
    formats, left_out = archive_formats(files, fmt)  # files in no known format are skipped with a warning
    if skipped is not None:
        skipped.extend(left_out)
    files = [(path, size) for path, size in files if path in formats]
    splittable = [(path, size) for path, size in files if formats[path] != "redis-raw"]  # its records span lines
    if parallelism is None and len(plan_chunks(splittable, chunk_bytes, 1)) != len(plan_chunks(splittable, chunk_bytes)):
        parallelism = session_cores(spark)  # only when the cores make a difference: on a cluster this may wait
    chunks = plan_chunks(splittable, chunk_bytes, parallelism)
    chunks += [Chunk(path, 0, size, size) for path, size in files if formats[path] == "redis-raw"]
    chunks.sort(key=lambda c: (c.path, c.start))
    # Line numbers of later chunks need the newlines before them: count them in parallel.
    # One task per core, not per chunk: counting is memchr-fast, a Python task's start-up is not.
    to_count = [c for c in chunks if not c.gzip and c.end < c.size]
    counts: dict[tuple[str, int], int] = {}
    if to_count:
        sc = spark.sparkContext
        sc.setJobDescription("factstream: counting lines of split files")
        try:
            slices = max(1, min(len(to_count), sc.defaultParallelism))
            got = sc.parallelize(to_count, slices).map(lambda c: ((c.path, c.start), count_newlines(c))).collect()
        finally:
            sc.setJobDescription(None)  # type: ignore[arg-type]
        counts = dict(got)
    rows = []
    before = 0
    for chunk in chunks:
        if chunk.start == 0:
            before = 0
        rows.append((chunk.path, chunk.start, chunk.end, chunk.size, before, formats[chunk.path]))
        before += counts.get((chunk.path, chunk.start), 0)
    return rows, parallelism


def _groups(rows: Sequence[tuple[str, int, int, int, int, str]], cores: int | None) -> list[list[int]]:
    """The chunks (indices into ``rows``) each Python task parses: CHUNKS_PER_CORE tasks per core at most.

    Many small files would otherwise be as many tasks, each paying a Python
    task's fixed cost; like Spark's file partitions, several go into one
    task, the largest first into the least loaded (by bytes).
    """
    if cores is None or len(rows) <= CHUNKS_PER_CORE * cores:
        return [[i] for i in range(len(rows))]
    loads = [(0, k) for k in range(CHUNKS_PER_CORE * cores)]
    groups: list[list[int]] = [[] for _ in loads]
    for i in sorted(range(len(rows)), key=lambda i: rows[i][1] - rows[i][2]):
        load, k = heapq.heappop(loads)
        groups[k].append(i)
        heapq.heappush(loads, (load + rows[i][2] - rows[i][1], k))
    return [sorted(g) for g in groups if g]


def _parse_tasks(  # type: ignore[no-untyped-def]
    rows: Sequence[tuple[str, int, int, int, int, str]], groups: Sequence[Sequence[int]], typed: bool,
    batch_rows: int, session_time_zone: str, damaged: DamagedInputs | None = None,
):
    """The ``mapInArrow`` function: its input is the ``id`` of ``spark.range``, an index into ``groups``."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with _no_gc():
            yield from _tasks(batches)

    def _tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in (i for g in batch.column(0).to_pylist() for i in groups[g]):
                path, start, end, size, newlines_before, fmt = rows[index]
                chunk = Chunk(path, start, end, size)
                # One-line formats: the builder walks the bytes itself. A last line without a newline
                # (a file cut short or still being written) comes out malformed, never parsed.
                first_line, blocks = read_chunk_blocks(
                    chunk, newlines_before, on_damage=None if damaged is None else damaged.add
                )
                yield from parse_file_blocks(
                    blocks, source=chunk.path, first_line=first_line, fmt=fmt, typed=typed, batch_rows=batch_rows,
                    session_time_zone=session_time_zone,
                )

    return run


@contextmanager
def _no_gc() -> Iterator[None]:
    """Parsing allocates millions of acyclic objects; the cycle collector only slows it down."""
    _freeze_worker_once()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_FROZEN = False


def _freeze_worker_once() -> None:
    """In a Spark Python worker, put what it holds for good out of the cycle collector's reach, once.

    pyspark's daemon runs a full ``gc.collect()`` after every task of a reused
    worker; over the ~80,000 objects a worker holds once pyarrow, pyspark and
    factstream are imported that is 10-25 ms of CPU per task, i.e. per chunk.
    ``gc.freeze()`` at the first task moves them to the permanent generation,
    so later collections only look at what tasks create. Outside a Spark task
    (a test calling the function directly) nothing is frozen.
    """
    global _FROZEN
    if _FROZEN:
        return
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        gc.collect()
        gc.freeze()
        _FROZEN = True


def _session_time_zone(spark: SparkSession) -> str:
    return spark.conf.get("spark.sql.session.timeZone") or "UTC"


def parse_archives(
    spark: SparkSession,
    inputs: Sequence[str],
    options: ParseOptions | None = None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    batch_rows: int = 16384,
    parallelism: int | None = None,
    skipped: list[str] | None = None,
    damaged: DamagedInputs | None = None,
) -> DataFrame:
    """Parse archive files, directories or globs into a DataFrame (one row per line; see docs/spark.md).

    Nothing is read on the executors until an action runs; listing, format
    detection and line counting of split files happen here. Plain files are
    cut into chunks of at least ``chunk_bytes`` (0: never), only as far as
    ``parallelism`` cores need (default: the session's); one chunk is one
    Python task. ``skipped`` (if given) gets the files left out as the job is
    planned: unreadable, or (format "auto") in no archive format. A gzip file
    that breaks (truncated, corrupt) gives the lines before the break;
    ``damaged`` (if given) names it once an action has run the parse.
    """
    options = options or ParseOptions()
    rows, cores = _plan(spark, inputs, options.format, chunk_bytes, parallelism, skipped)
    if cores is None and len(rows) > CHUNKS_PER_CORE:
        cores = parallelism or session_cores(spark)
    groups = _groups(rows, cores)
    # One partition per task (a group of chunks), made by the JVM (spark.range): the plan travels in the
    # function's closure, so no Python pass turns driver-side rows into Spark rows before the parse (that was
    # a second Python worker round trip per task).
    tasks = spark.range(0, len(groups), 1, max(1, len(groups)))
    # The executors return finished columns (ts and date included): no projection on top.
    parse = _parse_tasks(rows, groups, options.typed, batch_rows, _session_time_zone(spark), damaged)
    return tasks.mapInArrow(parse, SPARK_DDL)


def _parse_column(column: str, typed: bool, fmt: str, session_time_zone: str):  # type: ignore[no-untyped-def]
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with _no_gc():
            yield from _batches(batches)

    def _batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            # as bytes: Spark's text source passes invalid UTF-8 through, the codec reports it
            values = batch.column(column).cast(pa.binary()).to_pylist()
            lines = [b"" if v is None else v for v in values]
            yield from parse_block(
                lines, source="", fmt=fmt, typed=typed, batch_rows=len(lines) + 1, session_time_zone=session_time_zone
            )

    return run


def parse_text_column(df: DataFrame, column: str = "value", options: ParseOptions | None = None) -> DataFrame:
    """Parse lines already in a DataFrame column (e.g. ``spark.read.text``) with ``mapInArrow``.

    Without byte offsets there are no line numbers: ``line_number`` counts
    within each Arrow batch only and ``source_file`` is empty. Prefer
    :func:`parse_archives` for files.
    """
    options = options or ParseOptions(format="lines")
    fmt = "lines" if options.format == "auto" else options.format
    parse = _parse_column(column, options.typed, fmt, _session_time_zone(df.sparkSession))
    return df.select(column).mapInArrow(parse, SPARK_DDL)


#: The output's partition columns, outermost first: its directories are OUT/date=.../stream=.../part-*.parquet.
PARTITION_COLUMNS = ("date", "stream")


def write_parquet(df: DataFrame, out: str, mode: str = "errorifexists") -> None:
    """Write parsed lines as Parquet partitioned by ``date`` and ``stream``.

    ``mode`` is Spark's save mode: errorifexists (default), overwrite
    (replaces the dates/streams written again), append, ignore. Check an
    existing ``out`` with :func:`output_clashes` first.
    """
    df.write.mode(mode).partitionBy(*PARTITION_COLUMNS).parquet(out)


#: The entries of a directory of OUT given relative to OUT ("" is OUT itself): (name, whether it is a directory).
Entries = Callable[[str], "list[tuple[str, bool]]"]


def output_clashes(out: str, entries: Entries | None = None) -> tuple[list[str], list[str]]:
    """What in the existing directory ``out`` is not this layout: (files in its places, other names).

    Spark's commit puts a partition directory where a regular file of that
    name is (``date=X`` or ``date=X/stream=Y``) by deleting the file, in
    append and overwrite modes alike, without a word; anything else beside
    the partitions is left alone but makes ``out`` unreadable as one dataset
    (Spark: conflicting directory structures). Both lists hold paths relative
    to ``out``, sorted; names starting with '.' or '_' (``_SUCCESS``, checksum
    files, 'logs stream' notes) are ignored as Spark ignores them, and so is
    what the partition directories hold (data files, replaced only by an
    overwrite of their partition). ``out`` is a local directory, listed with
    os.scandir, unless ``entries`` lists it (:meth:`HadoopPath.entries`: any
    filesystem Spark writes to). Raises OSError if a local directory cannot
    be listed.
    """
    files: list[str] = []
    others: list[str] = []
    listed = entries or functools.partial(_local_entries, out)

    def walk(rel: str, level: int) -> None:
        for name, is_dir in sorted(listed(rel)):
            if name.startswith((".", "_")):
                continue
            path = f"{rel}/{name}" if rel else name
            if not name.startswith(f"{PARTITION_COLUMNS[level]}="):
                others.append(path)
            elif not is_dir:
                files.append(path)
            elif level + 1 < len(PARTITION_COLUMNS):
                walk(path, level + 1)

    walk("", 0)
    return files, others


def _local_entries(out: str, rel: str) -> list[tuple[str, bool]]:
    with os.scandir(os.path.join(out, rel)) as found:
        return [(entry.name, entry.is_dir()) for entry in found]  # is_dir follows links: a link to a directory is one


class HadoopPath:
    """A path as Spark's Hadoop FileSystem sees it (any scheme Spark writes to: hdfs://, s3a://, viewfs://, file:).

    What os.path tells of a local path, asked through the driver's JVM:
    whether it exists and is a directory, and what a directory holds. The
    JVM's exceptions (py4j's Py4JJavaError) come through: no filesystem for
    the scheme, a host that does not answer, a directory that cannot be listed.
    """

    def __init__(self, spark: SparkSession, path: str) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self._path = jvm.org.apache.hadoop.fs.Path(path)
        self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())
        self._dirs: dict[str, Any] = {"": self._path}  # directories listed or seen, relative to this path

    def kind(self) -> str | None:
        """"dir", "file", or None when nothing is there."""
        if not self._fs.exists(self._path):
            return None
        return "dir" if self._fs.getFileStatus(self._path).isDirectory() else "file"

    def entries(self, rel: str = "") -> list[tuple[str, bool]]:
        """(name, is a directory) of what the directory ``rel`` holds: this path (""), or one listed here before.

        (A name is never parsed back into a Hadoop path: "date=12:00" is no URI.)
        """
        found = []
        for status in self._fs.listStatus(self._dirs[rel]):
            name, is_dir = str(status.getPath().getName()), bool(status.isDirectory())
            if is_dir:
                self._dirs[f"{rel}/{name}" if rel else name] = status.getPath()
            found.append((name, is_dir))
        return found
