"""`factstream logs` on a real Spark standalone cluster: two workers on loopback, their own Python.

The cluster is pyspark's own distribution started through bin/spark-class
(factstream.spark.cluster, the recipe of docs/spark.md): a master and two
workers with one core each. The workers' Python is a separate, empty
virtualenv (no factstream, no pyarrow), so the executors only work because
``--ship-env`` ships the installed factstream (compiled core included) with
spark.archives. Output is compared row for row with local mode. Slow; runs
under CI=true, where a missing Java or pyspark fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

_spec = importlib.util.spec_from_file_location("spark_archives", Path(__file__).with_name("spark_archives.py"))
assert _spec and _spec.loader
spark_archives = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("spark_archives", spark_archives)
_spec.loader.exec_module(spark_archives)

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
SPARK_CONF = ["--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=768m"]


def _require_cluster_tools() -> None:
    problems = []
    for mod in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(mod) is None:
            problems.append(f"{mod} is not installed (pip install 'factstream[spark]')")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        problems.append("Java is not installed (apt-get install openjdk-17-jre-headless)")
    if not os.path.exists(FACTSTREAM):
        problems.append(f"{FACTSTREAM} missing: run 'make install'")
    if problems:
        msg = "; ".join(problems)
        if IN_CI:
            pytest.fail(msg + " (CI=true: cluster tests must run)")
        pytest.skip(msg)


@pytest.fixture(scope="module")
def worker_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtualenv of the same CPython, with nothing installed: the workers' Python."""
    venv = tmp_path_factory.mktemp("worker-venv")
    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python3")
    probe = subprocess.run([python, "-c", "import factstream"], capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'factstream'" in probe.stderr
    probe = subprocess.run([python, "-c", "import pyarrow"], capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0
    return python


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, worker_python: str) -> Iterator[Any]:
    """Master + two 1-core workers on 127.0.0.1; the workers' python3 is ``worker_python``."""
    _require_cluster_tools()
    from factstream.spark.cluster import start_standalone

    root = str(tmp_path_factory.mktemp("cluster"))
    bindir = os.path.dirname(worker_python)
    env = {"PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "PYSPARK_PYTHON": worker_python}
    started = start_standalone(root, workers=2, cores=1, memory="1g", worker_env=env)
    try:
        assert started.alive_workers() == 2
        yield started
    finally:
        procs = [started.master, *started.workers]
        started.stop()
        assert all(p.poll() is not None for p in procs)  # everything we started is gone


def _cli(*args: str, master: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"):
        env.pop(key, None)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return subprocess.run(
        [FACTSTREAM, "logs", *args, "--master", master, *SPARK_CONF, *extra],
        capture_output=True, text=True, env=env, timeout=900,
    )


def _table(path: str) -> list[dict[str, Any]]:
    """Every row of a logs-parse Parquet directory, partition columns included, in line order."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    for r in rows:
        r["date"] = None if r["date"] in (None, "__HIVE_DEFAULT_PARTITION__") else str(r["date"])
        r["stream"] = None if r["stream"] in (None, "__HIVE_DEFAULT_PARTITION__") else r["stream"]
    return sorted(rows, key=lambda r: (r["source_file"], r["line_number"]))


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("archives"))
    spark_archives.write_archives(root, seed=11, count=300)
    return root


@pytest.fixture(scope="module")
def local_parquet(archive_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("local") / "pq")
    # cut for 100 cores into chunks of 4 KB or more; the cluster run below cuts for its own two cores
    done = _cli("parse", archive_dir, "--out", out, "--chunk-mb", "0.004", master="local[2]",
                extra=("--conf", "spark.default.parallelism=100"))
    assert done.returncode == 0, done.stderr
    return out


def test_parse_and_report_on_the_cluster_equal_local_mode(
    cluster: Any, archive_dir: str, local_parquet: str, tmp_path: Path
) -> None:
    out = str(tmp_path / "pq")
    # file:// URIs on the cluster, plain paths locally: the same source_file and rows; here the files are cut
    # for the executors' two cores (the driver waits for them to register), locally for 100
    done = _cli("parse", "file://" + archive_dir, "--out", out, "--chunk-mb", "0.004", "--ship-env",
                master=cluster.url)
    assert done.returncode == 0, done.stderr
    got, want = _table(out), _table(local_parquet)
    assert len(got) == len(want) > 1500
    assert got == want
    # the executors ran the workers' Python, on the shipped overlay
    apps = [d for w in cluster.worker_dirs for d in Path(w).glob("app-*/*/factstream_env/factstream")]
    assert apps, "no executor unpacked the shipped factstream"
    rep_cluster = _cli("report", out, "--json", "--ship-env", master=cluster.url)
    rep_local = _cli("report", local_parquet, "--json", master="local[2]")
    assert rep_cluster.returncode == 0, rep_cluster.stderr
    assert rep_local.returncode == 0, rep_local.stderr
    assert json.loads(rep_cluster.stdout) == json.loads(rep_local.stdout)


def _driver(cluster: Any, tmp_path: Path, body: str) -> str:
    """Run ``body`` as a driver program with a session on ``cluster`` (shipped env); its ``OUT`` line."""
    script = tmp_path / "driver.py"
    script.write_text(
        "from factstream.spark.session import make_session, session_cores, _executors\n"
        f"spark = make_session({cluster.url!r}, conf={{'spark.ui.enabled': 'false', 'spark.executor.memory': '512m'}},"
        " ship_env=True)\n" + body + "spark.stop()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    # The JVM may print a line of its own to stdout while stopping: take ours by its marker.
    out = [line for line in done.stdout.splitlines() if line.startswith("OUT ")]
    assert len(out) == 1, done.stdout
    return out[0].removeprefix("OUT ")


def test_executors_run_the_compiled_core_of_the_shipped_env(cluster: Any, worker_python: str, tmp_path: Path) -> None:
    body = (
        "def probe(_):\n"
        "    import factstream, factstream.spark._archive_c, sys\n"
        "    return (factstream.IMPL, sys.prefix, factstream.__file__)\n"
        "got = spark.sparkContext.parallelize(range(4), 4).map(probe).collect()\n"
        "print('OUT', repr(got), flush=True)\n"
    )
    got = eval(_driver(cluster, tmp_path, body))
    venv = os.path.dirname(os.path.dirname(worker_python))
    assert {g[0] for g in got} == {"c"}
    assert {g[1] for g in got} == {venv}
    assert all("/factstream_env/factstream/" in g[2] for g in got)


def test_a_new_session_waits_for_its_executors_before_sizing_a_plan(cluster: Any, tmp_path: Path) -> None:
    body = (
        "before = _executors(spark)\n"
        "cores = session_cores(spark)\n"
        "print('OUT', before, cores, _executors(spark), flush=True)\n"
    )
    got = _driver(cluster, tmp_path, body).split()
    before, cores, after = map(int, got)
    # A session that has just started usually has fewer executors than it will have (on a loaded
    # machine starting the session can take as long as the executors do); after the wait, both.
    assert 0 <= before <= 2 and cores == 2 and after == 2, got


def test_without_the_shipped_env_the_job_fails_with_a_hint(cluster: Any, archive_dir: str, tmp_path: Path) -> None:
    # On one machine the driver's site-packages is readable by the workers too: an empty executor
    # PYTHONPATH makes them what they are on other machines, Pythons without factstream.
    done = _cli("parse", archive_dir, "--out", str(tmp_path / "pq"), "--executor-python", "python3",
                master=cluster.url, extra=("--conf", "spark.task.maxFailures=1", "--conf", "spark.executorEnv.PYTHONPATH="))
    assert done.returncode == 1, done.stderr
    assert "No module named" in done.stderr and "--ship-env" in done.stderr
    assert "Traceback" not in done.stderr


def _write_big_archive(root: Path, lines: int) -> str:
    data = spark_archives.protocol_lines(seed=5, count=lines)
    path = root / "big.log"
    with open(path, "wb") as fh:
        for i, line in enumerate(data):
            fh.write(b"2026-11-24T11:%02d:%02d.%03dZ > " % (i // 60000 % 60, i // 1000 % 60, i % 1000) + line + b"\n")
    return str(path)


def test_a_worker_killed_mid_job_does_not_change_the_result(cluster: Any, tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    _write_big_archive(inp, 120_000)
    local = str(tmp_path / "local")
    done = _cli("parse", str(inp), "--out", local, "--chunk-mb", "0.1", master="local[2]")
    assert done.returncode == 0, done.stderr

    out = str(tmp_path / "cluster")
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    proc = subprocess.Popen(
        # sized for 64 cores: about 100 tasks of 0.1 MB, so that the kill lands mid-job
        [FACTSTREAM, "logs", "parse", str(inp), "--out", out, "--chunk-mb", "0.1", "--ship-env", "--progress", "always",
         "--master", cluster.url, *SPARK_CONF, "--conf", "spark.default.parallelism=64"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
    )
    seen: list[bytes] = []

    def drain() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    killed = False
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            bars = re.findall(rb"parsing:.*?\| *(\d+)/(\d+)", b"".join(seen))
            if bars:
                done_tasks, total = map(int, bars[-1])
                if 2 <= done_tasks < total - 4:
                    cluster.kill_worker(1)  # the worker, its executor and its Python workers: a lost machine
                    killed = True
                    break
            time.sleep(0.1)
        assert killed, b"".join(seen)[-3000:].decode(errors="replace")
        assert proc.wait(timeout=600) == 0, b"".join(seen)[-5000:].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        cluster.add_worker()  # later tests get two workers again
    log = b"".join(seen).decode(errors="replace")
    assert "wrote 120000 lines" in log
    assert _table(out) == _table(local)


@pytest.mark.postgres
def test_stream_on_the_cluster_killed_and_restarted_matches_the_writers_database(
    cluster: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    """`logs stream` with executors on the two workers (shipped env): SIGKILL the query mid-stream, restart."""
    import signal

    import spark_stream_run as h
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    stream_cmd = [FACTSTREAM, "logs", "stream", "--db", postgres_dsn, "--out", out, "--checkpoint", ck,
                  "--trigger", "0.5", "--ship-env", "--master", cluster.url, *SPARK_CONF]
    writer = h.Proc([FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", "100",
                     "--seed", "4", "--status"], stream="stdout")
    first = second = None
    try:
        writer.wait_for(lambda line: '"listening"' in line, 60)
        first = h.Proc(stream_cmd)
        first.wait_for(h.data_batch(1), 600)
        first.killpg(signal.SIGKILL)  # driver, JVM and its Python: the cluster's executors lose their application
        first.p.wait(timeout=60)
        second = h.Proc([*stream_cmd, "--stop-when-idle", "8"])
        second.wait_for(h.data_batch(0), 600)  # resumed while the writer still writes
        writer.killpg(signal.SIGTERM)
        assert writer.p.wait(timeout=60) == 0
        assert second.p.wait(timeout=600) == 0, "".join(second.lines[-60:])
    finally:
        for proc in (first, second, writer):
            if proc is not None and proc.p.poll() is None:
                proc.killpg(signal.SIGKILL)
                proc.p.wait(timeout=30)
    want = h.db_rows(postgres_dsn)
    assert sum(want.values()) > 100
    assert h.parquet_rows(out) == want  # nothing lost, nothing twice
    batches = [int(line.split()[1].rstrip(":")) for line in second.lines if line.startswith("batch ")]
    assert batches and batches[0] >= 1  # resumed from the checkpoint
    # the batches ran on the workers, from the shipped overlay
    assert [d for w in cluster.worker_dirs for d in Path(w).glob("app-*/*/factstream_env/factstream")]
