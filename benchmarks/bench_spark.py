"""Spark parsing throughput on a 5-million-line archive: native SQL vs Python UDF vs factstream's Arrow path.

Every variant reads the same archive (benchmarks/gen_archive.py, fixed seed;
plain and gzip, 8 files) and materialises every output column with the
``noop`` sink, so nothing is pruned. Each benchmark is one round (a run takes
seconds to minutes); the whole set runs twice, interleaved, and the best
rows/s of each variant and the ratios go to build/bench-spark.json, with the
CPU seconds the whole Spark process tree spent on each variant (JVM and Python
workers; least of the rounds) and the same ratios computed from CPU time,
which another job on the machine does not distort the way it distorts wall time.

    PYTHONPATH=pkg .venv/bin/python -m pytest benchmarks/bench_spark.py -p no:cacheprovider \
        --benchmark-group-by=group --benchmark-columns=min,rounds -q

Environment: FACTSTREAM_BENCH_LINES (default 5000000), FACTSTREAM_BENCH_DIR
(default build/bench-archive), FACTSTREAM_BENCH_MASTER (default local[*]).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

LINES = int(os.environ.get("FACTSTREAM_BENCH_LINES", "5000000"))
OUT = os.environ.get("FACTSTREAM_BENCH_DIR", "build/bench-archive")
MASTER = os.environ.get("FACTSTREAM_BENCH_MASTER", "local[*]")
RESULTS: dict[str, float] = {}
CPU: dict[str, float] = {}  # CPU seconds of the whole Spark process tree, least of the rounds
SESSION: list[Any] = []  # the module's Spark session, for the JVM GC between variants

_spec = importlib.util.spec_from_file_location("gen_archive", Path(__file__).with_name("gen_archive.py"))
assert _spec and _spec.loader
gen_archive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_archive)


@pytest.fixture(scope="module")
def archive(spark: Any) -> dict[str, str]:
    plain, gz = gen_archive.ensure(OUT, LINES, 8)
    return {"plain": plain, "gzip": gz}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    gen_archive.ensure(OUT, LINES, 8)
    from factstream.spark.session import make_session

    session = make_session(
        MASTER,
        app_name="factstream-bench",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.driver.memory": "4g",
            # gzip is not splittable; plain files are split by Spark's text source at this size
            "spark.sql.files.maxPartitionBytes": str(32 * 1024 * 1024),
        },
        log_level="ERROR",
    )
    SESSION[:] = [session]
    # warm up the JVM (code generation, JIT) and the Python workers on one small file,
    # so that the first variant measured does not pay for start-up
    warm = os.path.join(OUT, "warmup.log")
    if not os.path.exists(warm):
        with open(warm, "w") as fh:
            fh.write("\n".join(gen_archive.generate(50_000, seed=1)) + "\n")
    for name in ("native_typed", "factstream_files_typed", "factstream_text_typed", "python_udf_typed"):
        VARIANTS[name](session, warm).write.format("noop").mode("overwrite").save()
    yield session
    _write_summary()
    session.stop()


def _write_summary() -> None:
    if not RESULTS:
        return
    ratios = {}
    cpu_ratios = {}
    for kind in ("plain", "gzip"):
        r = {k.split("/", 1)[1]: v for k, v in RESULTS.items() if k.startswith(kind + "/")}
        c = {k.split("/", 1)[1]: v for k, v in CPU.items() if k.startswith(kind + "/")}

        def ratio(a: str, b: str) -> float | None:
            return round(r[a] / r[b], 3) if a in r and b in r else None

        def cpu_ratio(a: str, b: str) -> float | None:
            return round(c[b] / c[a], 3) if a in c and b in c and c[a] > 0 else None

        cpu_ratios[kind] = {
            "header: factstream files / native": cpu_ratio("factstream_files_header", "native_header"),
            "typed: factstream files / native from_json": cpu_ratio("factstream_files_typed", "native_typed"),
            "typed: factstream files / python UDF": cpu_ratio("factstream_files_typed", "python_udf_typed"),
        }

        ratios[kind] = {
            "header: factstream files / native": ratio("factstream_files_header", "native_header"),
            "header: factstream mapInArrow(text) / native": ratio("factstream_text_header", "native_header"),
            "typed: factstream files / native from_json": ratio("factstream_files_typed", "native_typed"),
            "typed: factstream mapInArrow(text) / native from_json": ratio("factstream_text_typed", "native_typed"),
            "typed: factstream pandas UDF(text) / native from_json": ratio("factstream_pandas_udf_typed", "native_typed"),
            "typed: factstream files / python UDF": ratio("factstream_files_typed", "python_udf_typed"),
            "typed: mapInArrow / pandas UDF (text)": ratio("factstream_text_typed", "factstream_pandas_udf_typed"),
        }
    os.makedirs("build", exist_ok=True)
    with open("build/bench-spark.json", "w") as fh:
        json.dump(
            {"lines": LINES, "master": MASTER, "rows_per_s": RESULTS, "ratios": ratios, "cpu_s": CPU,
             "ratios_by_cpu_time": cpu_ratios},
            fh,
            indent=2,
        )
    print("\n" + json.dumps({"rows_per_s": RESULTS, "ratios": ratios, "cpu_s": CPU, "ratios_by_cpu_time": cpu_ratios},
                             indent=2), file=sys.stderr)


def _tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and everything under it (the JVM, Python workers).

    Live processes count their own time, exited ones their reaped children's
    (cutime/cstime), so the difference around a run is the run's CPU cost,
    whatever else the machine is doing.
    """
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    total = 0
    for pid in ticks:
        p = pid
        while p and p != me:
            p = parent.get(p, 0)
        if p == me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


def _run(benchmark: Any, name: str, make_df: Callable[[], Any]) -> None:
    cpu: list[float] = []

    def once() -> float:
        # start from a collected JVM heap, so no variant pays for the garbage of the one before it
        SESSION[0]._jvm.System.gc()
        time.sleep(1)
        c = _tree_cpu_seconds()
        t = time.perf_counter()
        make_df().write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - t
        cpu.append(_tree_cpu_seconds() - c)
        return seconds

    seconds = benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
    rate = LINES / seconds
    RESULTS[name] = max(RESULTS.get(name, 0), round(rate))  # best of the interleaved rounds
    if cpu[0] > 0:  # a process that left the tree unreaped would make the difference meaningless
        CPU[name] = min(CPU.get(name, float("inf")), round(cpu[0], 2))
    benchmark.extra_info["rows_per_s"] = round(rate)
    benchmark.extra_info["cpu_s"] = round(cpu[0], 2)


# ----------------------------------------------------------------- variants

EV_FIELDS = ["event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership", "rejected", "outlier"]


def native_header(spark: Any, path: str) -> Any:
    """Header parse in Spark SQL: split on the first spaces, try_cast the tokens."""
    df = spark.read.text(path).selectExpr(
        "input_file_name() AS source_file", "substring_index(value, ' ', 1) AS command", "split(value, ' ', 5) AS p"
    )
    return df.selectExpr(
        "source_file",
        "command",
        "CASE WHEN command IN ('RDATA', 'POSITION') THEN get(p, 1) END AS stream",
        "CASE WHEN command IN ('RDATA', 'POSITION') THEN get(p, 2) END AS instance",
        "CASE command WHEN 'RDATA' THEN try_cast(get(p, 3) AS BIGINT) WHEN 'POSITION' THEN try_cast(get(p, 4) AS BIGINT) END AS token",
        "CASE WHEN command = 'POSITION' THEN try_cast(get(p, 3) AS BIGINT) END AS prev_token",
        "CASE WHEN command = 'RDATA' THEN get(p, 4) END AS row",
    )


def native_typed(spark: Any, path: str) -> Any:
    """Header parse plus from_json of events and caches rows into typed columns."""
    df = native_header(spark, path).selectExpr(
        "*", "CASE WHEN stream IN ('events', 'caches') THEN from_json(row, 'array<string>') END AS _o"
    )
    df = df.selectExpr(
        "*",
        "CASE WHEN stream = 'events' THEN get(_o, 0) END AS _k",
        "CASE WHEN stream = 'events' THEN from_json(get(_o, 1), 'array<string>') END AS _i",
    )
    ev = {name: i for i, name in enumerate(EV_FIELDS)}
    st = {"room_id": 0, "type": 1, "state_key": 2, "event_id": 3}
    cols = ["_k AS ev_kind"]
    for name in EV_FIELDS:
        when = f"WHEN _k = 'ev' THEN get(_i, {ev[name]})"
        if name in st:
            when += f" WHEN _k = 'state' THEN get(_i, {st[name]})"
        if name == "room_id":
            when += " WHEN _k = 'state-all' THEN get(_i, 0)"
        expr = f"CASE {when} END"
        if name in ("rejected", "outlier"):
            expr = f"try_cast({expr} AS BOOLEAN)"
        cols.append(f"{expr} AS ev_{name}")
    cols += [
        "CASE WHEN stream = 'caches' THEN get(_o, 0) END AS cache_func",
        "CASE WHEN stream = 'caches' THEN from_json(get(_o, 1), 'array<string>') END AS cache_keys",
        "CASE WHEN stream = 'caches' THEN try_cast(get(_o, 2) AS BIGINT) END AS cache_invalidation_ts",
    ]
    keep = [c for c in df.columns if not c.startswith("_")]
    return df.selectExpr(*keep, *cols)


def python_udf_plain(spark: Any, path: str) -> Any:
    """The same without going through parse_block: parse_line and a hand-built tuple (fairest plain UDF)."""
    from pyspark.sql import functions as F

    ddl = (
        "command string, stream string, instance string, token bigint, prev_token bigint, row string, error string, "
        "ev_kind string, ev_event_id string, ev_room_id string, ev_type string, ev_state_key string, ev_redacts string, "
        "ev_relates_to string, ev_membership string, ev_rejected boolean, ev_outlier boolean, "
        "cache_func string, cache_keys array<string>, cache_invalidation_ts bigint"
    )

    def parse(value: bytes) -> tuple:  # noqa: ANN001
        from factstream import wire

        try:
            cmd = wire.parse_line(value)
        except wire.ProtocolError as err:
            return (None,) * 6 + (str(err),) + (None,) * 13
        name = cmd.NAME
        ev: tuple = (None,) * 10
        ca: tuple = (None,) * 3
        if name == "RDATA":
            row = cmd.row
            if cmd.stream_name == "events" and isinstance(row, list) and len(row) == 2:
                kind, d = row
                if kind == "ev" and len(d) == 9:
                    ev = (kind, *d)
                elif kind == "state" and len(d) == 4:
                    ev = (kind, d[3], d[0], d[1], d[2], None, None, None, None, None)
                elif kind == "state-all":
                    ev = (kind, None, d[0]) + (None,) * 7
            elif cmd.stream_name == "caches" and isinstance(row, list) and len(row) == 3:
                ca = (row[0], row[1], row[2])
            head = (name, cmd.stream_name, cmd.instance_name, cmd.token, None, value.split(b" ", 4)[4].decode(), None)
        elif name == "POSITION":
            head = (name, cmd.stream_name, cmd.instance_name, cmd.new_token, cmd.prev_token, None, None)
        else:
            head = (name,) + (None,) * 6
        return head + ev + ca

    udf = F.udf(parse, ddl)
    df = spark.read.text(path).select(F.col("value").cast("binary").alias("value"))
    return df.select(udf("value").alias("r")).select("r.*")


def factstream_text(spark: Any, path: str, typed: bool) -> Any:
    from factstream.spark.lines import ParseOptions
    from factstream.spark.pipeline import parse_text_column

    return parse_text_column(spark.read.text(path), options=ParseOptions(format="lines", typed=typed))


def factstream_pandas_udf(spark: Any, path: str, typed: bool) -> Any:
    """The Arrow pandas UDF flavour: Series of lines in, DataFrame (struct) out, one row per line."""
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import functions as F

    from factstream.spark.lines import ARROW_SCHEMA, SPARK_DDL, parse_block

    struct = "struct<" + ", ".join(":".join(col.split(" ", 1)) for col in SPARK_DDL.split(", ")) + ">"

    def parse(values: pd.Series) -> pd.DataFrame:
        lines = pa.array(values, pa.binary()).to_pylist()
        batches = list(parse_block(lines, source="", typed=typed, batch_rows=len(lines) + 1))
        table = pa.Table.from_batches(batches, ARROW_SCHEMA)
        assert table.num_rows == len(lines), "blank lines would break the 1:1 contract"
        return table.to_pandas()

    # this module uses postponed annotations; Spark reads the hints to pick the UDF kind
    parse.__annotations__ = {"values": pd.Series, "return": pd.DataFrame}
    parse_udf = F.pandas_udf(parse, struct)
    df = spark.read.text(path).select(F.col("value").cast("binary").alias("value"))
    return df.select(parse_udf("value").alias("r")).select("r.*")


def factstream_files(spark: Any, path: str, typed: bool) -> Any:
    from factstream.spark.lines import ParseOptions
    from factstream.spark.pipeline import parse_archives

    return parse_archives(spark, [path], ParseOptions(format="lines", typed=typed))


VARIANTS: dict[str, Callable[[Any, str], Any]] = {
    "native_header": native_header,
    "native_typed": native_typed,
    "factstream_files_header": lambda s, p: factstream_files(s, p, False),
    "factstream_files_typed": lambda s, p: factstream_files(s, p, True),
    "factstream_text_header": lambda s, p: factstream_text(s, p, False),
    "factstream_text_typed": lambda s, p: factstream_text(s, p, True),
    "factstream_pandas_udf_typed": lambda s, p: factstream_pandas_udf(s, p, True),
    "python_udf_typed": python_udf_plain,
}


# Two rounds, interleaved (every variant once, then every variant again), best
# of the two kept: the machine is shared, and load drifts over a run.
@pytest.mark.parametrize("kind", ["plain", "gzip"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("rnd", [1, 2])
def test_parse(benchmark: Any, spark: Any, archive: dict[str, str], kind: str, variant: str, rnd: int) -> None:
    benchmark.group = f"spark-{kind}"
    benchmark.name = f"{variant} (round {rnd})"
    _run(benchmark, f"{kind}/{variant}", lambda: VARIANTS[variant](spark, archive[kind]))
