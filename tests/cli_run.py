"""Run the installed ``factstream`` executable as a user would, for the CLI tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import subprocess_env

ENV = subprocess_env()
#: The console script pip installed next to this interpreter: what a user runs.
FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")


#: Under CI a missing service or tool fails the test; locally it skips.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_spark_cli(*modules: str) -> None:
    """Skip (fail under CI=true) unless pyspark, pyarrow, ``modules`` and a Java are there for ``logs``."""
    import importlib.util
    import shutil

    import pytest

    problems = [m for m in ("pyspark", "pyarrow", *modules) if importlib.util.find_spec(m) is None]
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        problems.append("java")
    if problems:
        msg = f"missing for the Spark CLI tests: {', '.join(problems)}"
        if IN_CI:
            pytest.fail(msg + " (CI=true: these tests must run)")
        pytest.skip(msg)


def cli(*args: str, timeout: float = 60, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``factstream ARGS`` to completion."""
    return subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=timeout, input=stdin,
                          env={**ENV, **env})


def start(*args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start ``factstream ARGS`` (stdout and stderr piped, text)."""
    return subprocess.Popen([FACTSTREAM, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, **kw)


def serve(db_url: str, *extra: str, server_name: str = "hs1") -> tuple[subprocess.Popen[str], int]:
    """A ``serve --status`` writer on a free port; (process, port)."""
    proc = start("serve", "--db", db_url, "--port", "0", "--status", "--server-name", server_name, *extra)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    first = json.loads(line)
    assert first["event"] == "listening"
    return proc, int(first["port"])


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 15) -> tuple[str, str]:
    """Signal ``proc``, wait, and return what is left of its output."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out or "", err or ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def no_traceback(text: str) -> bool:
    return "Traceback" not in text and 'File "' not in text


#: Spark options for a CLI run on this machine: local mode, no web UI.
LOCAL_SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
#: What to install when pyarrow is missing.
PYARROW_HOW = "it is in the spark extra: pip install 'factstream[spark]' (make install)"


def logs_cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``factstream logs ARGS`` in local mode, its temporary files (Spark's log among them) under ``tmp``."""
    tmp.mkdir(exist_ok=True)
    return cli("logs", *args, *LOCAL_SPARK, timeout=600, TMPDIR=str(tmp))

