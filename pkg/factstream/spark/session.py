"""A SparkSession whose executors run this very Python and see this factstream.

Executors start their own Python workers; unless told otherwise they pick
whatever ``python3`` is on the PATH, which may lack factstream or the compiled
codec. We pin them to ``sys.executable`` and hand them our ``sys.path``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "EXECUTOR_TIMEOUT",
    "QUERY_CONTEXT_LOGGERS",
    "executor_pythonpath",
    "make_session",
    "quiet_pyspark_warnings",
    "require_spark",
    "route_query_context_logs",
    "session_cores",
    "wait_for_executors",
]

#: Seconds a cluster session waits for its first executor before giving up (``--conf
#: spark.factstream.executorTimeout=...``); without one a job waits forever for resources.
EXECUTOR_TIMEOUT = "120s"

#: pyspark's Python loggers (Spark 4) that write a JSON record of a failed query, its whole stack included,
#: to their own stderr handler as the exception is raised: the error the caller then reports, told first.
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")

#: A cluster's executors are taken as all there when none has joined for this long, or for half the
#: time the first one took to join if that is longer (see session_cores).
_SETTLE_S = 1.0


def require_spark() -> None:
    """Raise RuntimeError with what to install when pyspark, pyarrow or Java is missing."""
    missing = []
    for mod in ("pyspark", "pyarrow", "pandas"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not installed; install the spark extra: pip install 'factstream[spark]'"
        )
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise RuntimeError("Java not found; install a JDK 17 (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


def quiet_pyspark_warnings() -> None:
    """Silence pyspark's FutureWarning about pandas 3 (our Arrow path does not go through pandas)."""
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


def route_query_context_logs(handler: logging.Handler) -> None:
    """Send pyspark's query-context error records to ``handler`` instead of stderr.

    Every SQL error with a query context (a failed cast, say) is logged by
    pyspark on its own stderr handler, as JSON with the stack, before the
    caller sees the exception; pyspark turns their propagation off on each
    use. No-op on pyspark 3.5, which has no such loggers.
    """
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return
    for name in QUERY_CONTEXT_LOGGERS:
        logger = PySparkLogger.getLogger(name)  # made now if new, with pyspark's stderr handler: replaced
        for old in list(logger.handlers):
            logger.removeHandler(old)
            old.close()  # a file of an earlier session's; closing pyspark's stderr handler leaves stderr open
        logger.addHandler(handler)  # PySparkLogger formats it as JSON
        logger.propagate = False


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Our stdout and stderr appended to ``path`` for the duration: a JVM started meanwhile keeps them."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def executor_pythonpath() -> str:
    """The PYTHONPATH executors need to import the same factstream as the driver."""
    import factstream

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(factstream.__file__)))
    parts = [pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: list[str] = []
    for p in parts:
        p = os.path.abspath(p)
        if p not in seen:
            seen.append(p)
    return os.pathsep.join(seen)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def make_session(
    master: str = "local[*]",
    app_name: str = "factstream-logs",
    conf: Mapping[str, str] | None = None,
    *,
    progress: bool = False,
    log_level: str = "WARN",
    ship_env: bool | str = False,
    executor_python: str | None = None,
    log_file: str | None = None,
) -> SparkSession:
    """Get or create a SparkSession configured for factstream's Arrow pipeline.

    ``master`` is ``local[N]``/``local[*]`` or a cluster URL (``spark://host:7077``);
    on a cluster every node needs the same Python (with factstream and pyarrow)
    at ``sys.executable``, or set ``spark.pyspark.python`` in ``conf``.
    ``progress`` turns on Spark's console progress bar.

    ``ship_env`` ships factstream (compiled core included) and pyarrow to the
    executors as a site-packages overlay (see :mod:`.shipping`): ``True``
    builds or reuses the cached zip, a string names a zip to ship. Executors
    then run ``executor_python`` (default ``python3`` on the workers' PATH)
    instead of the driver's ``sys.executable``.

    On a cluster it waits for the first executor (``spark.factstream.executorTimeout``,
    120 s) and raises RuntimeError, the application stopped, if none joins:
    Spark would queue the job forever.

    ``log_file`` takes Spark's own output instead of the console, appended:
    the driver JVM starts with its stdout and stderr on it (log4j at
    ``log_level``, the JVM's notices, a failed task's stack, local Python
    workers' stderr) and pyspark's JSON records of failed queries go there
    too (:func:`route_query_context_logs`); the caller's own stdout and
    stderr are left as they were. A session that already exists keeps its
    JVM's output where it was.
    """
    require_spark()
    quiet_pyspark_warnings()
    from pyspark.sql import SparkSession

    python = sys.executable
    pythonpath = executor_pythonpath()
    settings: dict[str, Any] = {
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.executorEnv.PYTHONPATH": pythonpath,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "true" if progress else "false",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=warn",
    }
    if hasattr(socket, "AF_UNIX"):
        # JVM <-> Python worker over a Unix socket (Spark 4; ignored by 3.5): over loopback TCP every
        # Python task (every chunk of the parse) waited about 40-60 ms in its first reads (BENCHMARKS.md).
        settings["spark.python.unix.domain.socket.enabled"] = "true"
    if not master.startswith("local"):
        settings["spark.executorEnv.PYSPARK_PYTHON"] = python
    if ship_env:
        from .shipping import pack_executor_env, ship_settings

        archive = pack_executor_env() if ship_env is True else str(ship_env)
        settings.update(ship_settings(archive, executor_python or "python3"))
    elif executor_python:
        settings["spark.pyspark.python"] = settings["spark.executorEnv.PYSPARK_PYTHON"] = executor_python
    settings.update(conf or {})
    # pyspark takes the executors' Python from PYSPARK_PYTHON when the context starts.
    worker_python = settings["spark.pyspark.python"]
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    # Local executors inherit the environment the JVM starts with; set it only
    # for that start, so the caller's process environment is left as it was.
    if worker_python == python:
        worker_python = os.environ.get("PYSPARK_PYTHON", python)
    if log_file is not None:
        route_query_context_logs(logging.FileHandler(log_file, delay=True))
    with _environ(PYTHONPATH=pythonpath, PYSPARK_PYTHON=worker_python,
                  PYSPARK_DRIVER_PYTHON=os.environ.get("PYSPARK_DRIVER_PYTHON", python)):
        with _output_to(log_file) if log_file is not None else contextlib.nullcontext():
            spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if not master.startswith("local"):
        try:
            wait_for_executors(spark, _seconds(str(settings.get("spark.factstream.executorTimeout", EXECUTOR_TIMEOUT))))
        except BaseException:
            spark.stop()  # the application leaves the master: nothing of ours keeps waiting there
            raise
    return spark


def wait_for_executors(spark: SparkSession, timeout: float) -> None:
    """Raise RuntimeError unless an executor joins the application within ``timeout`` seconds.

    On a standalone cluster with no worker alive, or none with the cores and
    memory an executor asks for, Spark queues every job and only logs "Initial
    job has not accepted any resources" to its own log, forever. Dynamic
    allocation starts executors only for queued tasks: not waited for.
    """
    sc = spark.sparkContext
    conf = sc.getConf()
    if (conf.get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
        return
    deadline = time.monotonic() + timeout
    while _executors(spark) == 0:
        if time.monotonic() >= deadline:
            memory = conf.get("spark.executor.memory") or "1g"
            raise RuntimeError(
                f"no executor joined within {timeout:g} s: the master {sc.master} has no alive worker with a "
                f"free core and {memory} of free memory (spark.executor.memory); start workers or lower "
                "spark.executor.memory, and see the master's web UI for its workers "
                "(--conf spark.factstream.executorTimeout=SECONDS waits longer)"
            )
        time.sleep(0.2)


def session_cores(spark: SparkSession) -> int | None:
    """The cores this session's tasks run on, for sizing a plan; None when they cannot be known.

    ``spark.default.parallelism`` if set, and in local mode, is Spark's
    ``defaultParallelism``. On a cluster that figure counts the executors
    registered so far, and a session that has just started has few or none:
    executors join some seconds after the application starts, all at about
    the same time. So this waits for the first one (tasks cannot start before
    it anyway; at most ``spark.scheduler.maxRegisteredResourcesWaitingTime``,
    30 s) and then until none has joined for a second, or for half the time
    the first one took if that is longer (half the application's age when one
    had joined before the call): on a loaded machine executors start slowly
    and their arrivals spread with it. An application that has run for
    longer than that wait is taken as settled. With dynamic allocation
    executors come only for waiting tasks: None.
    """
    sc = spark.sparkContext
    conf = sc.getConf()
    if conf.get("spark.default.parallelism") or (sc.master or "").startswith("local"):
        return int(sc.defaultParallelism)
    if (conf.get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
        return None
    limit = _seconds(conf.get("spark.scheduler.maxRegisteredResourcesWaitingTime") or "30s")

    def age() -> float:
        return time.time() - sc.startTime / 1000

    def quiet_for() -> float:  # how long no new executor must join, once one has
        return max(_SETTLE_S, age() / 2)

    start = time.monotonic()
    seen, since = _executors(spark), start
    # One already here (the session was made a while ago): its age stands for the time the first took.
    window = quiet_for() if seen else _SETTLE_S
    settled = seen > 0 and age() > limit
    while not settled and time.monotonic() - start < limit:
        time.sleep(0.1)
        now = _executors(spark)
        if now != seen:
            if seen == 0:
                window = quiet_for()
            seen, since = now, time.monotonic()
        settled = seen > 0 and time.monotonic() - since >= window
    return int(sc.defaultParallelism) if seen > 0 else None


def _executors(spark: SparkSession) -> int:
    """Executors registered with the driver (its block managers, less the driver's own)."""
    jsc: Any = spark.sparkContext._jsc
    return max(0, int(jsc.sc().getExecutorMemoryStatus().size()) - 1)


def _seconds(value: str) -> float:
    """A Spark duration in seconds: "30s", "500ms", "2min", "1h", or a bare number of milliseconds."""
    value = value.strip().lower()
    for suffix, scale in (("ms", 0.001), ("min", 60.0), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * scale
    return float(value) / 1000
