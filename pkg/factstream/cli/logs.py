"""``factstream logs parse|report``: bulk analysis of archived replication traffic with Spark."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from ..spark.formats import FORMATS, FORMATS_HELP


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "logs",
        help="parse archived replication logs with Spark and report on them",
        description=(
            "Parse archived replication traffic (TCP session logs, redis-cli captures; plain or gzip) "
            "in bulk with Spark and factstream's own codec, store it as Parquet, and report per stream "
            "and writer. Needs the spark extra (pip install 'factstream[spark]') and Java 17."
        ),
    )
    sub = p.add_subparsers(dest="logs_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    spark_opts = argparse.ArgumentParser(add_help=False)
    g = spark_opts.add_argument_group("Spark")
    g.add_argument(
        "--master",
        default="local[*]",
        help="Spark master: local[*] (default), local[N], or a cluster URL such as spark://host:7077 "
        "(every node then needs this Python with factstream at the same path, and the input paths)",
    )
    g.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)"
    )
    g.add_argument(
        "--ship-env",
        nargs="?",
        const=True,
        default=False,
        metavar="ZIP",
        help="ship factstream (compiled core included) and pyarrow to the executors with spark.archives, for "
        "workers whose Python lacks them; without ZIP the overlay of this installation is built and cached "
        "(~/.cache/factstream). Workers need the same CPython version (see docs/spark.md)",
    )
    g.add_argument(
        "--executor-python",
        metavar="PATH",
        help="Python the executors run (default: this Python; with --ship-env: python3 on the workers' PATH)",
    )
    g.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="task progress bar on stderr: auto shows it when stderr is a terminal (default)",
    )

    parse = sub.add_parser(
        "parse",
        parents=[spark_opts],
        help="parse archives into Parquet partitioned by date and stream",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Parse replication archives into Parquet under OUT, partitioned by date and stream.\n"
            "Every line becomes one row: source file, line number, timestamp, direction, channel,\n"
            "command, stream, writer, tokens, the row as JSON and typed columns for the events and\n"
            "caches streams. Lines the codec refuses are kept, with the reason in the error column.\n\n"
            "Formats (--format):\n" + FORMATS_HELP
        ),
        epilog="example: factstream logs parse /var/log/synapse/replication/*.log.gz --out /data/repl.parquet",
    )
    parse.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories (recursive) or globs; .gz is decompressed")
    parse.add_argument("--out", required=True, metavar="DIR", help="Parquet output directory")
    parse.add_argument("--format", choices=FORMATS, default="auto", help="archive format (default: detect per file)")
    parse.add_argument(
        "--mode",
        choices=("error", "overwrite", "append"),
        default="error",
        help="when OUT exists: fail (default), overwrite the partitions written again, or append",
    )
    parse.add_argument("--header-only", action="store_true", help="skip the typed events/caches columns (faster)")
    parse.add_argument(
        "--chunk-mb", type=float, default=32.0, metavar="MB", help="split plain files into chunks of this size (default 32)"
    )
    parse.set_defaults(func=run_parse)

    report = sub.add_parser(
        "report",
        parents=[spark_opts],
        help="report per stream and writer over parsed Parquet",
        description=(
            "Print, per (stream, writer): row counts, token range, rows per second over time, tokens "
            "that went backwards, gaps (tokens skipped with no row, POSITION jumps), unterminated batch "
            "runs; and malformed lines per file. Sequences are judged in line order within each capture: the "
            "files of a rotated capture are one sequence, and a recorder's disconnect marker is a hole, not a gap."
        ),
    )
    report.add_argument("dir", metavar="DIR", help="output directory of 'factstream logs parse'")
    report.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    report.add_argument("--chart", metavar="PNG", help="also draw rows/s per stream over time into this PNG file")
    report.add_argument("--bucket", type=int, default=60, metavar="SECONDS", help="time bucket for rows/s (default 60)")
    report.add_argument(
        "--capture-pattern",
        metavar="REGEX",
        help="regular expression on file base names saying which files are one capture (rotated): its group "
        "(?P<capture>...) names the capture, an optional (?P<order>...) orders the files (default: the base name). "
        "Recorder files (<capture>.<start>Z.<seq>.log.gz) are grouped without it",
    )
    report.set_defaults(func=run_report)

    stream = sub.add_parser(
        "stream",
        parents=[spark_opts],
        help="stream a writer's facts into the same Parquet layout, exactly once (Structured Streaming)",
        description=(
            "Follow a factstream writer's database with Spark Structured Streaming and append every fact, "
            "exactly once, to OUT in the layout of 'logs parse' (Parquet partitioned by date and stream), so "
            "'logs report' reads both. Offsets are the writers' positions; a restarted query resumes from "
            "CHECKPOINT with nothing lost or duplicated. Redis pub/sub cannot replay: record it with "
            "'factstream record' and parse the closed files instead (docs/spark.md)."
        ),
        epilog="example: factstream logs stream --db postgresql://localhost/facts --out /data/repl.parquet "
        "--checkpoint /data/repl.checkpoint",
    )
    stream.add_argument("--db", required=True, metavar="URL", help="the writer's database (postgresql://... or sqlite:///...)")
    stream.add_argument("--out", required=True, metavar="DIR", help="Parquet output directory (appended to)")
    stream.add_argument("--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory of this query")
    stream.add_argument("--streams", default="", metavar="A,B", help="streams to follow (default: all tables known)")
    stream.add_argument(
        "--tables", metavar="JSON", help="JSON file listing the streams' tables [{stream, table, columns, plain_columns}] "
        "(default: factstream's tables as 'serve' writes them)"
    )
    stream.add_argument("--trigger", type=float, default=1.0, metavar="SECONDS", help="micro-batch interval (default 1)")
    stream.add_argument(
        "--stop-when-idle", type=float, default=0.0, metavar="SECONDS",
        help="exit 0 once no new facts arrived for this long (default: run until interrupted)",
    )
    stream.set_defaults(func=run_stream)


def _session(args: argparse.Namespace) -> Any:
    from ..spark.session import make_session

    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"factstream logs: --conf expects KEY=VALUE, got {item!r}")
        conf[key] = value
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    # Failures are reported by us in one line (job_error), so Spark logs only what is fatal.
    # The JVM inherits our stdout and log4j writes notices there; start it with
    # stdout pointing at stderr so that stdout carries only the report.
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        return make_session(
            args.master, conf=conf, ship_env=args.ship_env, executor_python=args.executor_python, log_level="FATAL"
        )
    finally:
        os.dup2(saved, 1)
        os.close(saved)


# The last line of a Python traceback ("ModuleNotFoundError: No module named ..."), not Java's dotted names.
_PY_ERROR = re.compile(r"^\s*([A-Z]\w*(?:Error|Exception): .*)$", re.M)


def job_error(err: BaseException) -> str:
    """The one line of a failed Spark job a user needs: the executors' Python error, with a hint."""
    from ..redaction import redact_text

    text = str(err)
    found = _PY_ERROR.findall(text)
    line = found[-1].strip() if found else (text.strip().splitlines() or [type(err).__name__])[0]
    line = line.split("Traceback (most recent call last)")[0].rstrip(" :") or type(err).__name__
    if "No module named" in line and any(m in line for m in ("'factstream", "'pyarrow")):
        line += (" (the executors' Python lacks it: install factstream[spark] on every worker, "
                 "or ship it with --ship-env; see docs/spark.md)")
    return redact_text(line[:2000])


def _progress_enabled(args: argparse.Namespace) -> bool:
    return args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())


def run_parse(args: argparse.Namespace) -> int:
    from ..spark.lines import ParseOptions
    from ..spark.pipeline import parse_archives, write_parquet
    from ..spark.progress import task_progress

    try:
        spark = _session(args)
    except RuntimeError as err:
        print(f"factstream logs: {err}", file=sys.stderr)
        return 2
    try:
        df = parse_archives(
            spark,
            args.inputs,
            ParseOptions(format=args.format, typed=not args.header_only),
            chunk_bytes=int(args.chunk_mb * 1024 * 1024),
        )
    except FileNotFoundError as err:
        print(f"factstream logs: {err}", file=sys.stderr)
        return 2
    mode = "errorifexists" if args.mode == "error" else args.mode
    try:
        with task_progress(spark.sparkContext, "parsing", enabled=_progress_enabled(args)):
            write_parquet(df, args.out, mode)
    except Exception as err:  # AnalysisException has no stable import path across Spark versions
        if "already exists" in str(err):
            print(f"factstream logs: {args.out} already exists; use --mode overwrite or --mode append", file=sys.stderr)
            return 2
        print(f"factstream logs: the Spark job failed: {job_error(err)}", file=sys.stderr)
        return 1
    out = spark.read.parquet(args.out)
    counts = out.selectExpr("count(1) AS lines", "count(error) AS bad").first()
    print(f"wrote {counts['lines']} lines ({counts['bad']} malformed) to {args.out}", file=sys.stderr)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from ..spark.captures import CapturePatternError, check_pattern
    from ..spark.progress import task_progress
    from ..spark.report import build_report, render_json, render_text

    if args.capture_pattern is not None:
        try:
            check_pattern(args.capture_pattern)
        except CapturePatternError as err:
            print(f"factstream logs: {err}", file=sys.stderr)
            return 2
    if args.bucket <= 0:
        print("factstream logs: --bucket must be a positive number of seconds", file=sys.stderr)
        return 2

    try:
        spark = _session(args)
    except RuntimeError as err:
        print(f"factstream logs: {err}", file=sys.stderr)
        return 2
    try:
        df = spark.read.parquet(args.dir)
    except Exception as err:
        print(f"factstream logs: cannot read Parquet from {args.dir}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    with task_progress(spark.sparkContext, "reporting", enabled=_progress_enabled(args)):
        report = build_report(df, bucket_seconds=args.bucket, capture_pattern=args.capture_pattern)
    if args.chart:
        from ..spark.chart import render_chart

        render_chart(report, args.chart)
        print(f"chart written to {args.chart}", file=sys.stderr)
    if args.json:
        render_json(report, sys.stdout)
    else:
        render_text(report, sys.stdout)
    return 0


def run_stream(args: argparse.Namespace) -> int:
    from ..redaction import redact_url

    tables = None
    if args.tables:
        try:
            with open(args.tables) as fh:
                tables = fh.read()
            from ..spark.streaming import _tables

            _tables(tables)
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"factstream logs: --tables {args.tables}: {err}", file=sys.stderr)
            return 2
    try:
        spark = _session(args)
    except RuntimeError as err:
        print(f"factstream logs: {err}", file=sys.stderr)
        return 2
    from ..spark.streaming import run_stream as wait_for, start_stream

    def on_batch(batch_id: int, files: int) -> None:
        print(f"batch {batch_id}: {files} files published", file=sys.stderr, flush=True)

    streams = [s.strip() for s in args.streams.split(",") if s.strip()]
    try:
        query = start_stream(
            spark, args.db, args.out, args.checkpoint, streams=streams, trigger_seconds=args.trigger,
            tables=tables, on_batch=on_batch,
        )
        print(f"streaming {redact_url(args.db)} into {args.out} (checkpoint {args.checkpoint})", file=sys.stderr,
              flush=True)
        wait_for(query, stop_when_idle=args.stop_when_idle)
    except KeyboardInterrupt:
        print("factstream logs: interrupted; the query resumes from its checkpoint", file=sys.stderr)
        return 130
    except Exception as err:
        print(f"factstream logs: the streaming query failed: {job_error(err)}", file=sys.stderr)
        return 1
    return 0
