"""``factstream logs parse|report|stream``: bulk analysis of archived and live replication traffic with Spark."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from ..spark.formats import FORMATS, FORMATS_HELP
from . import missing_sqlite
from .argtypes import duration, number, whole_number


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "logs",
        help="parse archived replication logs with Spark and report on them, or stream a writer's facts live",
        description=(
            "Parse archived replication traffic (TCP session logs, redis-cli captures; plain or gzip) "
            "in bulk with Spark and factstream's own codec, store it as Parquet, and report per stream "
            "and writer; or stream a writer's facts into the same Parquet layout. Needs the spark extra (pip install 'factstream[spark]') and Java 17."
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
    parse.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="files, directories (recursive) or globs; gzip files are decompressed, whatever their name")
    parse.add_argument("--out", required=True, metavar="DIR", help="Parquet output directory")
    parse.add_argument("--format", choices=FORMATS, default="auto", help="archive format (default: detect per file)")
    parse.add_argument(
        "--mode",
        choices=("error", "overwrite", "append"),
        default="error",
        help="when OUT exists: fail (default), overwrite the partitions written again, or append; both only into "
        "an earlier output (anything else in OUT is refused, never replaced)",
    )
    parse.add_argument("--header-only", action="store_true", help="skip the typed events/caches columns (faster)")
    parse.add_argument(
        "--chunk-mb", type=number(0), default=32.0, metavar="MB",
        help="smallest chunk a plain file is cut into; files are cut only as far as the cores need "
        "(default 32; 0: never cut)",
    )
    parse.set_defaults(func=run_parse)

    report = sub.add_parser(
        "report",
        parents=[spark_opts],
        help="report per stream and writer over parsed Parquet",
        description=(
            "Print, per (stream, writer): row counts, token range, rows per second over time, tokens "
            "that went backwards, gaps (tokens no row of the stream carries: judged across all its writers, "
            "which share one sequence in Synapse's multi-writer streams), POSITION jumps, unterminated batch "
            "runs; and malformed lines per file. Sequences are judged within each capture: the files of a "
            "rotated capture are one sequence, and a recorder's disconnect marker is a hole, not a gap."
        ),
    )
    report.add_argument("dir", metavar="DIR", help="output directory of 'factstream logs parse'")
    report.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    report.add_argument(
        "--chart", metavar="PNG",
        help="also draw rows/s per stream over time into this PNG file: empty buckets are zeros, gaps and "
        "backwards tokens are marked, recorder disconnects shaded",
    )
    report.add_argument("--by-writer", action="store_true", help="chart: one line per (stream, writer), not per stream")
    report.add_argument("--log-scale", action="store_true", help="chart: logarithmic rows/s axis (zero stays visible)")
    report.add_argument("--bucket", type=whole_number(1), default=60, metavar="SECONDS", help="time bucket for rows/s (default 60)")
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
            "'factstream record' and stream the closed files with --files DIR instead (docs/spark.md, Streaming)."
        ),
        epilog="example: factstream logs stream --db postgresql://localhost/facts --out /data/repl.parquet "
        "--checkpoint /data/repl.checkpoint",
    )
    source = stream.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", metavar="URL", help="the writer's database (postgresql://... or sqlite:///...): "
                        "exactly once from the source of truth")
    source.add_argument("--files", metavar="DIR", help="closed files of 'factstream record' under DIR (Spark's file "
                        "stream; for carriers that cannot replay, e.g. Redis pub/sub): each closed file exactly once")
    stream.add_argument("--glob", metavar="GLOB",
                        help="with --files: names of closed files (default *.log.gz; the recorder's open .part files "
                        "never match)")
    stream.add_argument("--header-only", action="store_true", help="with --files: skip the typed columns (faster)")
    stream.add_argument("--out", required=True, metavar="DIR", help="Parquet output directory (appended to)")
    stream.add_argument("--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory of this query")
    stream.add_argument("--streams", metavar="A,B", help="with --db: streams to follow (default: all tables known)")
    stream.add_argument(
        "--tables", metavar="JSON", help="with --db: JSON file listing the streams' tables [{stream, table, columns, plain_columns}] "
        "(default: factstream's tables as 'serve' writes them)"
    )
    stream.add_argument("--trigger", type=duration(), default=1.0, metavar="SECONDS", help="micro-batch interval (default 1)")
    stream.add_argument(
        "--stop-when-idle", type=duration("keep running"), default=0.0, metavar="SECONDS",
        help="exit 0 once no new facts arrived for this long (default: run until interrupted)",
    )
    stream.set_defaults(func=run_stream)
    for command in (parse, report, stream):
        command.set_defaults(func=_spark_errors(command.get_default("func")))


class UsageError(Exception):
    """A mistake in the command line or its paths, found before any work starts (exit status 2)."""


class SparkDidNotStart(RuntimeError):
    """The Spark session could not be started (exit status 2): the message says why, with the end of its log."""


def _conf(args: argparse.Namespace) -> dict[str, str]:
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--conf expects KEY=VALUE, got {item!r}")
        conf[key] = value
    return conf


def _check_spark_options(args: argparse.Namespace) -> None:
    """The Spark options that name local things, checked before the JVM starts."""
    _conf(args)
    if isinstance(args.ship_env, str) and not os.path.isfile(args.ship_env):
        raise UsageError(f"--ship-env {args.ship_env}: no such file")


#: A file: URL of a local path as Hadoop reads it: the scheme in any case, an absolute path, no host (file:/x, file:///x).
_FILE_URL = re.compile(r"(?i)file:(?://(?=/)|(?=/(?!/)))")


def _is_local(path: str) -> bool:
    """Whether ``path`` names a local path that os.path can check: a plain path, or a file: URL without a host.

    Anything else Spark is given is a URL of a Hadoop filesystem (hdfs://, s3a://, viewfs://, a file: URL
    with a host or a relative path, which Hadoop refuses): see :class:`factstream.spark.pipeline.HadoopPath`.
    """
    if path[:5].lower() == "file:":
        return _FILE_URL.match(path) is not None
    return "://" not in path


def _local(path: str) -> str:
    found = _FILE_URL.match(path)
    return os.path.abspath(path[found.end():] if found else path)


class _SparkLog:
    """Where Spark writes its own output without --debug: a temporary file, removed at exit unless an error names it.

    The driver JVM (log4j, its notices, the stack of every failed task), the
    local Python workers and pyspark's JSON records of failed queries write
    there for the whole run instead of on our stdout and stderr: a failed
    job is said in one line, and when that line is not enough (an error that
    is not the user's input) it names this file, kept with the traceback
    appended.
    """

    PREFIX = "factstream-spark-"
    KEPT_PREFIX = "factstream-spark-kept-"  # a kept log's name: only these are ever pruned, never a running job's
    path: str | None = None
    made: str | None = None  # the path the log was made at (a kept log is renamed)
    kept = False
    KEEP = 10  # kept logs older than the newest this many are removed when another is kept

    @classmethod
    def create(cls) -> str:
        import atexit
        import tempfile

        fd, cls.path = tempfile.mkstemp(prefix=cls.PREFIX, suffix=".log")
        os.close(fd)
        cls.made = cls.path
        atexit.register(cls._drop)
        return cls.path

    @classmethod
    def keep(cls, err: BaseException) -> str | None:
        """The log's path, kept after exit with ``err``'s traceback (passwords masked) at its end; None with --debug."""
        import traceback

        from ..redaction import redact_text

        if cls.path is None:
            return None
        cls.kept = True
        try:
            with open(cls.path, "a") as log:
                log.write("\nfactstream logs: the error reported:\n" + redact_text("".join(traceback.format_exception(err))))
            name = os.path.basename(cls.path)
            if not name.startswith(cls.KEPT_PREFIX):
                kept = os.path.join(os.path.dirname(cls.path), cls.KEPT_PREFIX + name[len(cls.PREFIX):])
                os.rename(cls.path, kept)  # the JVM's and workers' open descriptors follow it
                cls.path = kept
                cls._prune()
        except OSError:
            pass
        return cls.path

    @classmethod
    def _prune(cls) -> None:
        """Remove this user's kept logs beyond the newest KEEP in the same directory (failed runs add up)."""
        import glob

        assert cls.path is not None
        mine = []
        for path in glob.glob(os.path.join(glob.escape(os.path.dirname(cls.path)), cls.KEPT_PREFIX + "*.log")):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_uid == os.getuid() and path != cls.path:
                mine.append((st.st_mtime, path))
        for _, path in sorted(mine, reverse=True)[cls.KEEP - 1:]:
            try:
                os.unlink(path)
            except OSError:
                pass

    @classmethod
    def _drop(cls) -> None:
        # The file at the name the log was made at goes, unless it is the kept log (a kept log was renamed:
        # what is there then is something opened anew after the rename).
        if cls.made is None or (cls.kept and cls.made == cls.path):
            return
        try:
            os.unlink(cls.made)
        except OSError:
            pass


def _session(args: argparse.Namespace) -> Any:
    """Start Spark; without -vv/--debug its own output goes to a log file (:class:`_SparkLog`), not the console.

    The JVM inherits our stdout and stderr and writes to them for the whole
    run: Java's notices and stack traces are tracebacks too, shown with
    -vv/--debug only; then the JVM's stdout points at stderr, so that stdout
    carries only the report. If the start fails, the log's last lines are
    the error's detail.
    """
    from ..spark.session import make_session

    conf = _conf(args)
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    debug = bool(getattr(args, "debug", False))
    log = None if debug else _SparkLog.create()
    saved_out = None
    if debug:
        sys.stdout.flush()
        saved_out = os.dup(1)
        os.dup2(2, 1)
    try:
        return make_session(
            args.master, conf=conf, ship_env=args.ship_env, executor_python=args.executor_python,
            log_level="WARN", log_file=log,
        )
    except Exception as err:
        detail = ""
        if log is not None:
            with open(log, "rb") as fh:
                tail = [ln for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()][-5:]
            detail = "".join(f"\n  {ln}" for ln in tail)
        raise SparkDidNotStart(f"Spark did not start: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}{detail}") from err
    finally:
        if saved_out is not None:
            os.dup2(saved_out, 1)
            os.close(saved_out)


# The last line of a Python traceback ("ModuleNotFoundError: No module named ..."), not Java's dotted names.
# Our own errors may come with their module path (factstream.store.database.DatabaseUnavailable: ...).
_PY_ERROR = re.compile(r"^\s*(?:factstream(?:\.\w+)*\.)?([A-Z]\w*(?:Error|Exception|Unavailable|Mismatch): .*)$", re.M)


#: Java exceptions (anywhere in a failure's chain of causes) that say the user's paths are wrong, not our code.
_USERS_PATHS = ("ParentNotDirectoryException", "FileAlreadyExistsException", "AccessDeniedException",
                "AccessControlException", "FileNotFoundException", "NoSuchFileException")


def _java_chain(err: BaseException) -> list[tuple[str, str]]:
    """(class, message) of the Java exception behind ``err`` and its causes, outermost first; [] if none.

    Asked of the JVM (py4j's exception, or the origin of pyspark's converted
    one), else read from the text: "class: message" blocks after py4j's
    "An error occurred while calling ...:" and after each "Caused by:".
    """
    java = getattr(err, "java_exception", None) or getattr(err, "_origin", None)
    chain: list[tuple[str, str]] = []
    try:
        while java is not None and len(chain) < 20:
            chain.append((str(java.getClass().getName()), str(java.getMessage() or "")))
            java = java.getCause()
    except Exception:  # noqa: BLE001 - the JVM may be gone; the text still says it
        chain = []
    if chain:
        return chain
    head = re.compile(r"^(?:: |Caused by: )?([a-z][\w$]*(?:\.[\w$]+)+)(?:: (.*))?$")
    open_block = False
    for line in str(err).splitlines():
        found = head.match(line)
        if found and (chain or line.startswith(": ") or not line.startswith(("Caused", " ", "\t"))):
            chain.append((found.group(1), found.group(2) or ""))
            open_block = True
        elif open_block and line.strip() and not re.match(r"^\s+(?:at |\.\.\. \d+ more)", line):
            cls, msg = chain[-1]
            chain[-1] = (cls, f"{msg}\n{line}")
        else:
            open_block = False
    return chain


#: Spark's words for a part file's Parquet column of another type than the dataset's: (path, column, expected, found)
#: in that order (4.x: FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH; 3.5: "Parquet column cannot be converted").
_TYPE_MISMATCHES = (
    re.compile(r"Encountered error while reading file (\S+?)\.? Data type mismatches when reading Parquet column "
               r"\[?([^\]\s]+?)\]?\. Expected Spark type (\S+?), actual Parquet type (\S+?)\.?(?:\s|$)"),
    re.compile(r"Parquet column cannot be converted in file (\S+?)\.? Column: \[([^\]]+)\], Expected: (\S+?), "
               r"Found: (\S+?)\.?(?:\s|$)"),
)


def _type_mismatch(chain: list[tuple[str, str]]) -> tuple[str, str, str, str] | None:
    """(path, column, expected type, type found) if a Java error of ``chain`` is a part file's column of another type."""
    for _, message in chain:
        for pattern in _TYPE_MISMATCHES:
            found = pattern.search(_clean(message))
            if found:
                path, column, expected, actual = found.groups()
                return path, column, expected, actual
    return None


def _clean(message: str) -> str:
    """A Spark message without its query context ("== DataFrame ==" ...), SQLSTATE and line breaks."""
    message = re.split(r"\n== ", message)[0]
    message = re.sub(r"\s*SQLSTATE: \w+\.?", "", message)
    return " ".join(message.split())


def _explain(err: BaseException, capture_pattern: str | None = None) -> tuple[str, bool]:
    """(one line, whether it is the user's to fix) for an exception out of Spark, passwords masked.

    The user's: a Python error of the executors naming a module they lack,
    a file Spark could not read (FAILED_READ_FILE: corrupt, someone else's,
    a column of another type), a path Spark cannot write, a
    ``capture_pattern`` Java's regular expressions refuse, a ``--conf``
    value Spark refuses (INVALID_CONF_VALUE). Anything else
    is said as Spark's error-class message with its deepest cause.
    """
    from ..redaction import redact_text

    text = str(err)
    found = _PY_ERROR.findall(text)
    if found:
        line = found[-1].strip().split("Traceback (most recent call last)")[0].rstrip(" :") or type(err).__name__
        users = "No module named" in line and any(m in line for m in ("'factstream", "'pyarrow"))
        if users:
            line += (" (the executors' Python lacks it: install factstream[spark] on every worker, "
                     "or ship it with --ship-env; see docs/spark.md)")
        return redact_text(line[:2000]), users
    chain = _java_chain(err)
    if not chain:
        return redact_text((text.strip().splitlines() or [type(err).__name__])[0][:2000]), False
    names = [cls.rsplit(".", 1)[-1] for cls, _ in chain]
    if capture_pattern is not None and "PatternSyntaxException" in names:
        lines = chain[names.index("PatternSyntaxException")][1].splitlines() or [""]
        java = f" in '{lines[1]}'" if len(lines) > 1 and lines[1] != capture_pattern else ""
        return redact_text(f"--capture-pattern '{capture_pattern}' is valid in Python but not in Java, whose regular "
                           f"expressions Spark matches it with: {lines[0]}{java}; write it in the syntax both share"), True
    # The failure is named by the first message with an error class ("[FAILED_READ_FILE.NO_HINT] ..."), else
    # by the deepest cause (a job aborted "due to stage failure" says what failed in its causes).
    last = len(chain) - 1
    at = next((i for i, (_, msg) in enumerate(chain) if msg.startswith("[")), last)
    main = chain[at][1] or names[at]
    root = chain[last][1] or names[last]
    failed_read = re.match(r"\[FAILED_READ_FILE\.\w+\] Encountered error while reading file (\S+?)\.?(?:\s|$)(.*)",
                           main, re.S)
    mismatch = _type_mismatch(chain)
    if mismatch:
        # One part file of other types than the one Spark took the dataset's types from
        path, column, expected, actual = mismatch
        return redact_text(
            f"cannot read {re.sub(r'^file:(?://)?', '', path)}: its column {column} is {actual}, where another part file "
            f"of the same dataset has {expected}: the part files of one dataset must agree on each column's type; move "
            "that one out of the dataset's directory (another program wrote or rewrote it), or parse the archives "
            "again into a new directory"[:2000]), True
    if failed_read:
        path = re.sub(r"^file:(?://)?", "", failed_read.group(1))
        detail = _clean(failed_read.group(2))
        if at != last and not chain[last][0].startswith("org.apache.spark."):
            # The reader's own words: "file:/x/part-0.parquet is not a Parquet file. ..." (the path said once)
            first, _, rest = root.partition(" ")
            detail = _clean(re.sub(r"^is ", "", rest) if first.endswith(os.path.basename(path)) else root)
        return redact_text(f"cannot read {path}: {detail or 'corrupt, or not Parquet'}"[:2000]), True
    line = _clean(main)
    if at != last and _clean(root) not in line:
        line += f": {_clean(root)}"
    line = re.sub(r"\bfile:(?://)?(?=/)", "", line)  # Hadoop's file:/x is the user's /x
    if "pyspark.daemon" in line or "pyspark.worker" in line:
        # Java's words for a Python worker that never answered: say which Python that is
        line += (" (the executors' Python did not start: check PYSPARK_PYTHON or spark.pyspark.python, and that it "
                 "is a Python with factstream[spark] installed)")
    # A --conf value Spark refuses (a time zone it cannot resolve, say) is the user's to correct
    users = any(name in _USERS_PATHS for name in names) or main.startswith("[INVALID_CONF_VALUE")
    return redact_text(line[:2000]), users


def _from_spark(err: BaseException) -> bool:
    """Whether ``err`` came out of Spark: py4j's errors (the JVM's, or the JVM gone) and pyspark's own."""
    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
    except ImportError:
        return False
    return isinstance(err, (Py4JError, PySparkException))


def _said(err: BaseException, args: argparse.Namespace) -> tuple[str, bool]:
    """(``err`` in one line, whether it is the user's): a line for what is not names Spark's log, kept."""
    line, users = _explain(err, getattr(args, "capture_pattern", None))
    log = None if users else _SparkLog.keep(err)
    return (f"{line} (details in Spark's log: {log})" if log else line), users


def _spark_errors(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with a refusal or a Spark failure it does not catch itself said in one line.

    A refusal (:class:`UsageError`: options, paths; :class:`SparkDidNotStart`)
    exits 2, for parse, report and stream alike: this is the one place that
    says it. A Spark failure exits 2 if it is the user's to fix, else 1: main()
    would call it an internal error, Java's stack on the same line. With
    --debug a Spark failure is left to main(): the traceback, Spark's log on stderr.
    """
    @functools.wraps(run)
    def guarded(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (UsageError, SparkDidNotStart) as err:
            print(f"factstream logs: {err}", file=sys.stderr)
            return 2
        except Exception as err:
            if getattr(args, "debug", False) or not _from_spark(err):
                raise
            line, users = _said(err, args)
            print(f"factstream logs: {line if users else 'the Spark job failed: ' + line}", file=sys.stderr)
            return 2 if users else 1

    return guarded


def _progress_enabled(args: argparse.Namespace) -> bool:
    return args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())


def _check_parse(args: argparse.Namespace) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """Inputs, --out and options checked before the JVM starts: the archive files found, and (path, problem)
    of the directories among the inputs that could not be read."""
    from ..spark.sources import list_inputs

    _check_spark_options(args)
    if "-" in args.inputs and not os.path.exists("-"):
        raise UsageError("logs parse reads files, not stdin ('-'): save the capture to a file and name it "
                         "('factstream decode -' reads stdin)")
    if _is_local(args.out):
        out = _local(args.out)
        if os.path.exists(out):
            _check_existing_out(args, "dir" if os.path.isdir(out) else "file", out)
        elif not os.path.isdir(os.path.dirname(out)):
            raise UsageError(f"--out {args.out}: directory {os.path.dirname(out)} does not exist")
    elif args.out[:5].lower() == "file:":  # Hadoop refuses a host (Wrong FS) and a relative path (no URI)
        raise UsageError(f"--out {args.out}: a file: URL names a local path, absolute and without a host: "
                         "file:///PATH, or the path itself")
    try:
        return list_inputs(args.inputs, quiet=True)  # the parse lists them again, and says what it skipped
    except (FileNotFoundError, OSError) as err:
        raise UsageError(str(err)) from err


def _check_out_through_spark(spark: Any, args: argparse.Namespace) -> None:
    """A --out os.path cannot see (hdfs://, s3a://, viewfs://...) checked as _check_parse checks a local one, before the job.

    Asked of the filesystem Spark writes it with, through the driver's JVM;
    a --out Hadoop cannot reach or resolve is refused here too, not after
    the job has been planned.
    """
    from ..spark.pipeline import HadoopPath

    try:
        where = HadoopPath(spark, args.out)
        kind = where.kind()
    except Exception as err:
        if not _from_spark(err):
            raise
        said = _explain(err)[0]
        raise UsageError(f"--out {args.out}: {said}{_connector_hint(args.out, said)} (nothing was written)") from err
    if kind is not None:
        _check_existing_out(args, kind, args.out, where.entries)


#: Hadoop's words for a scheme it has no filesystem class for, or one whose class is not on the classpath.
_NO_FILESYSTEM = re.compile(r'No FileSystem for scheme|Class \S+FileSystem not found')


def _connector_hint(out: str, said: str) -> str:
    """What to do when Spark has no filesystem for ``out``'s scheme: its connector goes on Spark's classpath."""
    if not _NO_FILESYSTEM.search(said):
        return ""
    scheme = out.split(":", 1)[0].lower()
    example = " (for s3a: org.apache.hadoop:hadoop-aws of Spark's Hadoop version)" if scheme.startswith("s3") else ""
    return (f"; this Spark has no filesystem for {scheme}://: add its Hadoop connector with --conf "
            f"spark.jars.packages=GROUP:ARTIFACT:VERSION{example}")


def _shown(given: str, paths: list[str]) -> str:
    """Paths relative to ``given`` as the user would type them: the first three, and how many in all."""
    named = ", ".join(os.path.join(given, p) for p in paths[:3])
    return named + (f" ... ({len(paths)} in all)" if len(paths) > 3 else "")


def _check_existing_out(
    args: argparse.Namespace, kind: str, out: str, entries: Callable[[str], list[tuple[str, bool]]] | None = None
) -> None:
    """Refuse an existing --out whose contents Spark would destroy or spoil: only 'logs parse' output is added to.

    ``kind`` is "dir" or "file"; ``out`` is listed locally, or with
    ``entries`` (:meth:`.HadoopPath.entries`). Spark deletes a regular file
    where it puts a partition directory, without a word (append and
    overwrite alike), and writes partitions beside anything else, which then
    makes the directory unreadable as one dataset. Neither mode is asked to
    do that: overwrite replaces partitions, nothing more. Nor to add part
    files to ones whose columns are of other types (read locally).
    """
    from ..spark.pipeline import output_clashes

    given, mode = args.out, args.mode
    if kind != "dir":
        raise UsageError(f"--out {given} is a file, not a directory: name a new directory for the Parquet, "
                         "or the output of an earlier 'logs parse' with --mode append or overwrite")
    if mode == "error":
        raise UsageError(f"{given} already exists; use --mode overwrite or --mode append")
    try:
        files, others = output_clashes(out, entries)
    except OSError as err:
        raise UsageError(f"--out {given}: cannot list {err.filename or out}: {err.strerror or err}") from err
    except Exception as err:
        if not _from_spark(err):
            raise
        raise UsageError(f"--out {given}: cannot list it: {_explain(err)[0]}") from err

    if files:
        what, it = ("is a file", "it") if len(files) == 1 else ("are files", "them")
        raise UsageError(f"{_shown(given, files)} {what} where 'logs parse' writes a partition directory: move {it} "
                         f"out of {given}, or choose another --out (nothing was written)")
    if others:
        raise UsageError(f"--out {given} is not the output of 'logs parse' (it holds {_shown(given, others)}): --mode "
                         f"{mode} adds only to such a directory; choose a new --out, or move those out of it "
                         "(nothing was written)")
    if entries is None:
        from ..spark.report import odd_part_files

        total, odd = odd_part_files(out)
        if odd:
            column, kinds = _first_odd(odd)
            raise UsageError(f"--out {given} holds part files that 'logs parse' did not write as it writes them now: "
                             f"{_odd_said(given, column, kinds, total)}: --mode {mode} would mix in part files that "
                             "disagree with them, which 'logs report' cannot read together; move those out of "
                             f"{given}, or choose a new --out (nothing was written)")


def _first_odd(odd: dict[str, dict[str, list[str]]]) -> tuple[str, dict[str, list[str]]]:
    """The first column (in the report's order) of :func:`.report.odd_part_files`' answer, and its odd files."""
    from ..spark.report import COLUMN_TYPES

    column = min(odd, key=list(COLUMN_TYPES).index)
    return column, odd[column]


def _odd_said(given: str, column: str, kinds: dict[str, list[str]], total: int) -> str:
    """"column token is string in 1 of the 4 part files (DIR/...), where 'logs parse' writes an integer"."""
    from ..spark.report import COLUMN_TYPES

    counts = " and ".join(f"missing from {len(paths)}" if kind == "missing" else f"{kind} in {len(paths)}"
                          for kind, paths in sorted(kinds.items()))
    paths = sorted(p for ps in kinds.values() for p in ps)
    return (f"column {column} is {counts} of the {total} part files ({_shown(given, paths)}), "
            f"where 'logs parse' writes {COLUMN_TYPES[column][0]}")


def _unreadable(files: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """(path, problem) of every input not parsed at all: unreadable, or compressed with other than gzip.

    The parse skips them (with a warning as it plans); they are named again at the end and make the exit status 2.
    """
    from ..spark.sources import input_problem

    found = [(path, input_problem(path, size)) for path, size in files]
    return [(path, f"not parsed: {problem}") for path, problem in found if problem is not None]


class _DropPy4j(logging.Filter):
    """Drops py4j's own log records, on the root logger and on its own ``py4j.*`` loggers alike.

    A logger's filter sees only the records logged on that very logger, not those its children
    propagate up, so it is installed on the root logger's handlers too.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


def quiet_py4j() -> None:
    """Keep py4j's log records (tracebacks of calls a Ctrl-C cut short) out of what the root logger writes."""
    drop = _DropPy4j()
    root = logging.getLogger()
    for where in (root, *root.handlers):
        where.addFilter(drop)


class _Interrupted(Exception):
    """Ctrl-C arrived while Spark was working."""


def _temporary_sibling(out: str) -> str:
    parent, base = os.path.split(out.rstrip(os.sep))
    return os.path.join(parent, f".{base}.factstream-tmp-{os.getpid()}")


def _remove_staging(out: str) -> None:
    """What an interrupted Spark write leaves inside an existing OUT (readers ignore it, re-runs trip on it)."""
    import shutil

    if not os.path.isdir(out):
        return
    for name in os.listdir(out):
        if name == "_temporary" or name.startswith(".spark-staging-"):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)


def run_parse(args: argparse.Namespace) -> int:
    import shutil
    import signal

    files, unlisted = _check_parse(args)

    from ..spark.lines import ParseOptions
    from ..spark.damage import DamagedInputs, gzip_problems, what_was_parsed
    from ..spark.pipeline import parse_archives, write_parquet
    from ..spark.progress import task_progress

    spark = _session(args)
    local = _is_local(args.out)
    if not local:
        _check_out_through_spark(spark, args)  # what _check_parse checks of a local --out, asked of Hadoop
    # A new OUT is written beside it under a hidden name and renamed when complete: an interrupted
    # or failed run leaves nothing behind that blocks the next one.
    out = _local(args.out) if local else args.out
    fresh = local and not os.path.exists(out)
    target = _temporary_sibling(out) if fresh else out
    interrupted = False
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        # Not pyspark's own handler: it calls the JVM from inside the call that was interrupted
        # (py4j then logs "reentrant call" tracebacks). The jobs are cancelled below instead.
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    # py4j logs a traceback when a signal cuts one of its calls short.
    if not getattr(args, "debug", False):
        quiet_py4j()
    bad: list[tuple[str, str]] = []
    skipped: list[str] = []  # files the plan left out: unreadable (named in bad too), or no replication archive
    try:
        try:
            bad = [(path, f"not parsed: {why}") for path, why in unlisted]
            bad += _unreadable(files)
            damaged = DamagedInputs(spark)  # the parse names the gzip inputs that break, as it reads them
            df = parse_archives(
                spark,
                args.inputs,
                ParseOptions(format=args.format, typed=not args.header_only),
                chunk_bytes=int(args.chunk_mb * 1024 * 1024),
                skipped=skipped,
                damaged=damaged,
            )
            mode = "errorifexists" if args.mode == "error" else args.mode
            with task_progress(spark.sparkContext, "parsing", enabled=_progress_enabled(args)):
                write_parquet(df, target, mode)
            bad += damaged.found()
            # Skipped files no task read: a gzip file cut before its first detectable line is named too.
            not_read = set(skipped) - {path for path, _ in bad}
            left_out = [(path, size) for path, size in files if path in not_read]
            bad += [(path, f"not parsed: {problem}") for path, problem in gzip_problems(spark, left_out)]
        except KeyboardInterrupt:
            raise _Interrupted from None
        except FileNotFoundError as err:
            if interrupted:
                raise _Interrupted from None
            print(f"factstream logs: {err}", file=sys.stderr)
            return 2
        except Exception as err:  # AnalysisException has no stable import path across Spark versions
            if interrupted:
                raise _Interrupted from None
            if "already exists" in str(err):
                print(f"factstream logs: {args.out} already exists; use --mode overwrite or --mode append", file=sys.stderr)
                return 2
            print(f"factstream logs: the Spark job failed: {_said(err, args)[0]}", file=sys.stderr)
            return 1
        if fresh:
            try:
                os.rename(target, out)
            except OSError as err:
                print(f"factstream logs: cannot move the result to {args.out}: {err.strerror}", file=sys.stderr)
                return 1
            target = out
    except _Interrupted:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleaning up
        try:
            spark.sparkContext.cancelAllJobs()
            spark.stop()  # tasks still running must not write into what is removed next
        except Exception:  # noqa: BLE001 - the context may already be half gone; the files still go
            pass
        if fresh:
            shutil.rmtree(target, ignore_errors=True)
            print(f"factstream logs: interrupted; nothing written to {args.out}", file=sys.stderr)
        else:
            if local:
                _remove_staging(out)
            print(f"factstream logs: interrupted; {args.out} holds what earlier runs wrote (and any "
                  "partitions committed before the interruption)", file=sys.stderr)
        return 130
    finally:
        if fresh and target != out:
            shutil.rmtree(target, ignore_errors=True)
        if not interrupted:
            signal.signal(signal.SIGINT, previous)
    lines, malformed = _written(spark, args.out)
    print(f"wrote {lines} lines ({malformed} malformed) to {args.out}", file=sys.stderr)
    for path, problem in sorted(bad):
        if not problem.startswith("not parsed: "):
            problem += f"; {what_was_parsed(problem)}"
        print(f"factstream logs: {path}: {problem}", file=sys.stderr)
    if bad:
        print(f"factstream logs: {_bad_count(len(bad), len(files) + len(unlisted), skipped, bad)}", file=sys.stderr)
        return 2
    return 0


def _bad_count(n_bad: int, found: int, skipped: list[str], bad: list[tuple[str, str]]) -> str:
    """"N of M inputs could not be read to their end", saying what M counts when files found were no archives.

    M is every file and unreadable directory found; a README or MANIFEST.json
    among them is skipped (warned about as the job is planned), so the count
    of files that were to be parsed is given beside it.
    """
    named = {path for path, _ in bad}
    not_archives = len(set(skipped) - named)
    text = f"{n_bad} of {found} inputs could not be read to their end"
    if not_archives:
        what = "not a replication archive" if not_archives == 1 else "not replication archives"
        text += f" ({found} found: {found - not_archives} to parse, {not_archives} {what}, skipped)"
    return text


def _written(spark: Any, out: str) -> tuple[int, int]:
    """(lines, malformed lines) in the Parquet output ``out``.

    Inputs that held no line at all (a gzip file cut off in its header, say)
    leave an output with no Parquet file in it, whose schema Spark cannot
    infer: that is 0 lines, not an error.
    """
    try:
        counts = spark.read.parquet(out).selectExpr("count(1) AS lines", "count(error) AS bad").first()
    except Exception as err:  # AnalysisException has no stable import path across Spark versions
        if "UNABLE_TO_INFER_SCHEMA" in str(err):
            return 0, 0
        raise
    return int(counts["lines"]), int(counts["bad"])


def _check_report(args: argparse.Namespace) -> None:
    """DIR and the options checked before the JVM starts."""
    from ..spark.captures import CapturePatternError, check_pattern

    _check_spark_options(args)
    if args.capture_pattern is not None:
        try:
            check_pattern(args.capture_pattern)
        except CapturePatternError as err:
            raise UsageError(str(err)) from err
    if (args.by_writer or args.log_scale) and not args.chart:
        raise UsageError("--by-writer and --log-scale shape the chart: add --chart PNG")
    if args.chart:
        parent = os.path.dirname(os.path.abspath(args.chart))
        if not os.path.isdir(parent):
            raise UsageError(f"--chart {args.chart}: directory {parent} does not exist")
        if os.path.isdir(args.chart):
            raise UsageError(f"--chart {args.chart} is a directory; name the PNG file to write")
    if not _is_local(args.dir):
        return
    path = _local(args.dir)
    if not os.path.exists(path):
        raise UsageError(f"{args.dir}: no such directory")
    parquet = os.path.isfile(path) and path.endswith(".parquet")
    if os.path.isdir(path):
        parquet = any(
            name.endswith(".parquet") for _, dirs, names in os.walk(path) for name in names if not name.startswith((".", "_"))
        )
    if not parquet and os.path.exists(os.path.join(path, "_SUCCESS")):
        raise UsageError(f"{args.dir} holds no Parquet files: the 'logs parse' that wrote it found no lines")
    if not parquet:
        raise UsageError(
            f"{args.dir} holds no Parquet files (archives?): parse them first with "
            f"'factstream logs parse {args.dir} --out PARQUET_DIR', then report on PARQUET_DIR"
        )
    if os.path.isdir(path):
        from ..spark.report import odd_part_files

        # Spark takes the types of one part file: another one of other types fails the report or, a column
        # missing, reads as nulls. Part files that all hold a column otherwise are someone else's Parquet: said
        # once Spark has read it (_not_ours).
        total, odd = odd_part_files(path)
        mixed = {column: kinds for column, kinds in odd.items() if sum(map(len, kinds.values())) < total}
        if mixed:
            column, kinds = _first_odd(mixed)
            raise UsageError(f"the part files of {args.dir} disagree on a column: "
                             f"{_odd_said(args.dir, column, kinds, total)}, as the others hold it: move those out of "
                             f"{args.dir} (another program wrote or rewrote them), or parse the archives again into "
                             "a new directory")


def _unmatched_pattern(df: Any, pattern: str, where: str) -> str | None:
    """Why --capture-pattern would be ignored (it names no file's capture), or None.

    A pattern that matches no file leaves every file a capture of its own,
    exactly as without it: that is refused like the other inputs that hold nothing.
    """
    from ..spark.captures import pattern_matches

    names = sorted({os.path.basename(r["source_file"]) for r in df.select("source_file").distinct().collect()})
    if not names or any(pattern_matches(pattern, name) for name in names):
        return None
    shown = ", ".join(names[:3]) + (f" ... ({len(names)} files)" if len(names) > 3 else "")
    return (f"--capture-pattern {pattern!r} matches none of the file names in {where} ({shown}): "
            "fix it (it is searched in each base name; its capture group must not be empty) or leave it out")


def _not_ours(df: Any, where: str) -> str | None:
    """Why the Parquet in ``where`` is not what 'logs parse' / 'logs stream' write (columns missing), or None.

    Someone else's Parquet otherwise fails deep in the report as an "internal error".
    """
    from ..spark.report import REQUIRED_COLUMNS, wrong_types

    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if not missing:
        # A type the report cannot use failed in our Python (ts as a string: "internal error: TypeError") or in
        # Spark (token as a string: a cast error, its log kept as if the job were at fault): named here instead.
        wrong = wrong_types(df.dtypes)
        if wrong:
            # (a local directory whose part files disagree was refused before Spark started)
            mixed = None if _is_local(where) else _disagreeing(df.sparkSession, where, wrong)
            if mixed:
                return mixed
            return (f"{where} is not the output of 'factstream logs parse' or 'logs stream': "
                    + "; ".join(f"its column {name} is {kind}, not {wanted}" for name, kind, wanted in wrong))
        return None
    has = ", ".join(df.columns[:8]) + (f" ... ({len(df.columns)} columns)" if len(df.columns) > 8 else "")
    return (f"{where} is not the output of 'factstream logs parse' or 'logs stream': its Parquet lacks the "
            f"column(s) {', '.join(missing)} (it has {has or 'none'})")


def _disagreeing(spark: Any, where: str, wrong: list[tuple[str, str, str]]) -> str | None:
    """Why ``where`` is refused when the part file Spark took its types from is another program's, but not all are.

    ``wrong``: (column, type, type wanted) of that part file. For a
    directory os.path cannot read (a local one's part files are read before
    Spark starts: :func:`.report.odd_part_files`); Spark's schema merge, which
    reads every part file's types, names the types that clash. None when they all agree (the directory is someone
    else's Parquet) or the merge does not say.
    """
    try:
        spark.read.option("mergeSchema", "true").parquet(where)
        return None
    except Exception as err:  # noqa: BLE001 - CANNOT_MERGE_SCHEMAS has no stable import path
        text = str(err)
    for column, _, wanted in wrong:
        kinds = sorted({kind.lower() for kind in re.findall(rf"[<,]\s*{re.escape(column)}: (\w+)", text)})
        if len(kinds) > 1:
            return (f"the part files of {where} disagree on a column: column {column} is {' in some, '.join(kinds)} "
                    f"in others, where 'logs parse' writes {wanted}: move the ones that do not hold it so out of "
                    f"{where} (another program wrote or rewrote them), or parse the archives again into a new directory")
    return None


#: Spark's setting that reads partition values such as stream=1 as numbers (default true).
_PARTITION_TYPES = "spark.sql.sources.partitionColumnTypeInference.enabled"


def run_report(args: argparse.Namespace) -> int:
    _check_report(args)

    from ..spark.progress import task_progress
    from ..spark.report import MAX_BUCKETS, build_report, narrower_integers, render_json, render_text

    spark = _session(args)
    if _PARTITION_TYPES not in _conf(args):
        # Partition values are names: a stream called "1" is "1", not an integer the type check would refuse.
        spark.conf.set(_PARTITION_TYPES, "false")
    try:
        df = spark.read.parquet(args.dir)
    except Exception as err:
        # Spark's reason (a corrupt footer: "cannot read FILE: not a Parquet file ..."), not py4j's "calling o46.parquet"
        line = _explain(err)[0]
        said = line if line.startswith("cannot read ") else f"cannot read Parquet from {args.dir}: {line}"
        print(f"factstream logs: {said}{_connector_hint(args.dir, said)}", file=sys.stderr)
        return 2
    problem = _not_ours(df, args.dir)
    if problem:
        print(f"factstream logs: {problem}", file=sys.stderr)
        return 2
    narrower = narrower_integers(df.dtypes)
    if narrower:
        # The types came from one part file: read as 'logs parse' writes them, every file of integers reads.
        from pyspark.sql.types import LongType, StructField, StructType

        df = spark.read.schema(StructType([StructField(f.name, LongType()) if f.name in narrower else f
                                           for f in df.schema.fields])).parquet(args.dir)
    if args.capture_pattern is not None:
        problem = _unmatched_pattern(df, args.capture_pattern, args.dir)
        if problem:
            print(f"factstream logs: {problem}", file=sys.stderr)
            return 2
    with task_progress(spark.sparkContext, "reporting", enabled=_progress_enabled(args)):
        report = build_report(df, bucket_seconds=args.bucket, capture_pattern=args.capture_pattern)
    if report["bucket_seconds"] != args.bucket:
        print(f"factstream logs: --bucket {args.bucket} widened to {report['bucket_seconds']} s: the archive spans "
              f"{report['first_ts']} .. {report['last_ts']}, more than {MAX_BUCKETS} buckets of {args.bucket} s",
              file=sys.stderr)
    status = 0
    if args.chart:
        from ..spark.chart import NoTimestamps, render_chart

        try:
            render_chart(report, args.chart, by_writer=args.by_writer, log_scale=args.log_scale)
            print(f"chart written to {args.chart}", file=sys.stderr)
        except NoTimestamps as err:
            print(f"factstream logs: no chart drawn: {err} (the recorder's files have timestamps; "
                  "bare wire lines do not)", file=sys.stderr)
            status = 1
    if args.json:
        render_json(report, sys.stdout)
    else:
        render_text(report, sys.stdout)
    return status


#: The names 'factstream record' gives its closed files (its open ones end in .part).
DEFAULT_GLOB = "*.log.gz"


def _stream_tables(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(tables JSON, streams to follow) of a --db stream, or UsageError: checked before the JVM starts."""
    from ..demo.tables import DEMO_TABLES
    from ..replication.tables import tables_from_json, tables_to_json

    text = tables_to_json(DEMO_TABLES)
    if args.tables:
        try:
            with open(args.tables) as fh:
                text = fh.read()
            tables_from_json(text)
        except (OSError, ValueError) as err:
            raise UsageError(f"--tables {args.tables}: {err}") from err
    from ..spark.streaming import select_streams

    try:
        streams = select_streams(tables_from_json(text), args.streams)
    except ValueError as err:
        where = f"--tables {args.tables}" if args.tables else "factstream's tables; others need --tables FILE"
        raise UsageError(f"--streams {args.streams}: {err} ({where})") from err
    return text, streams


def _check_stream(args: argparse.Namespace) -> tuple[str, list[str]]:
    """Options of 'logs stream' checked before the JVM starts; (tables JSON, streams) with --db."""
    if args.db:
        given = [opt for opt, value in (("--glob", args.glob), ("--header-only", args.header_only)) if value]
        other = "--files DIR (they choose and shape its files)"
    else:
        given = [opt for opt, value in (("--streams", args.streams), ("--tables", args.tables)) if value is not None]
        other = "--db URL (the files of --files hold every stream; choose them with --glob)"
    if given:
        them = "them" if len(given) > 1 else "it"
        raise UsageError(f"{' and '.join(given)} only work{'' if len(given) > 1 else 's'} with {other}; "
                         f"leave {them} out with {'--db' if args.db else '--files'}")
    _check_spark_options(args)
    if args.files:
        if _is_local(args.files):
            if not os.path.isdir(_local(args.files)):
                raise UsageError(f"--files {args.files}: not a directory (the recorder's --dir)")
            args.files = _local(args.files)
        return "", []
    try:
        import pyspark.sql.datasource  # noqa: F401 - Spark 4's Python data sources
    except ImportError:
        raise UsageError("reading a database needs pyspark 4 (its Python data source API); "
                         "pip install 'pyspark>=4', or stream a recorder's closed files with --files DIR") from None
    chosen = _stream_tables(args)  # the options first: a usage mistake is named even when the database is missing
    problem = missing_sqlite(args.db, "logs stream")
    if problem:
        raise UsageError(f"--db: {problem}")
    return chosen


def _checkpoint_unused(checkpoint: str) -> bool:
    """True if ``checkpoint`` records no finished batch: removing it loses nothing (local paths only)."""
    commits = os.path.join(_local(checkpoint), "query", "commits")
    return not (os.path.isdir(commits) and any(not n.startswith(".") for n in os.listdir(commits)))


def run_stream(args: argparse.Namespace) -> int:
    import shutil

    from ..redaction import redact_url

    tables, streams = _check_stream(args)
    if args.db:
        from ..spark.streaming import SourceProblem, check_source
        from ..replication.tables import tables_from_json

        try:
            check_source(args.db, tables_from_json(tables), streams)
        except SourceProblem as err:
            print(f"factstream logs: {err}", file=sys.stderr)
            return 1
    # A checkpoint this run creates is removed again if the query fails before finishing a batch:
    # it holds nothing, and a leftover would make the next run look like a resumption.
    fresh_checkpoint = _is_local(args.checkpoint) and not os.path.exists(_local(args.checkpoint))
    spark = _session(args)
    from ..spark.streaming import CheckpointMismatch, run_stream as wait_for, start_stream

    if not getattr(args, "debug", False):
        quiet_py4j()  # py4j logs the traceback of a failed foreachBatch; the one line below says it

    def on_batch(batch_id: int, files: int) -> None:
        # publish_batch's count carries the batch's lines and malformed lines, counted as logs parse counts them
        lines = getattr(files, "lines", None)
        counts = "" if lines is None else f", {lines} lines ({getattr(files, 'malformed', 0)} malformed)"
        print(f"batch {batch_id}: {files} files published{counts}", file=sys.stderr, flush=True)

    try:
        if args.files:
            from ..spark.filestream import start_file_stream

            glob = args.glob or DEFAULT_GLOB
            query = start_file_stream(
                spark, args.files, args.out, args.checkpoint, glob=glob, typed=not args.header_only,
                trigger_seconds=args.trigger, on_batch=on_batch,
            )
            what = f"closed files {glob} under {args.files}"
        else:
            query = start_stream(
                spark, args.db, args.out, args.checkpoint, streams=streams, trigger_seconds=args.trigger,
                tables=tables, on_batch=on_batch,
            )
            what = redact_url(args.db)
        print(f"streaming {what} into {args.out} (checkpoint {args.checkpoint})", file=sys.stderr, flush=True)
        wait_for(query, stop_when_idle=args.stop_when_idle)
    except KeyboardInterrupt:
        print("factstream logs: interrupted; the query resumes from its checkpoint", file=sys.stderr)
        return 130
    except (PermissionError, IsADirectoryError, NotADirectoryError, CheckpointMismatch) as err:
        # Refused before the query started (a checkpoint that cannot be written, or not the one this
        # --out was streamed with): the user's to fix, said as it is.
        print(f"factstream logs: {err}", file=sys.stderr)
        if fresh_checkpoint and _checkpoint_unused(args.checkpoint):
            shutil.rmtree(_local(args.checkpoint), ignore_errors=True)
        return 2
    except Exception as err:
        print(f"factstream logs: the streaming query failed: {_said(err, args)[0]}", file=sys.stderr)
        if fresh_checkpoint and _checkpoint_unused(args.checkpoint):
            shutil.rmtree(_local(args.checkpoint), ignore_errors=True)
        return 1
    return 0
