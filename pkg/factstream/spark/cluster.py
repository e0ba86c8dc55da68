"""A Spark standalone cluster on this machine, from pyspark's own distribution.

Used by the cluster tests and benchmarks, and the recipe docs/spark.md
describes: one master and N workers started through ``bin/spark-class``
(``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) on
loopback, each on free ports with its own work and log directory, each worker
in its own process group so that "this worker's machine dies" is one
``killpg`` (the worker, its executors and their Python workers). Only the
processes started here are ever signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["StandaloneCluster", "start_standalone", "spark_home", "free_port"]


def spark_home() -> str:
    """SPARK_HOME of the installed pyspark (its bundled distribution: bin/, jars/)."""
    from pyspark.find_spark_home import _find_spark_home

    return str(_find_spark_home())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class StandaloneCluster:
    """Handles on a running master and its workers (see :func:`start_standalone`)."""

    root: str
    master_port: int
    master_web_port: int
    master: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_dirs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The master URL to pass as ``--master``."""
        return f"spark://127.0.0.1:{self.master_port}"

    def state(self) -> dict[str, object]:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_web_port}/json/", timeout=5) as resp:
            data: dict[str, object] = json.load(resp)
            return data

    def alive_workers(self) -> int:
        """Workers the master currently counts as ALIVE."""
        try:
            workers = self.state().get("workers", [])
        except OSError:
            return 0
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def add_worker(
        self,
        cores: int = 1,
        memory: str = "1g",
        worker_env: Mapping[str, str] | None = None,
        *,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> int:
        """Start one more worker (own work dir, log and process group); return its index."""
        i = len(self.workers)
        spark_class = os.path.join(self.env["SPARK_HOME"], "bin", "spark-class")
        work = os.path.join(self.root, f"worker-{i}")
        os.makedirs(work, exist_ok=True)
        extra = self.worker_env if worker_env is None else worker_env
        env = dict(self.env, SPARK_WORKER_DIR=work, **extra)
        log_path = os.path.join(self.root, f"worker-{i}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(cores),
                 "--memory", memory, "--work-dir", work, self.url],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True,
            )
        self.workers.append(proc)
        self.worker_dirs.append(work)
        if wait:
            _wait_for(log_path, "Successfully registered with master", proc, timeout)
        return i

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and everything it started (its executors and their Python workers)."""
        proc = self.workers[index]
        _kill_group(proc, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every worker and the master (SIGTERM, then SIGKILL after 10 s), only our processes."""
        for proc in [*self.workers, self.master]:
            _kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in [*self.workers, self.master]:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group led by ``proc`` (started with start_new_session), if it still exists."""
    if proc.poll() is not None and sig != signal.SIGKILL:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_for(path: str, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with open(path, errors="replace") as fh:
                if needle in fh.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    try:
        with open(path, errors="replace") as fh:
            tail = fh.read()[-3000:]
    except FileNotFoundError:
        tail = ""
    raise RuntimeError(f"Spark daemon did not report {needle!r} within {timeout:.0f} s (exit {proc.poll()}):\n{tail}")


def start_standalone(
    root: str,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    *,
    worker_env: Mapping[str, str] | None = None,
    daemon_memory: str = "256m",
    timeout: float = 120.0,
) -> StandaloneCluster:
    """Start a master and ``workers`` workers on 127.0.0.1 under ``root`` and wait until all are registered.

    ``worker_env`` is added to the workers' environment (e.g. a PATH whose
    ``python3`` is a different Python environment from the driver's).
    Logs: ``root/master.log``, ``root/worker-N.log``; work dirs
    ``root/worker-N/``. Call :meth:`StandaloneCluster.stop` when done.
    """
    home = spark_home()
    spark_class = os.path.join(home, "bin", "spark-class")
    if not os.path.exists(spark_class):
        raise RuntimeError(f"{spark_class} not found: pyspark's distribution has no bin/spark-class")
    os.makedirs(root, exist_ok=True)
    base_env = dict(os.environ)
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "SPARK_CONF_DIR"):
        base_env.pop(key, None)
    base_env.update(
        SPARK_HOME=home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=root,
        SPARK_DAEMON_MEMORY=daemon_memory,
        SPARK_NO_DAEMONIZE="1",
    )
    master_port, web_port = free_port(), free_port()
    master_log = os.path.join(root, "master.log")
    with open(master_log, "wb") as log:
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(master_port), "--webui-port", str(web_port)],
            stdout=log, stderr=subprocess.STDOUT, env=base_env, cwd=root, start_new_session=True,
        )
    cluster = StandaloneCluster(root, master_port, web_port, master, env=base_env,
                               worker_env=dict(worker_env or {}))
    try:
        _wait_for(master_log, "I have been elected leader", master, timeout)
        for _ in range(workers):
            cluster.add_worker(cores, memory, worker_env, wait=False, timeout=timeout)
        for i, proc in enumerate(cluster.workers):
            _wait_for(os.path.join(root, f"worker-{i}.log"), "Successfully registered with master", proc, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
