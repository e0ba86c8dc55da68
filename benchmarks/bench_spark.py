"""Spark parsing throughput: native SQL vs a Python UDF vs factstream's Arrow path, on two archives.

Archives (benchmarks/gen_archive.py, fixed seed, each as plain and gzip files):
``recorded`` looks like recorded traffic (75% of the lines behind the
recorder's timestamp and direction prefix, 10% bare wire lines, 10% a
redis-cli MONITOR capture, 5% a redis-cli --csv capture); ``unprefixed`` is
bare wire lines only. Every variant does the same parse of every line
(timestamp, direction and Redis channel included; the typed variants also
the events/caches row fields) and materialises every output column with the
``noop`` sink, so nothing is pruned:

- ``native_header`` / ``native_typed``: Spark SQL string functions (and
  ``from_json``) over ``spark.read.text``;
- ``python_udf_typed``: a row-at-a-time Python UDF calling ``wire.parse_line``;
- ``factstream_files_header`` / ``_typed``: ``parse_archives`` (format auto).

Each benchmark is one round (a run takes seconds to minutes); the whole set
runs twice (FACTSTREAM_BENCH_ROUNDS), interleaved. ``make bench BENCH=spark``
writes benchmarks/results/spark.json: each row's notes carry its rows/s and
CPU seconds, and the row of whichever of a target pair ran second carries the
ratio (``x_native_header``, ``x_native_typed``, ``x_python_udf``; ``_cpu``:
by CPU seconds), best of the run so far. A summary (best rows/s of each variant and the ratios) also goes
to FACTSTREAM_BENCH_JSON (default build/bench-spark.json) with
``factstream.IMPL``, the CPU seconds the whole Spark process tree spent on
each variant (JVM and Python workers; least of the rounds) and the same ratios
computed from CPU time, which another job on the machine does not distort the
way it distorts wall time.

    make bench BENCH=spark

Environment: FACTSTREAM_BENCH_LINES (default 1000000 per archive),
FACTSTREAM_BENCH_DIR (default build/bench-archive), FACTSTREAM_BENCH_MASTER
(default local[*]), FACTSTREAM_BENCH_ARCHIVES (default "recorded,unprefixed"),
FACTSTREAM_BENCH_ROUNDS (default 2), FACTSTREAM_BENCH_JSON (where the summary goes),
FACTSTREAM_BENCH_VARIANTS (default: the five above; add factstream_text_header,
factstream_text_typed, factstream_pandas_udf_typed for the text-column flavours).
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

LINES = int(os.environ.get("FACTSTREAM_BENCH_LINES", "1000000"))
OUT = os.environ.get("FACTSTREAM_BENCH_DIR", "build/bench-archive")
MASTER = os.environ.get("FACTSTREAM_BENCH_MASTER", "local[*]")
RESULTS: dict[str, float] = {}
CPU: dict[str, float] = {}  # CPU seconds of the whole Spark process tree, least of the rounds
SESSION: list[Any] = []  # the module's Spark session, for the JVM GC between variants

_spec = importlib.util.spec_from_file_location("gen_archive", Path(__file__).with_name("gen_archive.py"))
assert _spec and _spec.loader
gen_archive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_archive)


ARCHIVES = os.environ.get("FACTSTREAM_BENCH_ARCHIVES", "recorded,unprefixed").split(",")
MAIN_VARIANTS = ["native_header", "native_typed", "factstream_files_header", "factstream_files_typed", "python_udf_typed"]
RUN_VARIANTS = os.environ.get("FACTSTREAM_BENCH_VARIANTS", ",".join(MAIN_VARIANTS)).split(",")
RESULT_JSON = os.environ.get("FACTSTREAM_BENCH_JSON", "build/bench-spark.json")
ROUNDS = int(os.environ.get("FACTSTREAM_BENCH_ROUNDS", "2"))


def _archives() -> dict[str, dict[str, str]]:
    plain, gz = gen_archive.ensure(OUT, LINES, 8)
    rplain, rgz = gen_archive.ensure_recorded(OUT, LINES)
    return {"unprefixed": {"plain": plain, "gzip": gz}, "recorded": {"plain": rplain, "gzip": rgz}}


@pytest.fixture(scope="module")
def archive(spark: Any) -> dict[str, dict[str, str]]:
    return _archives()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    _archives()
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
    # warm up the JVM (code generation, JIT) and the Python workers on a small recorded
    # archive, so that the first variant measured does not pay for start-up
    warm, _ = gen_archive.ensure_recorded(os.path.join(OUT, "warmup"), 40_000, seed=1)
    for name in RUN_VARIANTS:
        VARIANTS[name](session, warm).write.format("noop").mode("overwrite").save()
    yield session
    _write_summary()
    session.stop()


def _write_summary() -> None:
    if not RESULTS:
        return
    import factstream

    ratios: dict[str, dict[str, float | None]] = {}
    cpu_ratios: dict[str, dict[str, float | None]] = {}
    for archive in ARCHIVES:
        for kind in ("plain", "gzip"):
            key = f"{archive}/{kind}"
            r = {k.rsplit("/", 1)[1]: v for k, v in RESULTS.items() if k.startswith(key + "/")}
            c = {k.rsplit("/", 1)[1]: v for k, v in CPU.items() if k.startswith(key + "/")}

            def ratio(a: str, b: str) -> float | None:
                return round(r[a] / r[b], 3) if a in r and b in r else None

            def cpu_ratio(a: str, b: str) -> float | None:
                return round(c[b] / c[a], 3) if a in c and b in c and c[a] > 0 else None

            pairs = {
                "header: factstream files / native": ("factstream_files_header", "native_header"),
                "typed: factstream files / native from_json": ("factstream_files_typed", "native_typed"),
                "typed: factstream files / python UDF": ("factstream_files_typed", "python_udf_typed"),
                "header: factstream mapInArrow(text) / native": ("factstream_text_header", "native_header"),
                "typed: factstream mapInArrow(text) / native from_json": ("factstream_text_typed", "native_typed"),
                "typed: factstream pandas UDF(text) / native from_json": ("factstream_pandas_udf_typed", "native_typed"),
            }
            ratios[key] = {name: ratio(a, b) for name, (a, b) in pairs.items() if ratio(a, b) is not None}
            cpu_ratios[key] = {name: cpu_ratio(a, b) for name, (a, b) in pairs.items() if cpu_ratio(a, b) is not None}
    doc = {
        "impl": factstream.IMPL,
        "lines_per_archive": LINES,
        "master": MASTER,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "archives": {
            "recorded": "75% recorder-prefixed lines (6 files), 10% bare wire lines, 10% redis-cli MONITOR, 5% redis-cli --csv",
            "unprefixed": "bare wire lines, 8 files",
        },
        "rounds": f"{ROUNDS}, interleaved; best wall-clock rows/s and least CPU seconds of the rounds",
        "rows_per_s": RESULTS,
        "ratios": ratios,
        "cpu_s": CPU,
        "ratios_by_cpu_time": cpu_ratios,
    }
    os.makedirs(os.path.dirname(RESULT_JSON) or ".", exist_ok=True)
    with open(RESULT_JSON, "w") as fh:
        json.dump(doc, fh, indent=2)
    print("\n" + json.dumps({"ratios": ratios, "ratios_by_cpu_time": cpu_ratios}, indent=2), file=sys.stderr)


def _tree_ticks() -> dict[int, int]:
    """CPU ticks (own and reaped children's: utime stime cutime cstime) of every live process under this one."""
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
        parent[int(entry)], ticks[int(entry)] = int(fields[1]), sum(int(f) for f in fields[11:15])
    me, out = os.getpid(), {}
    for pid, t in ticks.items():
        p = pid
        while p and p != me:
            p = parent.get(p, 0)
        if p == me:
            out[pid] = t
    return out


def _tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and everything under it (the JVM, Python workers).

    Live processes count their own time, exited ones their reaped children's
    (cutime/cstime), so the difference around a run is the run's CPU cost,
    whatever else the machine is doing.
    """
    return sum(_tree_ticks().values()) / os.sysconf("SC_CLK_TCK")


def _run(benchmark: Any, name: str, make_df: Callable[[], Any]) -> None:
    cpu: list[float] = []

    def collected() -> None:
        # start from a collected JVM heap, so no variant pays for the garbage of the one before it
        SESSION[0]._jvm.System.gc()
        time.sleep(1)

    def once() -> float:
        c = _tree_cpu_seconds()
        t = time.perf_counter()
        make_df().write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - t
        cpu.append(_tree_cpu_seconds() - c)
        return seconds

    # setup is not timed: the table's median (and per second) is the parse alone, as rows_per_s
    seconds = benchmark.pedantic(once, setup=collected, rounds=1, iterations=1, warmup_rounds=0)
    rate = LINES / seconds
    RESULTS[name] = max(RESULTS.get(name, 0), round(rate))  # best of the interleaved rounds
    if cpu[0] > 0:  # a process that left the tree unreaped would make the difference meaningless
        CPU[name] = min(CPU.get(name, float("inf")), round(cpu[0], 2))
    benchmark.extra_info["lines"] = LINES
    benchmark.extra_info["rows_per_s"] = round(rate)
    benchmark.extra_info["cpu_s"] = round(cpu[0], 2)
    _ratios(benchmark, name)


#: The targets of issue #17: (factstream variant, baseline) -> note name in the results.
TARGETS = {
    ("factstream_files_header", "native_header"): "x_native_header",
    ("factstream_files_typed", "native_typed"): "x_native_typed",
    ("factstream_files_typed", "python_udf_typed"): "x_python_udf",
}


def _ratios(benchmark: Any, name: str) -> None:
    """Notes on the row of whichever of a pair ran second: factstream / baseline, best of the run so far.

    By rows/s (wall clock) and by CPU seconds of the process tree (baseline
    CPU / factstream CPU), the latter not distorted by other jobs on the machine.
    """
    key, variant = name.rsplit("/", 1)
    for (fast, base), note in TARGETS.items():
        if variant not in (fast, base) or f"{key}/{fast}" not in RESULTS or f"{key}/{base}" not in RESULTS:
            continue
        benchmark.extra_info[note] = round(RESULTS[f"{key}/{fast}"] / RESULTS[f"{key}/{base}"], 3)
        if f"{key}/{fast}" in CPU and f"{key}/{base}" in CPU:
            benchmark.extra_info[note + "_cpu"] = round(CPU[f"{key}/{base}"] / CPU[f"{key}/{fast}"], 3)


# ----------------------------------------------------------------- variants

EV_FIELDS = ["event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership", "rejected", "outlier"]


def _unquote(expr: str) -> str:
    """SQL undoing redis-cli's quoting of a payload (the escapes a wire line can hold)."""
    return f"replace(replace({expr}, '\\\\\"', '\"'), '\\\\\\\\', '\\\\')"


def native_header(spark: Any, path: str) -> Any:
    """The same parse in Spark SQL: the recorder's prefix or the redis-cli wrapping, then the wire line's header.

    String functions only where they do the job (a regex per line would be
    slower): a recorder line has '-' at 5 and 'T' at 11, a MONITOR line '.'
    after its 10-digit unix time, a --csv line starts with "message".
    """
    df = spark.read.text(path).selectExpr(
        "input_file_name() AS source_file",
        "value",
        "substring(value, 5, 1) = '-' AND substring(value, 11, 1) = 'T' AS _p",
        "substring(value, 11, 1) = '.' AND substring(value, 1, 1) BETWEEN '0' AND '9' AS _m",
        "startswith(value, '\"message\",') AS _c",
    )
    df = df.selectExpr(
        "*",
        "CASE WHEN _p THEN substring(value, instr(value, ' ') + 1) ELSE value END AS _rest",
    )
    df = df.selectExpr(
        "source_file",
        "CASE WHEN _p THEN try_cast(substring_index(value, ' ', 1) AS TIMESTAMP)"
        " WHEN _m THEN timestamp_seconds(try_cast(substring_index(value, ' ', 1) AS DECIMAL(20,6))) END AS ts",
        "CASE WHEN substring(_rest, 2, 1) = ' ' AND substring(_rest, 1, 1) IN ('>', '<', '#') THEN substring(_rest, 1, 1) END"
        " AS direction",
        "CASE WHEN _m THEN substring_index(substring_index(value, '\" \"', 2), '\" \"', -1)"
        " WHEN _c THEN substring_index(substring_index(value, '\",\"', 2), '\",\"', -1) END AS channel",
        "CASE WHEN _m THEN " + _unquote("substring_index(substring(value, 1, length(value) - 1), '\" \"', -1)")
        + " WHEN _c THEN " + _unquote("substring_index(substring(value, 1, length(value) - 1), '\",\"', -1)")
        + " WHEN substring(_rest, 2, 1) = ' ' AND substring(_rest, 1, 1) IN ('>', '<', '#') THEN substring(_rest, 3)"
        " ELSE _rest END AS payload",
    )
    df = df.selectExpr(
        "source_file", "ts", "to_date(ts) AS date", "direction", "channel",
        "CASE WHEN direction = '#' THEN concat('#', substring_index(payload, ' ', 1))"
        " ELSE substring_index(payload, ' ', 1) END AS command",
        "split(payload, ' ', 5) AS p",
    )
    return df.selectExpr(
        "source_file",
        "ts",
        "date",
        "direction",
        "channel",
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
    """A plain row-at-a-time Python UDF: the prefix or redis-cli wrapping taken off, then parse_line."""
    from pyspark.sql import functions as F

    ddl = (
        "ts_micros bigint, direction string, channel string, "
        "command string, stream string, instance string, token bigint, prev_token bigint, row string, error string, "
        "ev_kind string, ev_event_id string, ev_room_id string, ev_type string, ev_state_key string, ev_redacts string, "
        "ev_relates_to string, ev_membership string, ev_rejected boolean, ev_outlier boolean, "
        "cache_func string, cache_keys array<string>, cache_invalidation_ts bigint"
    )

    def parse(value: bytes) -> tuple:  # noqa: ANN001
        import datetime as dt

        from factstream import wire
        from factstream.spark.formats import split_csv, split_line, split_monitor
        from factstream.spark.timestamps import timestamp_micros

        if value[4:5] == b"-" or not value[:1].isdigit():
            parts = split_line(value) if not value.startswith(b'"') else split_csv(value)
        else:
            parts = split_monitor(value)
        if parts is None:
            return (None,) * 23
        ts, direction, channel, payload, problem = parts
        where = (
            timestamp_micros(ts.decode(), dt.timezone.utc) if ts else None,
            direction.decode() if direction else None,
            channel.decode() if channel else None,
        )
        if direction == b"#":
            return where + ("#" + payload.split(b" ", 1)[0].decode(),) + (None,) * 19
        try:
            if problem:
                raise wire.ProtocolError(problem)
            cmd = wire.parse_line(payload)
        except wire.ProtocolError as err:
            return where + (None,) * 6 + (str(err),) + (None,) * 13
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
            head = (name, cmd.stream_name, cmd.instance_name, cmd.token, None, payload.split(b" ", 4)[4].decode(), None)
        elif name == "POSITION":
            head = (name, cmd.stream_name, cmd.instance_name, cmd.new_token, cmd.prev_token, None, None)
        else:
            head = (name,) + (None,) * 6
        return where + head + ev + ca

    udf = F.udf(parse, ddl)
    df = spark.read.text(path).select(F.col("value").cast("binary").alias("value"))
    df = df.select(udf("value").alias("r")).select("r.*")
    return df.selectExpr("timestamp_micros(ts_micros) AS ts", "to_date(timestamp_micros(ts_micros)) AS date", "*")


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

    return parse_archives(spark, [path], ParseOptions(format="auto", typed=typed))


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
@pytest.mark.parametrize("variant", RUN_VARIANTS)
@pytest.mark.parametrize("which", ARCHIVES)
@pytest.mark.parametrize("rnd", range(1, ROUNDS + 1))
def test_parse(benchmark: Any, spark: Any, archive: dict[str, dict[str, str]], kind: str, variant: str, which: str,
               rnd: int) -> None:
    benchmark.group = f"spark-{which}-{kind}"
    benchmark.name = f"{variant} (round {rnd})"
    _run(benchmark, f"{which}/{kind}/{variant}", lambda: VARIANTS[variant](spark, archive[which][kind]))
