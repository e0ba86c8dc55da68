"""logs parse on a two-worker standalone cluster vs local mode vs native Spark SQL; streaming latency.

Parse: the same archive (benchmarks/gen_archive.py, plain, 8 files) through
factstream's typed parse and through the native Spark SQL typed parse
(bench_spark.native_typed), each materialised with the ``noop`` sink, first
on a standalone cluster of two 1-core workers on this machine
(factstream.spark.cluster), then in local mode with two cores. On a 2-core
machine the cluster cannot be faster; what counts is factstream's ratio to
native Spark on the same cluster, which must stay at least what it is in
local mode.

Streaming: a writer (`factstream serve --produce` on PostgreSQL) at a steady
rate while `start_stream` runs on local[2] with a 0.2 s trigger (after an
8 s warm-up phase that starts Spark's Python workers); latency of a fact =
when its Parquet file was published minus the creation time the writer puts
into caches and receipts rows; then the writer at full speed, to see whether
the query keeps up (catch-up time after the writer stops). The rates in the
results are what the writer achieved, not what it was asked for.

    .venv/bin/python -m pytest benchmarks/bench_spark_cluster.py -p no:cacheprovider -q \
        --benchmark-json=build/bench-spark-cluster.json

Run with ``make bench BENCH=spark_cluster`` (writes benchmarks/results/spark_cluster.json;
each result's notes carry rows/s, CPU seconds of the whole process tree (driver, JVMs, master,
workers, executors, Python workers) and, for factstream, its ratios to native in the same place).

Environment: FACTSTREAM_BENCH_CLUSTER_LINES (default 5000000, what issue #16 asks; a smaller
figure for a quick run is recorded in every result), FACTSTREAM_BENCH_CLUSTER_DIR (default
build/bench-cluster-archive).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

LINES = int(os.environ.get("FACTSTREAM_BENCH_CLUSTER_LINES", "5000000"))
OUT = os.environ.get("FACTSTREAM_BENCH_CLUSTER_DIR", "build/bench-cluster-archive")
RATES: dict[str, float] = {}  # rows/s by "<where>/<variant>"
CPU: dict[str, float] = {}  # CPU seconds of the process tree, same keys
FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen_archive = _load("gen_archive")


def _session(master: str) -> Any:
    from factstream.spark.session import make_session

    return make_session(master, app_name="factstream-bench-cluster", log_level="ERROR", conf={
        "spark.ui.enabled": "false", "spark.executor.memory": "768m", "spark.driver.memory": "1g",
        "spark.sql.files.maxPartitionBytes": str(16 * 1024 * 1024),
    })


def _time(benchmark: Any, name: str, make_df: Any) -> None:
    """One warm-up run, then one measured run; rows/s and CPU seconds of the process tree into extra_info."""
    tree_cpu = _load("bench_spark")._tree_cpu_seconds
    cpu: list[float] = []

    def once() -> None:
        c = tree_cpu()
        make_df().write.format("noop").mode("overwrite").save()
        cpu.append(tree_cpu() - c)

    once()  # warm-up: executors, Python workers, JIT
    benchmark.pedantic(once, rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    RATES[name], CPU[name] = round(LINES / seconds), round(cpu[-1], 2)
    benchmark.extra_info.update(lines=LINES, rows_per_s=RATES[name], cpu_s=CPU[name])
    where, variant = name.split("/")
    native = f"{where}/native"
    if variant == "factstream" and native in RATES:
        benchmark.extra_info["x_native_rows_per_s"] = round(RATES[name] / RATES[native], 3)
        benchmark.extra_info["x_native_cpu"] = round(CPU[native] / CPU[name], 3) if CPU[name] > 0 else None


@pytest.fixture(scope="module")
def archive() -> str:
    plain, _ = gen_archive.ensure(OUT, LINES, 8)
    return str(plain)


CURRENT: dict[str, Any] = {}  # the running session (and cluster) of the current "where"


def _switch(where: str) -> Any:
    """The Spark session for ``where``; stops the previous one (one SparkContext per process)."""
    from factstream.spark.cluster import start_standalone

    if CURRENT.get("where") == where:
        return CURRENT["spark"]
    _stop()
    cluster = None
    if where == "cluster":
        cluster = start_standalone(tempfile.mkdtemp(prefix="factstream-bench-cluster-"), workers=2, cores=1,
                                   memory="1g")
    CURRENT.update(where=where, cluster=cluster, spark=_session(cluster.url if cluster else "local[2]"))
    return CURRENT["spark"]


def _stop() -> None:
    if CURRENT.get("spark") is not None:
        CURRENT["spark"].stop()
    if CURRENT.get("cluster") is not None:
        CURRENT["cluster"].stop()
    CURRENT.clear()


@pytest.mark.parametrize("where,variant", [("cluster", "native"), ("cluster", "factstream"),
                                           ("local", "native"), ("local", "factstream")])
def test_parse_cluster_vs_local_vs_native(benchmark: Any, archive: str, where: str, variant: str) -> None:
    from factstream.spark.lines import ParseOptions
    from factstream.spark.pipeline import parse_archives

    bench_spark = _load("bench_spark")
    spark = _switch(where)
    try:
        if variant == "native":
            _time(benchmark, f"{where}/native", lambda: bench_spark.native_typed(spark, archive))
        else:
            _time(benchmark, f"{where}/factstream",
                  lambda: parse_archives(spark, [archive], ParseOptions(typed=True), chunk_bytes=16 * 1024 * 1024))
    finally:
        if (where, variant) == ("local", "factstream"):
            _stop()


def _creation_times(path: str) -> list[float]:
    import pyarrow.parquet as pq

    stream = Path(path).parent.name.removeprefix("stream=")  # a partition column: in the directory name
    out = []
    for r in pq.read_table(path, columns=["row"]).to_pylist():
        row = json.loads(r["row"])
        if stream == "caches":
            out.append(row[2] / 1000)
        elif stream == "receipts":
            out.append(row[5]["ts"])
    return out


def test_streaming_latency_and_sustained_rate(benchmark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    from factstream.demo.tables import DEMO_TABLES
    from factstream.spark.streaming import _recorded_positions, _run, start_stream

    _stop()
    spark = _session("local[2]")
    published: list[tuple[float, int]] = []
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    results: dict[str, Any] = {}
    try:
        query = start_stream(spark, postgres_dsn, out, ck, tables=DEMO_TABLES, trigger_seconds=0.2,
                             on_batch=lambda b, files: published.append((time.time(), b)))
        phases: list[tuple[str, float, float]] = []
        for label, rate, seconds in (("warm_up", 50, 8), ("steady_100_per_s", 100, 20), ("steady_1000_per_s", 1000, 20),
                                     ("full_speed", 0, 20)):
            began = time.time()
            writer = subprocess.Popen(
                [FACTSTREAM, "serve", "--produce", "--db", postgres_dsn, "--port", "0", "--rate", str(rate),
                 "--duration", str(seconds), "--rollback-rate", "0", "--status", "--seed", "1"],
                stdout=subprocess.PIPE, text=True, start_new_session=True,
            )
            assert writer.stdout is not None
            produced: dict[str, Any] = {}
            for line in writer.stdout:
                event = json.loads(line)
                if event.get("event") == "produced":
                    produced = event
                    break
            os.killpg(writer.pid, signal.SIGTERM)
            writer.wait(timeout=60)
            stopped = time.time()
            # wait until the query's last batch ends at the writer's final positions
            final = _run(_recorded_positions(postgres_dsn, ["caches", "receipts", "to_device"]))
            deadline = time.time() + 300
            while time.time() < deadline:
                progress = query.lastProgress
                end = json.loads(progress["sources"][0]["endOffset"] or "{}") if progress else {}
                if end and all(end.get(s, {}).get(w) == tok for s, ws in final.items() for w, tok in ws.items()):
                    break
                time.sleep(0.1)
            caught_up = time.time() - stopped
            phases.append((label, began, stopped))
            results[label] = {"writer_rows_per_second": round(produced["rows"] / produced["seconds"], 1),
                              "writer_rows": produced["rows"], "catch_up_seconds_after_writer_stopped": round(caught_up, 2)}
        query.stop()
        # latency: creation time -> the first publish after which the row's file existed
        import pyarrow.parquet as pq  # noqa: F401

        files = sorted(Path(out).rglob("part-b*.parquet"))
        lat: dict[str, list[float]] = {label: [] for label, _, _ in phases}
        for f in files:
            batch = int(f.name.split("-")[1][1:])
            when = next((t for t, b in published if b == batch), None)
            if when is None:
                continue
            for created in _creation_times(str(f)):
                label = next((name for name, a, b in phases if a <= created <= b), None)
                if label is not None:
                    lat[label].append(when - created)
        for label, values in lat.items():
            values.sort()
            if values:
                results[label]["latency_seconds"] = {
                    "p50": round(values[len(values) // 2], 3), "p99": round(values[int(len(values) * 0.99)], 3),
                    "max": round(values[-1], 3), "facts_timed": len(values)}
    finally:
        spark.stop()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    # flat notes: phase_what = value (the renderer shows scalars)
    for label, figures in results.items():
        benchmark.extra_info[f"{label}_writer_rows_per_s"] = figures["writer_rows_per_second"]
        benchmark.extra_info[f"{label}_catch_up_s"] = figures["catch_up_seconds_after_writer_stopped"]
        for q in ("p50", "p99"):
            if "latency_seconds" in figures:
                benchmark.extra_info[f"{label}_latency_{q}_s"] = figures["latency_seconds"][q]
