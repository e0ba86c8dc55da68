"""Closed recorder files streamed into Parquet exactly once (Spark's file stream).

For carriers that cannot replay (Redis pub/sub), no streaming source on the
carrier itself can be exactly once: what was published while nobody listened
is gone. The honest design is ``factstream record``, which writes each
capture file as ``... .log.gz.part`` and renames it to ``... .log.gz`` when
it is complete, plus Spark's file stream over the directory: the glob
(``*.log.gz`` by default) only ever sees closed files, and the stream's
checkpoint records which files each micro-batch took.

Each micro-batch parses its files exactly as ``logs parse`` does
(:func:`.pipeline.parse_archives`: formats detected per file, files in no
known format skipped with a warning) and is published with
:func:`.streaming.publish_batch`, which replaces a re-run batch's files
instead of adding them. So every closed file's lines reach the output once;
what the recorder missed while disconnected shows as its marker lines
(holes in ``logs report``), never as silently invented or doubled rows.
A gzip file that is truncated (cut short, or still being written when the
batch read it) or corrupt gives every line before the break, a line cut
short being a malformed row, and a warning names the file and the line
after which it breaks (the parse reports it: :class:`.damage.DamagedInputs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from .lines import ParseOptions
from .pipeline import parse_archives
from .damage import DamagedInputs, gzip_problems, what_was_parsed
from .sources import archive_formats
from .streaming import (
    check_output,
    check_writable,
    old_version_rerun,
    publish_batch,
    publish_or_explain,
    write_marker,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["DEFAULT_GLOB", "start_file_stream", "file_path"]

_log = logging.getLogger(__name__)

#: Closed recorder files (``factstream record`` renames ``.log.gz.part`` to this when a file is complete).
DEFAULT_GLOB = "*.log.gz"

#: The fixed schema of Spark's binaryFile source (a file stream must be given it).
_BINARY_FILE_DDL = "path string, modificationTime timestamp, length bigint, content binary"


def file_path(uri: str) -> str:
    """A path the archive readers open, from a path of Spark's file source (``file:/a%20b`` -> ``/a b``)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return uri


def start_file_stream(
    spark: SparkSession,
    directory: str,
    out: str,
    checkpoint: str,
    *,
    glob: str = DEFAULT_GLOB,
    typed: bool = True,
    trigger_seconds: float = 1.0,
    on_batch: Callable[[int, int], None] | None = None,
) -> StreamingQuery:
    """Start the query: closed files under ``directory`` parsed into ``out`` exactly once.

    ``on_batch(batch_id, files_published)`` is called after each batch is published.
    Raises PermissionError for a checkpoint or output that cannot be written
    and :class:`.streaming.CheckpointMismatch` when ``out`` already holds
    these files' facts from another checkpoint (a new one would parse every
    file again), before the query starts.
    """
    staging = f"{checkpoint.rstrip('/')}/staging"
    options = ParseOptions(typed=typed)
    source = f"closed files {glob} under {directory}"
    check_writable(checkpoint, "checkpoint directory")
    check_writable(out, "output directory")
    check_output(out, checkpoint, source, ["*"])
    noted: list[bool] = []
    rerun = old_version_rerun(checkpoint)

    def write(df: DataFrame, batch_id: int) -> None:
        if not noted:
            write_marker(out, checkpoint, source, ["*"])
            noted.append(True)
        # only path and length are read: Spark's binaryFile source leaves the content unread
        files = [(file_path(r["path"]), int(r["length"])) for r in df.select("path", "length").collect()]
        try:
            formats, _ = archive_formats(files) if files else ({}, [])
        except FileNotFoundError as err:  # only files in no known format: each named in the warning
            _log.warning("batch %d: %s", batch_id, err)
            formats = {}
        published = 0
        damaged = DamagedInputs(spark)
        if formats:
            parsed = parse_archives(spark, sorted(formats), options, damaged=damaged)
            published = publish_or_explain(
                checkpoint, lambda: publish_batch(parsed, batch_id, out, staging, old_names=batch_id == rerun)
            )
        for path, problem in gzip_problems(spark, [(path, size) for path, size in files if path not in formats]):
            _log.warning("batch %d: %s: %s; not parsed", batch_id, path, problem)
        for path, problem in damaged.found():
            _log.warning(
                "batch %d: %s: %s; %s%s", batch_id, path, problem, what_was_parsed(problem),
                " (a file stream reads each file once: if it was still being written, what came later is not "
                "read; let --glob match closed files only)" if problem.startswith("truncated") else "",
            )
        if on_batch is not None:
            on_batch(batch_id, published)

    return (
        spark.readStream.format("binaryFile")
        .schema(_BINARY_FILE_DDL)
        .option("pathGlobFilter", glob)
        .option("recursiveFileLookup", "true")
        .load(directory)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", f"{checkpoint.rstrip('/')}/query")
        .trigger(processingTime=f"{max(0.05, trigger_seconds)} seconds")
        .queryName("factstream-logs-stream-files")
        .start()
    )
