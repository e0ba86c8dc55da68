"""Figures per (stream, writer) over parsed replication lines.

Sequences (tokens going backwards, gaps, unterminated batches) are judged
*within each capture*: one capture is one recording of one
connection or channel, possibly rotated into several files, which are one
ordered sequence (see :mod:`.captures`). Captures never interleave, so each
is judged on its own, all of them in parallel. A recorder's
``#disconnected`` marker is a hole: it resets the sequence of every (stream,
writer) of its capture, so what was missed while disconnected is not a gap.
The figures:

``rows``, ``batch_rows``, ``positions``
    RDATA lines (all, and those with token ``batch``) and POSITION lines.
``min_token``, ``max_token``
    over RDATA tokens and POSITION new tokens.
``backwards``
    lines whose token is lower than the previous token of the same stream
    and writer (RDATA token or POSITION new token), in line order.
``skipped_tokens``, ``gaps``
    tokens no row accounts for, and the runs of them. A stream is judged
    across all its writers (Synapse's multi-writer streams take tokens from
    one sequence), in token order, between the lowest and highest token of
    each capture segment: a token is accounted for by an RDATA of any writer,
    or by lying inside a POSITION jump (prev, new] of *every* writer of the
    stream there (none of them claims it: an id used for nothing); with one
    writer its POSITION new tokens count too. Each run is counted at the
    writer whose row (or jump) ends it.
``sequences``
    per stream: its writers, whether any capture segment had several
    (``shared``), and its gaps and skipped tokens in all.
``position_jumps``, ``position_jump_tokens``
    POSITION lines whose new token is above their prev token, and by how much
    in total (the writer advanced without sending rows).
``unterminated_batches``
    runs of ``batch`` rows not closed by an RDATA with a token of the same
    stream and writer (a POSITION or the end of the file came first).
``rows_per_second``
    RDATA lines per second in time buckets (needs timestamps): mean over the
    time the archive covers (its first to its last timestamp, at least 1 s),
    peak bucket (a partly covered first or last bucket over its covered part,
    at least 1 s), and the series.
``rows_per_second`` series
    one point per bucket from the first to the last bucket with rows of that
    stream and writer: an empty bucket inside is a zero, never left out (an
    outage must show). ``last_bucket_seconds`` says how much of the report's
    last bucket the archive covers (a partial bucket is no dip).
``marks``
    where sequences broke, for the chart: up to 1000 gaps (at the line that
    ends them) and backwards tokens with their time, and the disconnect holes
    of every capture.
``captures``
    per capture: its files (in sequence order), lines and disconnect holes
    (``disconnects``: a ``recorder stopped`` note on its last line is where
    the recording ended, not a hole).
``bucket_seconds``
    the bucket used: the one asked for, unless the archive spans more than
    ``MAX_BUCKETS`` of it (a stray timestamp years off, say), when it is
    widened to a multiple of it that fits (``bucket_seconds_requested``
    says what was asked), so that the series stays a size one can draw.

Token arithmetic is done in decimals: tokens are 64-bit, and a difference
or sum of them (a gap from 1 to 2**63-1) must not overflow.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["build_report", "render_text", "render_json", "MAX_MARKS", "MAX_BUCKETS", "REQUIRED_COLUMNS", "COLUMN_TYPES",
           "wrong_types", "narrower_integers", "odd_part_files"]

#: Gaps and backwards tokens listed with their time in ``marks`` (the figures count them all).
MAX_MARKS = 1000
#: Buckets a report's time span may hold (69 days of 60 s buckets); beyond it the bucket is widened.
MAX_BUCKETS = 100_000
CONNECTED = "#connected"
#: The reason of the note a recorder writes when it is stopped while connected (cli/record.py).
RECORDER_STOPPED = "recorder stopped"
#: The columns of 'logs parse' / 'logs stream' output a report reads.
REQUIRED_COLUMNS = ("source_file", "line_number", "ts", "command", "stream", "instance", "token", "prev_token", "error")

_TIMESTAMP = ("a timestamp", ("timestamp", "timestamp_ntz"))
_INTEGER = ("an integer", ("bigint", "int", "smallint", "tinyint"))
_STRING = ("a string", ("string",))
#: What each column the report reads must be (Spark's type names), ``data`` too when it is there: another type
#: fails deep in the job (a cast of 'abc' to a token) or in its Python (a string ts), an "internal" error.
COLUMN_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "source_file": _STRING, "line_number": _INTEGER, "ts": _TIMESTAMP, "command": _STRING, "stream": _STRING,
    "instance": _STRING, "token": _INTEGER, "prev_token": _INTEGER, "error": _STRING, "data": _STRING,
}


def wrong_types(dtypes: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(column, its type, the type wanted) for each column of ``dtypes`` (``DataFrame.dtypes``) the report cannot read."""
    return [(name, kind, COLUMN_TYPES[name][0]) for name, kind in dtypes
            if name in COLUMN_TYPES and kind not in COLUMN_TYPES[name][1]]


def narrower_integers(dtypes: list[tuple[str, str]]) -> list[str]:
    """The integer columns the report reads that ``dtypes`` (``DataFrame.dtypes``) has narrower than bigint.

    Spark takes a dataset's types from one of its part files: a 32-bit
    ``token`` there (another program's file) makes every 64-bit one fail to
    read, though both are integers. Read as bigint, each of them reads.
    """
    return [name for name, kind in dtypes
            if COLUMN_TYPES.get(name) == _INTEGER and kind in _INTEGER[1] and kind != "bigint"]


def _type_name(arrow_type: Any, physical: str | None) -> str:
    """The Spark type (by name) a Parquet column pyarrow reads as ``arrow_type``, stored as ``physical``, is read as."""
    import pyarrow as pa

    t = pa.types
    if t.is_timestamp(arrow_type):
        if physical == "INT96":  # Spark's default timestamp storage (pyarrow: nanoseconds, no zone)
            return "timestamp"
        if arrow_type.unit == "ns":
            return "timestamp in nanoseconds"  # Spark refuses them (PARQUET_TYPE_ILLEGAL)
        return "timestamp" if arrow_type.tz is not None else "timestamp_ntz"
    if t.is_string(arrow_type) or t.is_large_string(arrow_type) or str(arrow_type) == "string_view":
        return "string"
    names = {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
             pa.uint8(): "smallint", pa.uint16(): "int", pa.uint32(): "bigint", pa.uint64(): "decimal(20,0)",
             pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.binary(): "binary",
             pa.large_binary(): "binary", pa.date32(): "date", pa.null(): "void"}
    return names.get(arrow_type, str(arrow_type))


def odd_part_files(root: str) -> tuple[int, dict[str, dict[str, list[str]]]]:
    """The part files under the local directory ``root`` that hold a column the report reads otherwise than wanted.

    (Parquet files read, {column: {its type there, or "missing": the part
    files (relative to ``root``, sorted)}}), only columns some file holds
    otherwise (a column the report can do without, ``data``, is never
    missing); a column a part file's directories name (``stream=x``) is a
    partition value, not looked for in the file. Every file Spark reads as
    part of the dataset is read (its Parquet footer only; names starting
    with '.' or '_' are skipped, as Spark skips them); one that is no
    Parquet is left to Spark, which names it. Spark itself takes the types
    of one part file and fails on (or, for a column missing, reads nulls
    from) the others: one odd file among a dataset's files either stops a
    report with Spark's words or leaves its figures wrong.
    """
    import pyarrow.parquet as pq

    odd: dict[str, dict[str, list[str]]] = {}
    read = 0
    for where, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(names):
            if name.startswith((".", "_")):
                continue
            path = os.path.join(where, name)
            rel = os.path.relpath(path, root)
            try:
                parquet = pq.read_metadata(path).schema
                schema = parquet.to_arrow_schema()
            except Exception:  # noqa: BLE001 - not Parquet, or unreadable: Spark says so, naming the file
                continue
            read += 1
            physical = {parquet.column(i).path: parquet.column(i).physical_type for i in range(len(parquet))}
            partitions = {part.partition("=")[0] for part in rel.split(os.sep)[:-1] if "=" in part}
            for column, (_, accepted) in COLUMN_TYPES.items():
                if column in partitions:
                    continue
                index = schema.get_field_index(column)
                if index < 0:
                    if column in REQUIRED_COLUMNS:
                        odd.setdefault(column, {}).setdefault("missing", []).append(rel)
                    continue
                kind = _type_name(schema.field(index).type, physical.get(column))
                if kind not in accepted:
                    odd.setdefault(column, {}).setdefault(kind, []).append(rel)
    return read, odd


def fitting_bucket(requested: int, first: float, last: float, limit: int = MAX_BUCKETS) -> int:
    """The smallest multiple of ``requested`` seconds whose buckets from ``first`` to ``last`` number at most ``limit``."""
    def count(b: int) -> int:
        return int(last // b - first // b) + 1

    if count(requested) <= limit:
        return requested
    factor = max(1, int((last - first) // (requested * (limit - 1))))
    while count(requested * factor) > limit:
        factor += 1
    return requested * factor


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.timezone.utc).isoformat().replace("+00:00", "Z")
    return str(value)


def _rate(value: float) -> float:
    """Rows/s to 3 decimals, but never a zero for rows that were there (1 row in an hour is not an outage)."""
    rounded = round(value, 3)
    return rounded if rounded or not value else float(f"{value:.3g}")


def _unix(t: Any) -> float:
    return float(t.replace(tzinfo=dt.timezone.utc).timestamp())


def _holes(seq: DataFrame, writers_per_segment: DataFrame, dec: Any) -> DataFrame:
    """The runs of tokens no row accounts for, one row per run: the (stream, instance, ts) of the line that ends it,
    and ``hole``, how many tokens it holds.

    A stream is judged per capture segment across all its writers (Synapse's multi-writer streams share one
    sequence, so a writer's own tokens are not consecutive). Accounted for: every RDATA token of any writer, and
    tokens inside a POSITION jump (prev, new] of *every* writer of the stream in that segment (a writer's jump
    says none of those tokens is its own; all of them saying so makes it an id used for nothing, such as a
    rolled-back one). With one writer a POSITION's new token also counts, as that writer's position. The runs
    are judged between the lowest and the highest token so accounted for, in token order, not line order (a
    row that arrives late fills its place).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    seg = ["capture", "segment", "stream"]
    lines = seq.join(writers_per_segment, seg)  # k: the writers of the stream in that capture segment
    where = F.struct("file_order", "line_number", "ts", "instance")
    item_cols = [*seg, "start", "end", "at"]
    points = lines.where(
        "token IS NOT NULL AND (command = 'RDATA' OR (command = 'POSITION' AND k = 1))"
    ).select(*seg, dec("token").alias("start"), (dec("token") + 1).alias("end"), where.alias("at"))
    bounds = points.groupBy(*seg).agg(F.min("start").alias("lo"), F.max("end").alias("hi"))

    # Each writer's jumps, merged where they touch or overlap, then swept: where all k writers' jumps cover a
    # token, it is nobody's.
    jumps = lines.where("command = 'POSITION' AND token > prev_token").select(
        *seg, "instance", "k", (dec("prev_token") + 1).alias("start"), (dec("token") + 1).alias("end"),
        where.alias("at"))
    w_writer = Window.partitionBy(*seg, "instance").orderBy("start", "end")
    merged = (
        jumps.withColumn("reach", F.max("end").over(w_writer.rowsBetween(Window.unboundedPreceding, -1)))
        .withColumn("run", F.sum(F.when(F.col("reach").isNull() | (F.col("start") > F.col("reach")), 1).otherwise(0))
                    .over(w_writer.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .groupBy(*seg, "instance", "k", "run")
        .agg(F.min("start").alias("start"), F.max("end").alias("end"), F.min(F.struct("start", "at"))["at"].alias("at"))
    )
    edges = merged.select(*seg, "k", F.col("start").alias("pos"), F.lit(1).alias("d"), "at").unionByName(
        merged.select(*seg, "k", F.col("end").alias("pos"), F.lit(-1).alias("d"), F.lit(None).alias("at")),
        allowMissingColumns=True,
    )
    w_pos = Window.partitionBy(*seg).orderBy("pos")
    stretches = (
        edges.groupBy(*seg, "k", "pos").agg(F.sum("d").alias("d"), F.min("at").alias("at"))
        .withColumn("covering", F.sum("d").over(w_pos.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .withColumn("next", F.lead("pos").over(w_pos))
        .where("covering = k AND next IS NOT NULL")
        .join(bounds, seg)
        .select(*seg, F.greatest("pos", "lo").alias("start"), F.least("next", "hi").alias("end"), "at")
        .where("start < end")
    )
    items = points.select(*item_cols).unionByName(stretches.select(*item_cols))
    w_items = Window.partitionBy(*seg).orderBy("start", F.col("at.file_order"), F.col("at.line_number"))
    return (
        items.withColumn("reach", F.max("end").over(w_items.rowsBetween(Window.unboundedPreceding, -1)))
        .where("start > reach")
        .select("stream", F.col("at.instance").alias("instance"), F.col("at.ts").alias("ts"),
                (F.col("start") - F.col("reach")).cast("decimal(20,0)").alias("hole"))
    )


def build_report(df: DataFrame, bucket_seconds: int = 60, capture_pattern: str | None = None) -> dict[str, Any]:
    """Compute the report (a JSON-ready dict) from a parsed DataFrame or its Parquet copy.

    ``capture_pattern`` names the files of one capture when they do not
    follow the recorder's naming (see :func:`.captures.capture_columns`).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from .captures import DISCONNECTED, capture_columns

    if bucket_seconds <= 0:
        raise ValueError("bucket_seconds must be positive")
    requested_bucket = bucket_seconds
    # The judged lines are cached after a shuffle; unless adaptive execution may coalesce a cached plan's
    # partitions, every job reading them ran 200 tasks (spark.sql.shuffle.partitions) however few the lines:
    # a 200k-line report took 32 s instead of 11.5 s.
    conf = df.sparkSession.conf
    coalesce_key = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"
    coalesce_was = conf.get(coalesce_key, None)
    conf.set(coalesce_key, "true")
    note = F.col("data") if "data" in df.columns else F.lit(None).cast("string")
    df = capture_columns(df.select(*REQUIRED_COLUMNS, note.alias("data")), capture_pattern).cache()
    cached_parts: list[DataFrame] = []
    # Differences and sums of 64-bit tokens overflow a long (Spark's ANSI mode fails the job): decimals do not.
    def dec(column: Any) -> Any:
        return (F.col(column) if isinstance(column, str) else column).cast("decimal(20,0)")

    try:
        totals = df.agg(
            F.count(F.lit(1)).alias("lines"),
            F.count("error").alias("malformed"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        ).first()
        assert totals is not None  # an aggregate without groupBy always has exactly one row
        commands = {r["command"]: r["n"] for r in df.where("command IS NOT NULL").groupBy("command").agg(F.count(F.lit(1)).alias("n")).collect()}
        bad_files = {
            r["source_file"]: r["n"]
            for r in df.where("error IS NOT NULL").groupBy("source_file").agg(F.count(F.lit(1)).alias("n")).collect()
        }
        bad_samples = [
            {"file": r["source_file"], "line": r["line_number"], "error": r["error"]}
            for r in df.where("error IS NOT NULL").orderBy("source_file", "line_number").limit(20).collect()
        ]

        capture_rows = (
            df.groupBy("capture")
            .agg(
                F.count(F.lit(1)).alias("lines"),
                F.array_sort(F.collect_set(F.struct("file_order", "source_file"))).alias("files"),
                F.max(F.struct("file_order", "line_number")).alias("last_line"),
            )
            .orderBy("capture")
            .collect()
        )
        # A disconnect starts a new segment of its capture: sequences never run across it.
        order = ["file_order", "line_number"]
        w_cap = Window.partitionBy("capture").orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
        seq = (
            df.where(f"(command IN ('RDATA', 'POSITION') AND stream IS NOT NULL) OR command = '{DISCONNECTED}'")
            .withColumn("segment", F.sum(F.when(F.col("command") == DISCONNECTED, 1).otherwise(0)).over(w_cap))
            .where("command IN ('RDATA', 'POSITION')")
        )
        # One pass in line order per (capture, segment, stream, writer): the token before (backwards) and the
        # command after (an unterminated batch); everything else is read from it, cached.
        key = ["stream", "instance"]
        w_all = Window.partitionBy("capture", "segment", *key).orderBy(*order)
        judged = (
            seq.withColumn("last", F.last("token", ignorenulls=True).over(w_all.rowsBetween(Window.unboundedPreceding, -1)))
            .withColumn("next_cmd", F.lead("command").over(w_all))
            .cache()
        )
        cached_parts.append(judged)
        is_rdata = F.col("command") == "RDATA"
        jumped = (F.col("command") == "POSITION") & (F.col("token") > F.col("prev_token"))
        is_batch = is_rdata & F.col("token").isNull()
        went_back = F.col("token").isNotNull() & (F.col("token") < F.col("last"))
        basic = judged.groupBy(*key).agg(
            F.count(F.when(is_rdata, 1)).alias("rows"),
            F.count(F.when(is_batch, 1)).alias("batch_rows"),
            F.count(F.when(F.col("command") == "POSITION", 1)).alias("positions"),
            F.min("token").alias("min_token"),
            F.max("token").alias("max_token"),
            F.count(F.when(jumped, 1)).alias("position_jumps"),
            F.coalesce(F.sum(F.when(jumped, dec("token") - dec("prev_token"))), F.lit(0)).alias("position_jump_tokens"),
            F.min(F.when(is_rdata, F.col("ts"))).alias("first_ts"),
            F.max(F.when(is_rdata, F.col("ts"))).alias("last_ts"),
            F.count(F.when(went_back, 1)).alias("backwards"),
            # a batch run is closed by the writer's next RDATA (a batch row or the closing row)
            F.count(F.when(is_batch & (F.col("next_cmd").isNull() | (F.col("next_cmd") != "RDATA")), 1))
            .alias("unterminated_batches"),
        )
        writers_per_segment = judged.groupBy("capture", "segment", "stream").agg(
            F.countDistinct("instance").alias("k")).cache()
        holes_found = _holes(judged, writers_per_segment, dec).cache()
        cached_parts += [writers_per_segment, holes_found]
        gaps = holes_found.groupBy(*key).agg(F.count(F.lit(1)).alias("gaps"), F.sum("hole").alias("skipped_tokens"))
        shared = {r["stream"] for r in writers_per_segment.where("k > 1").select("stream").distinct().collect()}

        # The time the archive covers: rates are over it, not over whole buckets (a 3 s capture in a
        # 60 s bucket read as a twentieth of its rate). A bucket's own covered part is at least a second,
        # so a bucket the archive only grazes does not make a peak of one row.
        covered_from = _unix(totals["first_ts"]) if totals["first_ts"] is not None else None
        covered_to = _unix(totals["last_ts"]) if totals["last_ts"] is not None else None
        if covered_from is not None and covered_to is not None:
            bucket_seconds = fitting_bucket(requested_bucket, covered_from, covered_to)
        bucket = F.floor(F.unix_micros("ts") / F.lit(1_000_000) / F.lit(bucket_seconds)) * F.lit(bucket_seconds)
        series_rows = (
            judged.where("command = 'RDATA' AND ts IS NOT NULL")
            .groupBy(*key, bucket.alias("bucket"))
            .agg(F.count(F.lit(1)).alias("n"))
            .collect()
        )
        back_marks = judged.where(went_back & F.col("ts").isNotNull()).select(
            *key, "ts", F.lit("backwards").alias("kind"), (dec("last") - dec("token")).alias("tokens"))
        gap_marks = holes_found.where("ts IS NOT NULL").select(*key, "ts", F.lit("gap").alias("kind"),
                                                                 F.col("hole").alias("tokens"))
        # a total order: marks of one instant (a gap and a backwards token on one line) in the same order every run
        marks_rows = (back_marks.unionByName(gap_marks).orderBy("ts", *key, "kind", "tokens")
                      .limit(MAX_MARKS).collect())
        hole_rows = (
            df.where(f"command IN ('{DISCONNECTED}', '{CONNECTED}')")
            .select("capture", "ts", "command", "data", "file_order", "line_number")
            .orderBy("capture", "file_order", "line_number").collect()
        )
        stats = basic.join(gaps, key, "left").orderBy(*key).collect()
    finally:
        for cached in cached_parts:
            cached.unpersist()
        df.unpersist()
        if coalesce_was is None:
            conf.unset(coalesce_key)
        else:
            conf.set(coalesce_key, coalesce_was)


    def covered(b: int) -> float:
        if covered_from is None or covered_to is None:
            return float(bucket_seconds)
        part = min(b + bucket_seconds, covered_to) - max(b, covered_from)
        return max(min(1.0, float(bucket_seconds)), min(float(bucket_seconds), part))

    series: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for r in series_rows:
        series.setdefault((r["stream"], r["instance"]), []).append((int(r["bucket"]), int(r["n"])))
    streams = []
    for r in stats:
        points = sorted(series.get((r["stream"], r["instance"]), []))
        rate: dict[str, Any] = {"mean": None, "peak": None, "series": []}
        if points:
            total = sum(n for _, n in points)
            counts = dict(points)
            points = [(b, counts.get(b, 0)) for b in range(points[0][0], points[-1][0] + 1, bucket_seconds)]
            assert covered_from is not None and covered_to is not None  # points come from timestamped rows
            span = max(1.0, covered_to - covered_from)
            rate = {
                "mean": _rate(total / span),
                "peak": _rate(max(n / covered(b) for b, n in points)),
                "series": [
                    [_iso(dt.datetime.fromtimestamp(b, dt.timezone.utc).replace(tzinfo=None)), _rate(n / bucket_seconds)]
                    for b, n in points
                ],
            }
        streams.append(
            {
                "stream": r["stream"],
                "writer": r["instance"],
                "rows": r["rows"],
                "batch_rows": r["batch_rows"],
                "positions": r["positions"],
                "min_token": r["min_token"],
                "max_token": r["max_token"],
                "first_ts": _iso(r["first_ts"]),
                "last_ts": _iso(r["last_ts"]),
                "backwards": r["backwards"] or 0,
                "gaps": r["gaps"] or 0,
                "skipped_tokens": int(r["skipped_tokens"] or 0),
                "position_jumps": r["position_jumps"],
                "position_jump_tokens": int(r["position_jump_tokens"] or 0),
                "unterminated_batches": r["unterminated_batches"] or 0,
                "rows_per_second": rate,
            }
        )
    sequences: dict[str, dict[str, Any]] = {}
    for w in streams:
        q = sequences.setdefault(w["stream"], {"stream": w["stream"], "writers": 0, "shared": w["stream"] in shared,
                                               "gaps": 0, "skipped_tokens": 0})
        q["writers"] += 1
        q["gaps"] += w["gaps"]
        q["skipped_tokens"] += w["skipped_tokens"]
    # A capture's recording ends with "# disconnected recorder stopped" when it was stopped while
    # connected: that is its end, not a hole (every cleanly stopped capture would show one).
    last_lines = {r["capture"]: (r["last_line"]["file_order"], r["last_line"]["line_number"]) for r in capture_rows}
    holes = []
    hole_count: dict[str, int] = {}
    open_at: dict[str, Any] = {}
    for r in hole_rows:
        if r["command"] == DISCONNECTED:
            ended = (r["data"] or "").strip() == RECORDER_STOPPED and (
                (r["file_order"], r["line_number"]) == last_lines.get(r["capture"])
            )
            if not ended:
                hole_count[r["capture"]] = hole_count.get(r["capture"], 0) + 1
                if r["ts"] is not None:
                    open_at.setdefault(r["capture"], r["ts"])
        elif r["capture"] in open_at and r["ts"] is not None:
            holes.append({"capture": r["capture"], "from": _iso(open_at.pop(r["capture"])), "to": _iso(r["ts"])})
    holes.extend({"capture": c, "from": _iso(t), "to": None} for c, t in open_at.items())
    last_bucket_seconds = None
    if covered_from is not None and covered_to is not None:
        # from the later of the last bucket's start and the archive's first timestamp
        start = max(covered_from, (covered_to // bucket_seconds) * bucket_seconds)
        last_bucket_seconds = round(min(float(bucket_seconds), covered_to - start), 3)
    return {
        "lines": totals["lines"],
        "malformed": totals["malformed"],
        "malformed_by_file": dict(sorted(bad_files.items())),
        "malformed_samples": bad_samples,
        "first_ts": _iso(totals["first_ts"]),
        "last_ts": _iso(totals["last_ts"]),
        "bucket_seconds": bucket_seconds,
        "bucket_seconds_requested": requested_bucket,
        "last_bucket_seconds": last_bucket_seconds,
        "commands": dict(sorted(commands.items())),
        "streams": streams,
        "sequences": list(sequences.values()),
        "captures": [
            {
                "capture": r["capture"],
                "files": [f["source_file"] for f in r["files"]],
                "lines": r["lines"],
                "disconnects": hole_count.get(r["capture"], 0),
            }
            for r in capture_rows
        ],
        "marks": {
            "sequence": [
                {"ts": _iso(r["ts"]), "stream": r["stream"], "writer": r["instance"], "kind": r["kind"],
                 "tokens": int(r["tokens"])}
                for r in marks_rows
            ],
            "holes": holes,
        },
    }


def render_json(report: dict[str, Any], out: IO[str]) -> None:
    """Write the report as one JSON document."""
    json.dump(report, out, indent=2)
    out.write("\n")


def _cells(values: list[tuple[Any, int]]) -> str:
    """Right-aligned columns; a value wider than its column still gets a space before it (a 20-digit skip
    ran into the gaps figure, Synapse's un_partial_stated_event into its writer)."""
    return "".join(f"{' ' + str(v):>{w}}" for v, w in values)


def render_text(report: dict[str, Any], out: IO[str]) -> None:
    """Write the report as aligned text tables for people."""
    out.write(f"{report['lines']} lines, {report['malformed']} malformed")
    if report["first_ts"]:
        out.write(f", {report['first_ts']} .. {report['last_ts']}")
    out.write("\n\ncommands:\n")
    for name, count in report["commands"].items():
        out.write(f"  {name:<18}{count:>12}\n")
    if report["streams"]:
        out.write("\nstreams (per writer):\n")
        head = (
            f"  {'stream':<20}{'writer':<18}{'rows':>10}{'batch':>8}{'POSITION':>9}  {'tokens':<23}"
            f"{'back':>6}{'gaps':>6}{'skipped':>9}{'jumps':>7}{'open':>6}{'rows/s mean':>13}{'peak':>9}\n"
        )
        out.write(head)
        for s in report["streams"]:
            tokens = "-" if s["min_token"] is None else f"{s['min_token']}..{s['max_token']}"
            rate = s["rows_per_second"]
            mean = "-" if rate["mean"] is None else f"{rate['mean']:.1f}"
            peak = "-" if rate["peak"] is None else f"{rate['peak']:.1f}"
            out.write(
                f"  {s['stream']:<19} {s['writer']:<17}"
                + _cells([(s["rows"], 10), (s["batch_rows"], 8), (s["positions"], 9)])
                + f"  {tokens:<22}"
                + _cells([(s["backwards"], 7), (s["gaps"], 6), (s["skipped_tokens"], 9), (s["position_jumps"], 7),
                         (s["unterminated_batches"], 6), (mean, 13), (peak, 9)])
                + "\n"
            )
        out.write(
            "\n  back: tokens lower than the writer's one before; gaps/skipped: runs of tokens no row of the stream "
            "carries (any writer, in token order),\n  counted at the writer whose row ends them, and how many tokens; "
            "jumps: POSITION prev<new; open: unterminated batch runs; rows/s per "
            f"{report['bucket_seconds']} s bucket.\n"
        )
        requested = report.get("bucket_seconds_requested", report["bucket_seconds"])
        if requested != report["bucket_seconds"]:
            out.write(
                f"  the bucket was widened from {requested} s: the archive spans {report['first_ts']} .. "
                f"{report['last_ts']}, more than {MAX_BUCKETS} buckets of {requested} s\n"
            )
        for q in report.get("sequences", []):
            if q["shared"]:
                out.write(
                    f"  {q['stream']}: {q['writers']} writers share one sequence: {q['gaps']} gaps, "
                    f"{q['skipped_tokens']} tokens no writer sent a row for (lost rows, or ids used for nothing "
                    "that not every writer's POSITION passed over)\n"
                )
    captures = report.get("captures", [])
    rotated = [c for c in captures if len(c["files"]) > 1 or c["disconnects"]]
    if captures:
        files = sum(len(c["files"]) for c in captures)
        holes = sum(c["disconnects"] for c in captures)
        out.write(f"\n{len(captures)} captures in {files} files, {holes} disconnect holes"
                  " (sequences are judged per capture, across its files; a disconnect is a hole, not a gap)\n")
        for c in rotated:
            out.write(f"  {c['capture']:<40}{len(c['files']):>6} files{c['lines']:>12} lines"
                      f"{c['disconnects']:>6} holes\n")
    if report["malformed"]:
        out.write("\nmalformed lines per file:\n")
        for path, n in report["malformed_by_file"].items():
            out.write(f"  {n:>10}  {path}\n")
        out.write("first ones:\n")
        for s in report["malformed_samples"]:
            out.write(f"  {s['file']}:{s['line']}: {s['error']}\n")
