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
rate while `start_stream` runs on local[2] with a 0.2 s trigger; latency of a
fact = when its Parquet file was published minus the creation time the
writer puts into caches and receipts rows; then the writer at full speed,
to see the highest rate the query keeps up with.

    .venv/bin/python -m pytest benchmarks/bench_spark_cluster.py -p no:cacheprovider -q \
        --benchmark-json=build/bench-spark-cluster.json

Environment: FACTSTREAM_BENCH_CLUSTER_LINES (default 1000000),
FACTSTREAM_BENCH_CLUSTER_DIR (default build/bench-cluster-archive). The summary goes to
benchmarks/results/sparkcluster-<timestamp>.json.
"""

from __future__ import annotations

import datetime as dt
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

LINES = int(os.environ.get("FACTSTREAM_BENCH_CLUSTER_LINES", "1000000"))
OUT = os.environ.get("FACTSTREAM_BENCH_CLUSTER_DIR", "build/bench-cluster-archive")
SUMMARY: dict[str, Any] = {}
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
    def once() -> float:
        t = time.perf_counter()
        make_df().write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t

    once()  # warm-up: executors, Python workers, JIT
    seconds = min(benchmark.pedantic(once, rounds=2, iterations=1), once())
    SUMMARY.setdefault("parse_rows_per_second", {})[name] = round(LINES / seconds)


def _write_summary() -> None:
    import factstream

    rates = SUMMARY.get("parse_rows_per_second", {})
    for where in ("cluster", "local"):
        if f"{where}/factstream" in rates and f"{where}/native" in rates:
            SUMMARY.setdefault("ratio_factstream_to_native", {})[where] = round(
                rates[f"{where}/factstream"] / rates[f"{where}/native"], 3)
    SUMMARY.update(impl=factstream.IMPL, lines=LINES, machine_cores=os.cpu_count())
    os.makedirs("benchmarks/results", exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    with open(f"benchmarks/results/sparkcluster-{stamp}.json", "w") as fh:
        json.dump(SUMMARY, fh, indent=2, sort_keys=True)
        fh.write("\n")


@pytest.fixture(scope="module", autouse=True)
def summary() -> Any:
    yield
    _write_summary()


@pytest.fixture(scope="module")
def archive() -> str:
    plain, _ = gen_archive.ensure(OUT, LINES, 8)
    return str(plain)


@pytest.mark.parametrize("where", ["cluster", "local"])
def test_parse_cluster_vs_local_vs_native(benchmark: Any, archive: str, where: str) -> None:
    from factstream.spark.cluster import start_standalone
    from factstream.spark.lines import ParseOptions
    from factstream.spark.pipeline import parse_archives

    bench_spark = _load("bench_spark")
    cluster = None
    if where == "cluster":
        cluster = start_standalone(tempfile.mkdtemp(prefix="factstream-bench-cluster-"), workers=2, cores=1,
                                   memory="1g")
    try:
        spark = _session(cluster.url if cluster else "local[2]")
        try:
            _time(benchmark, f"{where}/native", lambda: bench_spark.native_typed(spark, archive))
            _time(benchmark, f"{where}/factstream",
                  lambda: parse_archives(spark, [archive], ParseOptions(typed=True), chunk_bytes=16 * 1024 * 1024))
        finally:
            spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()


def _creation_times(path: str) -> list[float]:
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["stream", "row"]).to_pylist()
    out = []
    for r in t:
        row = json.loads(r["row"])
        if str(r["stream"]) == "caches":
            out.append(row[2] / 1000)
        elif str(r["stream"]) == "receipts":
            out.append(row[5]["ts"])
    return out


def test_streaming_latency_and_sustained_rate(benchmark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    from factstream.spark.streaming import _recorded_positions, _run, start_stream

    spark = _session("local[2]")
    published: list[tuple[float, int]] = []
    out, ck = str(tmp_path / "pq"), str(tmp_path / "ck")
    results: dict[str, Any] = {}
    try:
        query = start_stream(spark, postgres_dsn, out, ck, trigger_seconds=0.2,
                             on_batch=lambda b, files: published.append((time.time(), b)))
        for label, rate, seconds in (("steady_100_per_s", 100, 20), ("full_speed", 0, 20)):
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
            results[label] = {"writer_rows_per_second": round(produced["rows"] / produced["seconds"], 1),
                              "writer_rows": produced["rows"], "catch_up_seconds_after_writer_stopped": round(caught_up, 2)}
        query.stop()
        # latency: creation time -> the first publish after which the row's file existed
        import pyarrow.parquet as pq  # noqa: F401

        files = sorted(Path(out).rglob("part-b*.parquet"))
        lat = []
        for f in files:
            batch = int(f.name.split("-")[1][1:])
            when = next((t for t, b in published if b == batch), None)
            if when is None:
                continue
            lat.extend(when - c for c in _creation_times(str(f)))
        lat.sort()
        if lat:
            results["latency_seconds"] = {"p50": round(lat[len(lat) // 2], 3), "p99": round(lat[int(len(lat) * 0.99)], 3),
                                          "max": round(lat[-1], 3), "facts": len(lat)}
    finally:
        spark.stop()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    SUMMARY["streaming"] = results
