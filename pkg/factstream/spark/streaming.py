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
into the output as ``part-<query id>-b<batch id>-...``, after deleting the
files an interrupted earlier attempt of the same batch named in the
staging directory's ``published.json``. Hence nothing lost (offsets only
move after the batch is published), nothing duplicated (a batch's files
are replaced, never added twice), and a query never deletes a file another
query published into the same output. A batch an earlier version left
interrupted (one naming files ``part-b<batch id>-...``, with no note) has
that batch's files of that name deleted instead (:func:`old_version_rerun`).
The output has the columns and layout of ``logs parse`` (Parquet
partitioned by date and stream), so ``logs report`` reads both. Each fact
becomes the RDATA line a reader would have received, parsed by the archive
builder; ``ts`` is when the query read it, ``line_number`` its token,
``source_file`` ``<database URL, password masked>#<stream>/<writer>``.

Faults: a database that cannot be reached pauses the query, the source
retrying for ``retrySeconds`` (60) before the query stops with one line
saying so; the first batch leaves a note in ``OUT/_factstream_streams/``
naming its query and checkpoint, and a query whose checkpoint is not that
one (deleted, lost, mistyped) is refused on the same source, since it would
read every fact again and write it a second time.

Redis pub/sub cannot replay, so no streaming source on it can be exactly
once; record it with ``factstream record`` into closed files and parse those
(docs/spark.md, "Streaming").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
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
    "CheckpointMismatch",
    "check_source",
    "check_output",
    "check_writable",
    "write_marker",
    "checkpoint_query_id",
    "stream_markers",
    "select_streams",
    "publish_batch",
    "old_version_rerun",
    "Published",
    "running_query_id",
    "publish_or_explain",
    "StreamFailed",
    "failure_text",
    "start_stream",
    "run_stream",
]

_log = logging.getLogger(__name__)

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


#: Seconds the source waits for an unreachable database (a restart, a failover, a dropped connection)
#: before the query fails; option ``retrySeconds``.
RETRY_SECONDS = 60.0


def _unreachable(url: str, waited: float, err: BaseException) -> ConnectionError:
    """The error a query stops with once the database stayed unreachable: one line, password masked.

    A builtin ConnectionError, so that the last line of the traceback Spark
    carries reads ``ConnectionError: <this>``, which the CLI shows as it is.
    """
    from ..redaction import redact_text, redact_url

    reason = redact_text(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    return ConnectionError(
        f"the database {redact_url(url)} stayed unreachable for {waited:.0f} s ({reason}); the query stopped "
        "with nothing lost: start it again with the same --checkpoint once the database is back"
    )


def _with_retry(url: str, call: Callable[[], Any], retry_seconds: float) -> Any:
    """``call()``, again after a DatabaseUnavailable for up to ``retry_seconds``: a restarting database pauses the query.

    Safe because every read is of committed rows at or below recorded
    positions: reading again gives the same rows.
    """
    from ..store.database import DatabaseUnavailable

    start = time.monotonic()
    delay = 0.2
    while True:
        try:
            return call()
        except DatabaseUnavailable as err:
            waited = time.monotonic() - start
            if waited >= retry_seconds:
                raise _unreachable(url, waited, err) from None
            time.sleep(min(delay, max(0.0, retry_seconds - waited)))
            delay = min(delay * 2, 5.0)


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
            self.retry_seconds = float(options.get("retrySeconds", str(RETRY_SECONDS)))
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
        recorded = _with_retry(self.url, lambda: _run(_recorded_positions(self.url, self.streams)), self.retry_seconds)
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
        return read_range(self.url, _tables(self.tables_option)[partition.stream], partition, self.page_rows,
                          self.retry_seconds)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the database keeps every row."""


class ReplicationDataSource(DataSource):
    """``spark.readStream.format("factstream").option("db", URL)``: facts of a writer's database.

    Options: ``db`` (database URL, required), ``streams`` (comma list;
    default all of ``tables``), ``tables`` (required: JSON list of
    ``{"stream", "table", "columns", "plain_columns"}``, as
    ``tables_to_json`` writes), ``tokensPerTask`` (50000), ``pageRows`` (5000),
    ``retrySeconds`` (60: how long an unreachable database pauses the query before it fails).
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


def read_range(
    url: str, table: StreamTable, part: FactRange, page_rows: int = 5000, retry_seconds: float = RETRY_SECONDS
) -> Iterator[pa.RecordBatch]:
    """The facts of ``part`` as logs-parse columns, in token order (runs on an executor).

    A connection lost mid-range is opened again and the page read again, for
    up to ``retry_seconds``: the pages already yielded are not read twice.
    """
    import pyarrow as pa

    from .. import wire
    from ..store.database import connect

    source = source_name(url, part.stream, part.writer)
    loop = asyncio.new_event_loop()
    db: Any = None

    def close() -> None:
        nonlocal db
        if db is not None:
            try:
                loop.run_until_complete(db.close())
            except Exception:  # noqa: BLE001 - a dead connection has nothing left to close
                pass
            db = None

    def page(frm: int) -> Any:
        nonlocal db
        try:
            if db is None:
                db = loop.run_until_complete(connect(url, max_connections=1))
            return loop.run_until_complete(table.source(db).get_updates(part.writer, frm, part.end, page_rows))
        except BaseException:
            close()
            raise

    try:
        frm = part.start
        while frm < part.end:
            updates, upto, _ = _with_retry(url, lambda: page(frm), retry_seconds)
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
        close()
        loop.close()


def _fs(path: str) -> tuple[Any, str]:
    from .sources import filesystem_of

    return filesystem_of(path)


#: The file in a query's staging directory naming the files its latest batch published (see publish_batch).
PUBLISHED = "published.json"


def running_query_id(df: DataFrame) -> str | None:
    """The id of the streaming query whose ``foreachBatch`` is running (Spark's ``sql.streaming.queryId``), else None.

    The same id as the checkpoint's ``query/metadata`` (:func:`checkpoint_query_id`) and the output's note.
    """
    try:
        return df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId") or None
    except Exception:  # noqa: BLE001 - not on a Spark context (Spark Connect): names without the id
        return None


def _published(fs: Any, path: str) -> tuple[int, list[str]] | None:
    """(batch id, files relative to the output) of a staging directory's ``PUBLISHED`` note, None if it has none."""
    import json

    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as fh:
        try:
            note = json.loads(bytes(fh.read()))
            return int(note["batch"]), [str(f) for f in note["files"]]
        except (ValueError, KeyError, TypeError):
            return None  # cut short: written before any of its files was moved, so none was


def _batch_ids(fs: Any, path: str) -> list[int]:
    """The batch ids of a Spark metadata log directory (``offsets``, ``commits``), ascending."""
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(int(i.base_name) for i in infos if i.type == pafs.FileType.File and i.base_name.isdigit())


def old_version_rerun(checkpoint: str) -> int | None:
    """The batch this start re-runs after an earlier version left it interrupted, else None; call before the start.

    Versions before the ``PUBLISHED`` note named their files
    ``part-b<batch id>-...`` and noted none, so a re-run finds nothing
    naming them: the caller passes ``old_names`` to :func:`publish_batch`
    for this batch (the only one that can be such a re-run: Spark re-runs
    the unfinished batch first).
    A checkpoint without the note and without an unfinished batch gets an
    empty note, so that an attempt of this version interrupted before its
    first note is never taken for an earlier version's.
    """
    import pyarrow.fs as pafs

    root = checkpoint.rstrip("/")
    fs, staging = _fs(f"{root}/staging")
    note = f"{staging}/{PUBLISHED}"
    if fs.get_file_info(note).type == pafs.FileType.File:
        return None
    query = _fs(f"{root}/query")[1]
    offsets = _batch_ids(fs, f"{query}/offsets")
    if offsets and offsets[-1] not in _batch_ids(fs, f"{query}/commits"):
        return offsets[-1]
    fs.create_dir(staging, recursive=True)
    _note_published(fs, note, -1, [])
    return None


def _note_published(fs: Any, path: str, batch_id: int, files: Sequence[str]) -> None:
    """Replace the ``PUBLISHED`` note at ``path``: written in full under another name, then renamed over it."""
    import json

    with fs.open_output_stream(f"{path}.tmp") as fh:
        fh.write(json.dumps({"batch": batch_id, "files": list(files)}).encode())
    fs.move(f"{path}.tmp", path)


class Published(int):
    """What :func:`publish_batch` returns: the number of files published, also giving ``lines`` and ``malformed``.

    An int, as it always was; ``lines`` and ``malformed`` (rows with an
    ``error``) come from the staged files' footers, as ``logs parse`` counts
    "N lines (M malformed)".
    """

    lines: int
    malformed: int

    def __new__(cls, files: int, lines: int = 0, malformed: int = 0) -> Published:
        self = super().__new__(cls, files)
        self.lines, self.malformed = lines, malformed
        return self


def _staged_counts(fs: Any, paths: Sequence[str]) -> tuple[int, int, dict[str, int]]:
    """(lines, malformed lines, source file -> lines cut mid-line) of staged Parquet files.

    Only the footers are read, unless a file holds a malformed row (its
    ``error`` statistics say so): then its ``source_file`` and ``error``, to
    name the files read while cut short (:data:`.formats.ENDS_MID_LINE`).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from .formats import ENDS_MID_LINE

    lines = malformed = 0
    cut: dict[str, int] = {}
    for path in paths:
        with fs.open_input_file(path) as fh:
            pf = pq.ParquetFile(fh)
            meta = pf.metadata
            lines += meta.num_rows
            column = pf.schema_arrow.get_field_index("error")
            if column < 0:
                continue
            known = 0  # rows without an error, as the statistics say
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(column).statistics
                if stats is None or not stats.has_null_count:
                    known = -1
                    break
                known += stats.null_count
            if known == meta.num_rows:
                continue
            table = pf.read(columns=["source_file", "error"])
            malformed += len(table) - table["error"].null_count
            for name in table.filter(pc.equal(table["error"], ENDS_MID_LINE))["source_file"].to_pylist():
                cut[name] = cut.get(name, 0) + 1
    return lines, malformed, cut


def publish_batch(
    df: DataFrame, batch_id: int, out: str, staging: str, query_id: str | None = None, *, old_names: bool = False
) -> Published:
    """Write one micro-batch into ``out`` (logs-parse layout) so that writing it again replaces it.

    ``staging`` is the query's own directory (under its checkpoint). The
    batch is written there, then its files are renamed into ``out`` as
    ``part-<query id>-b<batch id>-...`` (``query_id``, by default the
    running query's; ``part-b<batch id>-...`` outside a query). Before the
    renames, ``staging/published.json`` is made to name them; when Spark
    runs the batch again (a crash before it recorded the batch as done), the
    files the earlier attempt named there are deleted first. So a query only
    ever deletes files it published itself, whatever else shares ``out``
    (other queries, other sources, ``logs parse`` output), and the cost of a
    batch does not grow with ``out``. ``old_names`` says the earlier attempt
    was an earlier version's (:func:`old_version_rerun`), which noted nothing:
    the batch's ``part-b<batch id>-...`` files in ``out`` are deleted instead,
    as that version did, listing ``out`` this once. A file read while cut
    mid-line (:data:`.formats.ENDS_MID_LINE`) is named in a warning. Returns the
    number of files published, with the batch's lines and malformed lines.
    """
    import pyarrow.fs as pafs

    root = staging.rstrip("/")
    stage = f"{root}/batch-{batch_id}"
    df.write.mode("overwrite").partitionBy("date", "stream").parquet(stage)
    fs, out_path = _fs(out)
    _, stage_path = _fs(stage)
    note = f"{_fs(root)[1]}/{PUBLISHED}"
    query_id = query_id or running_query_id(df)
    prefix = f"part-{query_id}-b{batch_id:012d}-" if query_id else f"part-b{batch_id:012d}-"
    moves: list[tuple[str, str]] = []  # (staged file, its name relative to out)
    for info in fs.get_file_info(pafs.FileSelector(stage_path, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".parquet"):
            rel = os.path.relpath(os.path.dirname(info.path), stage_path)
            moves.append((info.path, f"{prefix}{info.base_name}" if rel == "." else f"{rel}/{prefix}{info.base_name}"))
    lines, malformed, cut = _staged_counts(fs, [src for src, _ in moves])
    earlier = _published(fs, note)
    if earlier is not None and earlier[0] == batch_id:  # an earlier attempt of this batch: its files go first
        for rel in earlier[1]:
            try:
                fs.delete_file(f"{out_path}/{rel}")
            except FileNotFoundError:
                pass
    if old_names:  # an earlier version's attempt, its files named by batch id only
        old = f"part-b{batch_id:012d}-"
        for info in fs.get_file_info(pafs.FileSelector(out_path, recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File and info.base_name.startswith(old):
                fs.delete_file(info.path)
    _note_published(fs, note, batch_id, [rel for _, rel in moves])
    made: set[str] = set()
    for src, rel in moves:
        dest = f"{out_path}/{rel}"
        parent = os.path.dirname(dest)
        if parent not in made:
            fs.create_dir(parent, recursive=True)
            made.add(parent)
        fs.move(src, dest)
    fs.delete_dir(stage_path)
    for name, rows in sorted(cut.items()):
        _log.warning(
            "batch %d: %s ends mid-line (cut short, or still being written when the batch read it): %s, not "
            "parsed; a file stream reads each file once, so what is written to it later is not read: let --glob "
            "match closed files only", batch_id, name,
            "its last line is a malformed row" if rows == 1 else f"{rows} lines are malformed rows",
        )
    return Published(len(moves), lines, malformed)


#: Directory in the output where each query that published into it leaves a note (Spark and pyarrow skip ``_`` names).
MARKERS = "_factstream_streams"


class StreamFailed(RuntimeError):
    """The query stopped on an error; the message is Spark's, less its query ids and SQLSTATE wrapping."""


_SPARK_WRAPPING = re.compile(r"\[STREAM_FAILED\] Query \[id = [^\]]*\] terminated with exception: |\s*SQLSTATE: \w+")


def failure_text(exc: BaseException) -> str:
    """What a failed query's exception says, without "[STREAM_FAILED] Query [id = ..., runId = ...]" and SQLSTATEs."""
    return _SPARK_WRAPPING.sub("", str(exc)).strip() or type(exc).__name__


def check_writable(path: str, what: str) -> None:
    """Raise PermissionError naming ``path`` unless a file can be made in it (the directory made if missing).

    Spark reports a checkpoint it cannot write as "An error occurred while
    calling o64.start" once the JVM is up; an output it cannot write fails
    the first batch deep in its writer.
    """
    import pyarrow.fs as pafs

    fs, rel = _fs(path)
    try:
        if fs.get_file_info(rel).type == pafs.FileType.File:
            raise PermissionError(f"the {what} {path} is a file, not a directory")
        fs.create_dir(rel, recursive=True)
        probe = f"{rel}/.factstream-probe-{os.getpid()}"
        with fs.open_output_stream(probe) as fh:
            fh.write(b"")
        fs.delete_file(probe)
    except PermissionError:
        raise
    except OSError as err:
        reason = str(err).rsplit("Detail: ", 1)[-1].strip() or type(err).__name__
        raise PermissionError(f"cannot write the {what} {path} ({reason})") from None


def checkpoint_gone(checkpoint: str) -> bool:
    """True once ``checkpoint`` (its ``query`` directory, made when the query starts) no longer exists."""
    import pyarrow.fs as pafs

    fs, rel = _fs(f"{checkpoint.rstrip('/')}/query")
    try:
        return bool(fs.get_file_info(rel).type == pafs.FileType.NotFound)
    except OSError:
        return False


def publish_or_explain(checkpoint: str, publish: Callable[[], int]) -> int:
    """``publish()``, with a failure caused by the checkpoint vanishing under the query said as such.

    Removed while the query runs, the checkpoint takes the staging directory
    with it and the batch fails on a missing file deep in Spark's writer.
    """
    try:
        return publish()
    except Exception:
        if checkpoint_gone(checkpoint):
            raise RuntimeError(
                f"the checkpoint {checkpoint} was removed while the query ran; the output keeps the batches "
                "published so far, but the query cannot go on or resume without it: restore the checkpoint "
                "directory, or stream into a new --out"
            ) from None
        raise


class CheckpointMismatch(Exception):
    """The output already holds facts of this source streamed under another checkpoint: starting would write them twice."""


def _read_text(path: str) -> str | None:
    import pyarrow.fs as pafs

    fs, rel = _fs(path)
    if fs.get_file_info(rel).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(rel) as fh:
        return bytes(fh.read()).decode("utf-8", "replace")


def checkpoint_query_id(checkpoint: str) -> str | None:
    """The id of the query whose checkpoint this is (Spark's ``query/metadata``), None if it has none yet."""
    import json

    text = _read_text(f"{checkpoint.rstrip('/')}/query/metadata")
    try:
        return str(json.loads(text.splitlines()[0])["id"]) if text else None
    except (ValueError, KeyError, IndexError):
        return None


def stream_markers(out: str) -> list[dict[str, Any]]:
    """The notes of the queries that published into ``out`` (query_id, checkpoint, source, streams)."""
    import json

    import pyarrow.fs as pafs

    fs, rel = _fs(out)
    found = []
    for info in fs.get_file_info(pafs.FileSelector(f"{rel}/{MARKERS}", allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".json"):
            try:
                note = json.loads(_read_text(f"{out.rstrip('/')}/{MARKERS}/{info.base_name}") or "")
            except ValueError:
                continue
            if isinstance(note, dict) and "query_id" in note:
                found.append(note)
    return found


def check_output(out: str, checkpoint: str, source: str, streams: Sequence[str]) -> None:
    """Raise CheckpointMismatch if ``out`` holds facts of ``source``'s ``streams`` published by another checkpoint's query.

    ``source`` names where the facts come from as shown to users (a database
    URL, password masked; a directory of closed files). A checkpoint deleted,
    lost or mistyped starts from the beginning again: every fact already in
    ``out`` would be written a second time, silently.
    """
    mine = checkpoint_query_id(checkpoint)
    for note in stream_markers(out):
        shared = sorted(set(note.get("streams") or ()) & set(streams))
        if note["query_id"] == mine or note.get("source") != source or not shared:
            continue
        where = note.get("checkpoint") or "?"
        what = "facts" if shared == ["*"] else f"{', '.join(shared)} facts"
        now = "which has no query yet" if mine is None else f"of another query, {mine}"
        raise CheckpointMismatch(
            f"{out} already holds {what} of {source} streamed with checkpoint {where} (query {note['query_id']}), "
            f"and checkpoint {checkpoint} is not that one ({now}): starting it would write those facts a second "
            f"time. Resume with --checkpoint {where}, or stream into a new --out (to start over into {out}, "
            f"remove the files it published, part-{note['query_id']}-*, and {out}/{MARKERS}/{note['query_id']}.json)"
        )


def write_marker(out: str, checkpoint: str, source: str, streams: Sequence[str]) -> None:
    """Note in ``out`` which query (and checkpoint) publishes these facts, before its first files land."""
    import json

    query_id = checkpoint_query_id(checkpoint)
    if query_id is None:
        return
    fs, rel = _fs(out)
    path = f"{rel}/{MARKERS}/{query_id}.json"
    fs.create_dir(f"{rel}/{MARKERS}", recursive=True)
    cp = checkpoint if "://" in checkpoint and not checkpoint.startswith("file://") else _fs(checkpoint)[1]
    note = {"query_id": query_id, "checkpoint": cp, "source": source, "streams": sorted(streams)}
    with fs.open_output_stream(path) as fh:
        fh.write(json.dumps(note, sort_keys=True).encode() + b"\n")


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
    that cannot be reached or lacks the tables, PermissionError for a checkpoint
    or output that cannot be written, and CheckpointMismatch when
    ``out`` already holds these facts from another checkpoint (see
    :func:`check_output`), before the query starts.
    """
    from ..replication.tables import tables_to_json

    option = tables if isinstance(tables, str) else tables_to_json(tables)
    chosen = select_streams(_tables(option), streams)
    check_source(db, _tables(option), chosen)
    from ..redaction import redact_url

    source = redact_url(db)
    check_writable(checkpoint, "checkpoint directory")
    check_writable(out, "output directory")
    check_output(out, checkpoint, source, chosen)
    spark.dataSource.register(ReplicationDataSource)
    reader = spark.readStream.format(SOURCE_NAME).option("db", db).option("tables", option)
    if streams:
        reader = reader.option("streams", ",".join(streams))
    staging = f"{checkpoint.rstrip('/')}/staging"
    rerun = old_version_rerun(checkpoint)

    query_id: list[str | None] = []  # the query's, once it has one (its first batch)

    def write(df: DataFrame, batch_id: int) -> None:
        if not query_id:
            write_marker(out, checkpoint, source, chosen)
            query_id.append(checkpoint_query_id(checkpoint))
        files = publish_or_explain(
            checkpoint, lambda: publish_batch(df, batch_id, out, staging, query_id[0], old_names=batch_id == rerun)
        )
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
    """Wait for ``query``: until it fails, forever, or until no new facts came for ``stop_when_idle`` seconds.

    Raises StreamFailed with Spark's reason when the query stops on an error.
    """
    if stop_when_idle <= 0:
        from pyspark.errors import StreamingQueryException

        try:
            query.awaitTermination()
        except StreamingQueryException as err:
            raise StreamFailed(failure_text(err)) from err
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
        raise StreamFailed(failure_text(exc)) from exc
