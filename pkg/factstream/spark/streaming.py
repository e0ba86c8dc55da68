"""Live replication into Parquet with Spark Structured Streaming, exactly once.

The source (:class:`ReplicationDataSource`, format ``"factstream"``) is a
Spark 4 Python data source reading a factstream writer's *database*, the
source of truth replication itself falls back on for catch-up:

* an offset is the positions themselves, ``{stream: {writer: token}}``;
* the latest offset is each writer's recorded position (``stream_positions``),
  which a writer only advances over completed ids, so every row at or below
  it is committed and never changes;
* a micro-batch from offset ``a`` to ``b`` reads, per (stream, writer), the
  rows with tokens in ``(a, b]`` from the stream's table, on the executors.

Reading ``(a, b]`` again gives the same rows, so when Spark re-runs a batch
after a crash (its offset log says which), the data is identical. The sink
(:func:`publish_batch`, through ``foreachBatch``) makes the re-run harmless:
Spark writes the batch to a staging directory, then its files are renamed
into the output as ``part-b<batch id>-...``, after deleting any such files
an interrupted earlier attempt left. Hence nothing lost (offsets only move
after the batch is published), nothing duplicated (a batch's files are
replaced, never added twice). The output has the columns and layout of
``logs parse`` (Parquet partitioned by date and stream), so ``logs report``
reads both. Each fact becomes the RDATA line a reader would have received,
parsed by the archive builder; ``ts`` is when the query read it,
``line_number`` its token, ``source_file`` ``<database URL, password
masked>#<stream>/<writer>``.

Redis pub/sub cannot replay, so no streaming source on it can be exactly
once; record it with ``factstream record`` into closed files and parse those
(docs/spark.md, "Streaming").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from .lines import SPARK_DDL, parse_block

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from ..replication.tables import StreamTable

__all__ = [
    "SOURCE_NAME",
    "ReplicationDataSource",
    "ReplicationStreamReader",
    "FactRange",
    "SourceProblem",
    "check_source",
    "select_streams",
    "publish_batch",
    "start_stream",
    "run_stream",
]

SOURCE_NAME = "factstream"
Offset = dict[str, dict[str, int]]


def _tables(option: str | None) -> dict[str, StreamTable]:
    """Stream -> StreamTable of the ``tables`` option (a JSON list, see ``tables_to_json``)."""
    from ..replication.tables import tables_from_json

    if not option:
        raise ValueError(
            "the factstream source needs the 'tables' option: a JSON list of the writer's stream tables "
            "(factstream.replication.tables.tables_to_json)"
        )
    return tables_from_json(option)


def _run(coro: Any) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _recorded_positions(url: str, streams: Sequence[str]) -> Offset:
    from ..store.database import connect

    db = await connect(url, max_connections=1)
    try:
        try:
            rows = await db.fetchall("SELECT stream_name, instance_name, stream_id FROM stream_positions", ())
        except Exception:  # noqa: BLE001 - no writer has recorded a position yet
            return {}
    finally:
        await db.close()
    out: Offset = {}
    for stream, writer, token in rows:
        if stream in streams:
            out.setdefault(str(stream), {})[str(writer)] = int(token)
    return out


class SourceProblem(Exception):
    """The database cannot serve the query (unreachable, or without the streams' tables): say so before Spark runs."""


def select_streams(tables: Mapping[str, StreamTable], wanted: str | Sequence[str] | None) -> list[str]:
    """The streams to follow: ``wanted`` (comma list or names), all of ``tables`` if none.

    Raises ValueError naming the unknown streams and the known ones.
    """
    names = wanted.split(",") if isinstance(wanted, str) else list(wanted or ())
    chosen = [s.strip() for s in names if s.strip()]
    unknown = [s for s in chosen if s not in tables]
    if unknown:
        raise ValueError(f"unknown stream(s) {', '.join(unknown)}; known: {', '.join(sorted(tables))}")
    return chosen or sorted(tables)


async def _missing_tables(url: str, tables: Sequence[StreamTable]) -> list[str]:
    """What of ``tables`` (table or column) the database at ``url`` lacks."""
    from ..store.database import connect

    db = await connect(url, max_connections=1)
    try:
        missing = []
        for t in tables:
            try:
                await db.fetchall(f"SELECT stream_id, instance_name, {', '.join(t.columns)} FROM {t.table} WHERE 1 = 0", ())
            except Exception:  # noqa: BLE001 - the driver's own "no such table/column"
                missing.append(f"{t.stream} ({t.table})")
        return missing
    finally:
        await db.close()


def check_source(url: str, tables: Mapping[str, StreamTable], streams: Sequence[str], timeout: float = 10.0) -> None:
    """Raise SourceProblem unless ``url`` can be reached and holds the tables of ``streams``.

    Run on the driver before the query starts: from inside Spark a missing
    database is only "Failed when Python streaming data source perform
    latestOffset", after the JVM started and the checkpoint was made.
    """
    from ..redaction import redact_url
    from ..store.database import DatabaseError

    try:
        missing = _run(asyncio.wait_for(_missing_tables(url, [tables[s] for s in streams]), timeout))
    except DatabaseError as err:
        raise SourceProblem(str(err)) from None
    except TimeoutError:
        raise SourceProblem(f"no answer from {redact_url(url)} within {timeout:g} s; check the host and port") from None
    if missing:
        raise SourceProblem(
            f"{redact_url(url)} has no usable table for stream(s) {', '.join(missing)} (each needs stream_id, "
            "instance_name and the stream's columns): not the database of a writer of these streams? Give the "
            "writer's --db, choose --streams, or describe its tables with --tables"
        )


class FactRange(InputPartition):
    """Rows of one (stream, writer) with tokens in ``(start, end]``: one Spark task."""

    def __init__(self, stream: str, writer: str, start: int, end: int) -> None:
        super().__init__((stream, writer, start, end))
        self.stream, self.writer, self.start, self.end = stream, writer, start, end


class ReplicationStreamReader(DataSourceStreamReader):
    """Offsets are positions; see the module docstring for why this is exactly once.

    The constructor never raises: pyspark's stream-reader runner calls
    ``reader.stop()`` in a ``finally`` that also covers the constructor, so an
    exception here surfaced as "UnboundLocalError: ... 'reader'" instead of
    itself. A bad option is raised by the first call instead.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = options.get("db") or ""
        self.tables_option = options.get("tables")
        self.streams: list[str] = []
        self.problem: Exception | None = None
        try:
            if not self.url:
                raise ValueError("the factstream source needs the 'db' option: the writer's database URL")
            self.streams = select_streams(_tables(self.tables_option), options.get("streams"))
            self.tokens_per_task = int(options.get("tokensPerTask", "50000"))
            self.page_rows = int(options.get("pageRows", "5000"))
        except Exception as err:  # noqa: BLE001 - raised again by the first call (see the class docstring)
            self.problem = err

    def _check(self) -> None:
        if self.problem is not None:
            raise self.problem

    def initialOffset(self) -> dict[str, Any]:
        self._check()
        return {s: {} for s in self.streams}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        self._check()
        recorded = _run(_recorded_positions(self.url, self.streams))
        out: dict[str, Any] = {s: dict((start or {}).get(s, {})) for s in self.streams}
        for stream, writers in recorded.items():
            for writer, token in writers.items():
                out[stream][writer] = max(token, out[stream].get(writer, 0))
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._check()
        parts: list[InputPartition] = []
        for stream in sorted(end):
            for writer in sorted(end[stream]):
                lo, hi = int(start.get(stream, {}).get(writer, 0)), int(end[stream][writer])
                while lo < hi:
                    step = min(hi, lo + self.tokens_per_task)
                    parts.append(FactRange(stream, writer, lo, step))
                    lo = step
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FactRange)
        return read_range(self.url, _tables(self.tables_option)[partition.stream], partition, self.page_rows)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the database keeps every row."""


class ReplicationDataSource(DataSource):
    """``spark.readStream.format("factstream").option("db", URL)``: facts of a writer's database.

    Options: ``db`` (database URL, required), ``streams`` (comma list;
    default all of ``tables``), ``tables`` (required: JSON list of
    ``{"stream", "table", "columns", "plain_columns"}``, as
    ``tables_to_json`` writes), ``tokensPerTask`` (50000), ``pageRows`` (5000).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ReplicationStreamReader(self.options)


def source_name(url: str, stream: str, writer: str) -> str:
    """The ``source_file`` of streamed rows: where they came from, password masked."""
    from ..redaction import redact_url

    return f"{redact_url(url)}#{stream}/{writer}"


def read_range(url: str, table: StreamTable, part: FactRange, page_rows: int = 5000) -> Iterator[pa.RecordBatch]:
    """The facts of ``part`` as logs-parse columns, in token order (runs on an executor)."""
    import pyarrow as pa

    from .. import wire
    from ..store.database import connect

    source = source_name(url, part.stream, part.writer)
    loop = asyncio.new_event_loop()
    try:
        db = loop.run_until_complete(connect(url, max_connections=1))
        try:
            src = table.source(db)
            frm = part.start
            while frm < part.end:
                updates, upto, _ = loop.run_until_complete(src.get_updates(part.writer, frm, part.end, page_rows))
                if updates:
                    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ > ").encode()
                    lines = [now + wire.encode(wire.RdataCommand(part.stream, part.writer, t, row)) for t, row in updates]
                    tokens = pa.array([t for t, _ in updates], pa.int64())
                    done = 0
                    for batch in parse_block(lines, source=source, fmt="lines", typed=True, batch_rows=len(lines) + 1):
                        n = batch.num_rows
                        cols = batch.columns
                        cols[1] = tokens.slice(done, n)  # line_number is the token: the order of the facts
                        done += n
                        yield pa.RecordBatch.from_arrays(cols, schema=batch.schema)
                frm = max(upto, frm + 1) if not updates else upto
        finally:
            loop.run_until_complete(db.close())
    finally:
        loop.close()


def _fs(path: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if "://" in path and not path.startswith("file://"):
        fs, rel = pafs.FileSystem.from_uri(path)
        return fs, rel
    return pafs.LocalFileSystem(), os.path.abspath(path.removeprefix("file://"))


def publish_batch(df: DataFrame, batch_id: int, out: str, staging: str) -> int:
    """Write one micro-batch into ``out`` (logs-parse layout) so that writing it again replaces it.

    Returns the number of files published.
    """
    import pyarrow.fs as pafs

    stage = f"{staging.rstrip('/')}/batch-{batch_id}"
    df.write.mode("overwrite").partitionBy("date", "stream").parquet(stage)
    fs, out_path = _fs(out)
    _, stage_path = _fs(stage)
    prefix = f"part-b{batch_id:012d}-"
    fs.create_dir(out_path, recursive=True)
    # an earlier attempt of this batch may have published some files: they go first
    for info in fs.get_file_info(pafs.FileSelector(out_path, recursive=True)):
        if info.type == pafs.FileType.File and info.base_name.startswith(prefix):
            fs.delete_file(info.path)
    published = 0
    for info in fs.get_file_info(pafs.FileSelector(stage_path, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        rel = os.path.relpath(os.path.dirname(info.path), stage_path)
        dest_dir = out_path if rel == "." else f"{out_path}/{rel}"
        fs.create_dir(dest_dir, recursive=True)
        fs.move(info.path, f"{dest_dir}/{prefix}{info.base_name}")
        published += 1
    fs.delete_dir(stage_path)
    return published


def start_stream(
    spark: SparkSession,
    db: str,
    out: str,
    checkpoint: str,
    *,
    tables: Sequence[StreamTable] | str,
    streams: Sequence[str] = (),
    trigger_seconds: float = 1.0,
    on_batch: Callable[[int, int], None] | None = None,
) -> StreamingQuery:
    """Start the query: facts of ``db``'s ``tables`` appended to ``out`` exactly once, offsets in ``checkpoint``.

    ``tables`` are the writer's stream tables (or their JSON, ``tables_to_json``).
    Raises ValueError for an unknown stream and SourceProblem for a database
    that cannot be reached or lacks the tables, before the query starts.
    """
    from ..replication.tables import tables_to_json

    option = tables if isinstance(tables, str) else tables_to_json(tables)
    chosen = select_streams(_tables(option), streams)
    check_source(db, _tables(option), chosen)
    spark.dataSource.register(ReplicationDataSource)
    reader = spark.readStream.format(SOURCE_NAME).option("db", db).option("tables", option)
    if streams:
        reader = reader.option("streams", ",".join(streams))
    staging = f"{checkpoint.rstrip('/')}/staging"

    def write(df: DataFrame, batch_id: int) -> None:
        files = publish_batch(df, batch_id, out, staging)
        if on_batch is not None:
            on_batch(batch_id, files)

    return (
        reader.load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", f"{checkpoint.rstrip('/')}/query")
        .trigger(processingTime=f"{max(0.05, trigger_seconds)} seconds")
        .queryName("factstream-logs-stream")
        .start()
    )


def run_stream(query: StreamingQuery, stop_when_idle: float = 0.0, poll: float = 0.2) -> None:
    """Wait for ``query``: until it fails, forever, or until no new facts came for ``stop_when_idle`` seconds."""
    if stop_when_idle <= 0:
        query.awaitTermination()
        return
    last_seen = time.monotonic()
    last_batch = -1
    while query.isActive:
        progress = query.lastProgress
        if progress and progress["batchId"] != last_batch:
            last_batch = progress["batchId"]
            if progress.get("numInputRows", 0):
                last_seen = time.monotonic()
        status = query.status
        idle = progress is not None and not status.get("isDataAvailable") and not status.get("isTriggerActive")
        if idle and time.monotonic() - last_seen >= stop_when_idle:
            query.stop()
            break
        time.sleep(poll)
    exc = query.exception()
    if exc is not None:
        raise exc
