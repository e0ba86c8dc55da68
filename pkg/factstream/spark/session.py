"""A SparkSession whose executors run this very Python and see this factstream.

Executors start their own Python workers; unless told otherwise they pick
whatever ``python3`` is on the PATH, which may lack factstream or the compiled
codec. We pin them to ``sys.executable`` and hand them our ``sys.path``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["make_session", "require_spark", "executor_pythonpath", "quiet_pyspark_warnings"]


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
) -> SparkSession:
    """Get or create a SparkSession configured for factstream's Arrow pipeline.

    ``master`` is ``local[N]``/``local[*]`` or a cluster URL (``spark://host:7077``);
    on a cluster every node needs the same Python (with factstream and pyarrow)
    at ``sys.executable``, or set ``spark.pyspark.python`` in ``conf``.
    ``progress`` turns on Spark's console progress bar.
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
    if not master.startswith("local"):
        settings["spark.executorEnv.PYSPARK_PYTHON"] = python
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    # Local executors inherit the environment the JVM starts with; set it only
    # for that start, so the caller's process environment is left as it was.
    with _environ(PYTHONPATH=pythonpath, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", python),
                  PYSPARK_DRIVER_PYTHON=os.environ.get("PYSPARK_DRIVER_PYTHON", python)):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
