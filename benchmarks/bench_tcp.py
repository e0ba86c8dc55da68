"""Replication over TCP end to end: RDATA rows/s and completion-to-delivery latency.

Rows: a writer (LocalStream -> Publisher -> hub -> TcpServer) and 1 or 8
readers (TcpClient -> hub -> Follower -> handler) in one process on
127.0.0.1. The clock starts before the first completion and stops when every
reader's handler has seen the last row (each round connects anew; starting the
server, connecting and closing are not timed); ``items`` counts rows delivered over
all readers. The throughput groups are a 2x2 grid measured in the same run,
so the loop and the implementation are separated:

* loop: ``uvloop`` or the stdlib ``asyncio`` loop;
* implementation: ``c`` (the compiled codec and relay) or ``py`` (their
  pure-Python twins; ``asyncio-py`` is what a pure-Python build runs, the
  baseline of every ratio).

The publisher, hub and follower are the same Python code in every row; the
loop, the codec and the relay (the per-row loops of the publisher and the
follower, ``factstream.replication._relay``) differ. Rows are events-stream ``ev`` rows.
The grid's follower runs untyped (``typed=False``: handlers get the decoded
JSON); ``test_default_follower_rows_per_second`` measures the default, typed
follower (handlers get row objects), which is what an application gets
unless it asks otherwise, with one ``write`` per fact;
``test_default_follower_batched_writes_rows_per_second`` is the same with
each loop turn's 256 facts handed to one ``LocalStream.write_many`` (same
tokens and bytes on the wire, one publication per turn). Throughput rows also record ``cpu_us_per_row``:
the process's CPU seconds per row (median of the timed rounds), which the
machine's other load does not inflate as it does the wall clock; the
default-follower rows turn it into ``cpu_bound_rows_per_s``.
``test_default_follower_reader_in_its_own_process`` puts the writer in a
process of its own (``tcp_writer.py``, one ``write`` per fact) and the default
typed follower in the benchmark's: the timed part runs from the writer's
``go`` to the reader's last row (400,000 rows; starting the writer and
connecting are not timed), and the notes give each side's CPU per row.

``test_default_follower_instructions_per_row`` counts, with valgrind's
callgrind, the CPU instructions per row of the default-follower path for
each twin: the one figure here the machine's other load does not move
(its timing is the whole count, valgrind included).

Latency rows write one fact per millisecond and record, per fact, the time
from completion on the writer to the handler call on each reader
(``p50_us``/``p99_us`` in extra_info; the timing itself is the whole run).

Run: make bench BENCH=tcp (results in benchmarks/results/tcp.json, tables in BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from callgrind import bench_module_script, instructions, require_valgrind
from conftest import twin
from tcp_writer import rows
from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.replication import MemoryUpdateSource
from factstream.transport.tcp import TcpClient, TcpServer

CONFIGS = [pytest.param(("uvloop", "c"), id="uvloop-c"), pytest.param(("asyncio", "py"), id="asyncio-py")]
GRID = [pytest.param((loop, impl), id=f"{loop}-{impl}") for loop in ("uvloop", "asyncio") for impl in ("c", "py")]
N_ROWS = {1: 40_000, 8: 10_000}
ROWS = rows(max(N_ROWS.values()))
#: The same rows as one-row facts, for ``LocalStream.write_many``.
FACTS = [(row,) for row in ROWS]
#: Facts written per event-loop turn (one ``write_many`` call, or as many ``write`` calls).
TURN = 256


def _loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def _setup(
    codec: Any, relay: Any, readers: int, capacity: int, typed: bool = False
) -> tuple[LocalStream, Any, list[Follower], list[TcpClient]]:
    ls = LocalStream("events", "master", source=MemoryUpdateSource(capacity=capacity, relay=relay))
    pub = Publisher("master", relay=relay)
    pub.add_stream("events", ls.source, 0)
    ls.add_listener(pub.notify)
    hub = ReplicationHub("master", publisher=pub)
    server = await TcpServer(hub, "bench", codec=codec, relay=relay, max_buffered=10_000_000).start()
    fols, clients = [], []
    for i in range(readers):
        fol = Follower(typed=typed, positions={("events", "master"): 0}, relay=relay)
        client = await TcpClient(
            ReplicationHub(f"r{i}", follower=fol), "127.0.0.1", server.port, codec=codec, relay=relay
        ).start()
        fols.append(fol)
        clients.append(client)
    while len(hub._replicating) < readers:  # every reader connected and asked REPLICATE
        await asyncio.sleep(0.005)
    return ls, server, fols, clients


async def _teardown(server: Any, clients: list[TcpClient]) -> None:
    for c in clients:
        await c.stop()
    await server.stop()


class _InProcessRound:
    """One in-process round: writer and readers on one loop, in three steps for ``benchmark.pedantic``.

    ``setup`` makes the loop, the server and the connected readers (not
    timed); ``run`` writes the facts and returns once every reader's handler
    has the last row (timed: the clock the module docstring describes);
    ``teardown`` closes the connections and the loop. ``cpu`` gets the
    process's CPU seconds of each ``run`` and ``seconds`` its wall time.
    ``batched``: the writer hands each turn's facts to one ``write_many``
    call instead of one ``write`` each.
    """

    def __init__(self, cfg: tuple[str, str], readers: int, typed: bool = False, batched: bool = False) -> None:
        self.loop_kind, impl = cfg
        self.codec, self.relay = twin("_wire", impl), twin("replication._relay", impl)
        self.readers, self.typed, self.batched = readers, typed, batched
        self.n = N_ROWS[readers]
        self.cpu: list[float] = []
        self.seconds: list[float] = []

    def setup(self) -> None:
        self.loop = _loop(self.loop_kind)
        self.ls, self.server, self.fols, self.clients = self.loop.run_until_complete(
            _setup(self.codec, self.relay, self.readers, self.n * 2, self.typed)
        )
        self.delivered = 0

        def count(stream: str, writer: str, token: int, rows: list[Any]) -> None:
            self.delivered += len(rows)

        for f in self.fols:
            f.add_handler(count)

    async def _write_all(self) -> None:
        n = self.n
        if self.batched:
            write_many = self.ls.write_many
            for i in range(0, n, TURN):
                write_many(FACTS[i : i + TURN])
                await asyncio.sleep(0)
        else:
            write = self.ls.write
            for i in range(n):
                write((ROWS[i],))
                if i % TURN == TURN - 1:
                    await asyncio.sleep(0)
        for f in self.fols:
            await f.wait_for_position("events", "master", n, timeout=120)

    def run(self) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        self.loop.run_until_complete(self._write_all())
        self.seconds.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)

    def teardown(self) -> None:
        assert self.delivered == self.n * self.readers
        self.loop.run_until_complete(_teardown(self.server, self.clients))
        self.loop.close()


def _throughput(cfg: tuple[str, str], readers: int) -> float:
    """Seconds of one round's timed part (from the first write to the last delivery)."""
    one = _InProcessRound(cfg, readers)
    one.setup()
    try:
        one.run()
    finally:
        one.teardown()
    return one.seconds[0]


def _rounds(benchmark: Any, one: _InProcessRound) -> None:
    """Three timed rounds after a warm-up, each with its own connections; the median's CPU per row in the notes."""
    benchmark.pedantic(one.run, setup=one.setup, teardown=one.teardown, rounds=3, warmup_rounds=1)
    median = sorted(one.cpu[-3:])[1]  # of the timed rounds (the warm-up came first)
    benchmark.extra_info["cpu_us_per_row"] = round(1e6 * median / (one.n * one.readers), 2)
    if one.readers == 1:
        # Writer and reader share the process: the rows/s its CPU seconds allow on one free core (on a
        # loaded machine the wall clock also measures the neighbours).
        benchmark.extra_info["cpu_bound_rows_per_s"] = round(one.n / median)


@pytest.mark.parametrize("cfg", GRID)
@pytest.mark.parametrize("readers", [1, 8])
def test_rdata_rows_per_second(benchmark: Any, cfg: tuple[str, str], readers: int) -> None:
    benchmark.group = f"tcp RDATA end to end, {readers} reader{'s' if readers > 1 else ''} (loop x implementation)"
    benchmark.extra_info["items"] = N_ROWS[readers] * readers
    benchmark.extra_info["rows_per_round"] = N_ROWS[readers]
    benchmark.extra_info["follower"] = "typed=False"
    _rounds(benchmark, _InProcessRound(cfg, readers))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_default_follower_rows_per_second(benchmark: Any, cfg: tuple[str, str]) -> None:
    """One reader with the follower as an application gets it by default (typed rows)."""
    benchmark.group = "tcp RDATA end to end, 1 reader, default (typed) follower"
    benchmark.extra_info["items"] = N_ROWS[1]
    benchmark.extra_info["follower"] = "typed=True"
    _rounds(benchmark, _InProcessRound(cfg, 1, typed=True))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_default_follower_batched_writes_rows_per_second(benchmark: Any, cfg: tuple[str, str]) -> None:
    """As the default-follower row, but the writer writes each turn's 256 one-row facts with one ``write_many``.

    The same tokens, commands and bytes on the wire; the publisher hears the
    position move once per turn and publishes the run as one page.
    """
    benchmark.group = "tcp RDATA end to end, 1 reader, default (typed) follower, write_many per turn"
    benchmark.extra_info["items"] = N_ROWS[1]
    benchmark.extra_info["follower"] = "typed=True"
    benchmark.extra_info["writer"] = f"write_many of {TURN} facts per turn"
    _rounds(benchmark, _InProcessRound(cfg, 1, typed=True, batched=True))


#: Rows of the reader-in-its-own-process rows: long enough that the start (connection, first
#: turn) is a small part of a round.
N_OWN_PROCESS = 400_000


class _OwnProcessRound:
    """One round: the writer (tcp_writer.py) in its own process, the default typed follower in this one.

    ``setup`` starts the writer and connects the reader (not timed); ``run``
    says ``go`` and returns once the follower is at token ``n`` (timed);
    ``teardown`` records both sides' CPU seconds and stops the writer.
    """

    def __init__(self, cfg: tuple[str, str], n: int) -> None:
        self.loop_kind, self.impl = cfg
        self.n = n
        self.codec, self.relay = twin("_wire", self.impl), twin("replication._relay", self.impl)
        self.cpu: dict[str, list[float]] = {"reader": [], "writer": []}
        self.seconds: list[float] = []

    def setup(self) -> None:
        self.writer = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("tcp_writer.py")), str(self.n), self.loop_kind, self.impl],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.writer.stdout is not None
        port = int(self.writer.stdout.readline())
        self.loop = _loop(self.loop_kind)
        self.follower = Follower(positions={("events", "master"): 0}, relay=self.relay)  # the default: typed rows
        self.delivered = 0

        def count(stream: str, w: str, token: int, rows: list[Any]) -> None:
            self.delivered += len(rows)

        self.follower.add_handler(count)
        hub = ReplicationHub("r0", follower=self.follower)
        self.client = self.loop.run_until_complete(
            TcpClient(hub, "127.0.0.1", port, codec=self.codec, relay=self.relay).start()
        )
        line = self.loop.run_until_complete(self.loop.run_in_executor(None, self.writer.stdout.readline))
        assert line.strip() == "ready", line

    def run(self) -> None:
        assert self.writer.stdin is not None
        t0, c0 = time.perf_counter(), time.process_time()
        self.writer.stdin.write("go\n")
        self.writer.stdin.flush()
        self.loop.run_until_complete(self.follower.wait_for_position("events", "master", self.n, timeout=120))
        self.seconds.append(time.perf_counter() - t0)
        self.cpu["reader"].append(time.process_time() - c0)

    def teardown(self) -> None:
        assert self.writer.stdin is not None and self.writer.stdout is not None
        assert self.delivered == self.n
        done = self.writer.stdout.readline().split()
        assert done[0] == "done", done
        self.cpu["writer"].append(float(done[1]))
        self.loop.run_until_complete(self.client.stop())
        self.loop.close()
        self.writer.stdin.close()
        try:
            self.writer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.writer.kill()
            self.writer.wait()
        self.writer.stdout.close()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_default_follower_reader_in_its_own_process(benchmark: Any, cfg: tuple[str, str]) -> None:
    """The default typed follower in the benchmark's process, the writer (one ``write`` per fact) in another.

    Each process has a core of its own on an idle two-core machine, so the
    figure is the slower of the two halves; the notes give each side's CPU
    per row (``reader_cpu_us_per_row``, ``writer_cpu_us_per_row``).
    """
    benchmark.group = "tcp RDATA end to end, reader in its own process, default (typed) follower"
    benchmark.extra_info["items"] = N_OWN_PROCESS
    benchmark.extra_info["rows_per_round"] = N_OWN_PROCESS
    benchmark.extra_info["follower"] = "typed=True"
    benchmark.extra_info["writer"] = "own process, one write per fact, 256 per turn"
    rounds = _OwnProcessRound(cfg, N_OWN_PROCESS)
    benchmark.pedantic(rounds.run, setup=rounds.setup, teardown=rounds.teardown, rounds=3, warmup_rounds=1)
    for side in ("reader", "writer"):
        median = sorted(rounds.cpu[side][-3:])[1]
        benchmark.extra_info[f"{side}_cpu_us_per_row"] = round(1e6 * median / N_OWN_PROCESS, 2)


def _latency(cfg: tuple[str, str], readers: int, n: int = 2000) -> tuple[float, float]:
    loop_kind, impl = cfg
    codec, relay = twin("_wire", impl), twin("replication._relay", impl)

    async def main() -> tuple[float, float]:
        ls, server, fols, clients = await _setup(codec, relay, readers, n * 2)
        completed: dict[int, float] = {}
        lat: list[float] = []

        def record(stream: str, writer: str, token: int, rows: list[Any]) -> None:
            lat.append(time.perf_counter() - completed[token])

        for f in fols:
            f.add_handler(record)
        for i in range(n):
            token = ls.reserve()
            completed[token] = time.perf_counter()
            ls.complete(token, (ROWS[i],))
            await asyncio.sleep(0.001)
        for f in fols:
            await f.wait_for_position("events", "master", n, timeout=60)
        await _teardown(server, clients)
        lat.sort()
        return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6

    loop = _loop(loop_kind)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("readers", [1, 8])
def test_completion_to_delivery_latency(benchmark: Any, cfg: tuple[str, str], readers: int) -> None:
    benchmark.group = f"tcp latency completion->delivery, {readers} reader{'s' if readers > 1 else ''}"
    result: dict[str, float] = {}

    def once() -> None:
        result["p50_us"], result["p99_us"] = _latency(cfg, readers)

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info.update({k: round(v, 1) for k, v in result.items()})


@pytest.mark.parametrize("readers", [1, 8])
def test_paired_ratio_uvloop_c_over_asyncio_py(benchmark: Any, readers: int) -> None:
    """Alternate the two configurations round by round (ABAB...) so machine load hits both alike.

    extra_info holds each configuration's median rows/s and the median of the
    per-pair ratios, then every round (rows/s of each configuration and the
    pair's ratio, in run order); the timing row itself is the whole paired run.
    """
    benchmark.group = f"tcp paired ratio, {readers} reader{'s' if readers > 1 else ''}"
    result: dict[str, Any] = {}

    def pairs() -> None:
        fast, slow, ratios = [], [], []
        for _ in range(5):
            a = _throughput(("uvloop", "c"), readers)
            b = _throughput(("asyncio", "py"), readers)
            fast.append(a)
            slow.append(b)
            ratios.append(b / a)
        n = N_ROWS[readers] * readers
        rounds = {
            "uvloop_c_rounds": [round(n / t) for t in fast],
            "asyncio_py_rounds": [round(n / t) for t in slow],
            "pair_ratios": [round(r, 2) for r in ratios],
        }
        fast.sort()
        slow.sort()
        ratios.sort()
        result["uvloop_c_rows_per_s"] = round(n / fast[2])
        result["asyncio_py_rows_per_s"] = round(n / slow[2])
        result["median_pair_ratio"] = round(ratios[2], 2)
        result.update(rounds)

    benchmark.pedantic(pairs, rounds=1, iterations=1)
    benchmark.extra_info.update(result)


#: Rows of the two callgrind runs per twin: the per-row count is their difference over the rows between.
INSTR_ROWS = {"c": (20_000, 120_000), "py": (4_000, 24_000)}


#: The subprocess each count runs: this module loaded as the benchmark session loads it (the tests'
#: conftest gives the twins), then one round of ``n`` rows.
_COUNT_ONE_ROUND = bench_module_script(
    "bench_tcp", "module._instructions_round(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))\n"
)


def _instructions(impl: str, n: int, made: int, out: Path) -> int:
    """Instructions callgrind counts in one in-process round of ``n`` rows (``made`` rows made either way)."""
    return instructions(
        [sys.executable, "-c", _COUNT_ONE_ROUND, str(Path(__file__).resolve().parent), impl, str(n), str(made)], out
    )


def test_default_follower_instructions_per_row(benchmark: Any, tmp_path: Path) -> None:
    """CPU instructions per row on the default-follower path, counted by callgrind: a figure the machine's load does not move.

    Writer, reader and the benchmark's own loop and handler in one process,
    as ``test_default_follower_rows_per_second`` (uvloop, typed follower, one
    ``write`` per fact, 256 per turn). Each twin runs twice with the same
    rows made (so start-up costs the same); per row = (instructions at the
    larger count - at the smaller) / the rows between. The timing is the
    whole measurement (valgrind runs some 50x slower): read the notes.
    """
    require_valgrind()
    benchmark.group = "tcp RDATA end to end, instructions per row (callgrind), default (typed) follower"
    per_row: dict[str, float] = {}

    def count() -> None:
        for impl, (small, big) in INSTR_ROWS.items():
            a = _instructions(impl, small, big, tmp_path / f"cg.{impl}.{small}")
            b = _instructions(impl, big, big, tmp_path / f"cg.{impl}.{big}")
            per_row[impl] = (b - a) / (big - small)

    benchmark.pedantic(count, rounds=1, iterations=1)
    benchmark.extra_info["c_instructions_per_row"] = round(per_row["c"])
    benchmark.extra_info["py_instructions_per_row"] = round(per_row["py"])
    benchmark.extra_info["py_over_c"] = round(per_row["py"] / per_row["c"], 2)


def _instructions_round(impl: str, n: int, made: int) -> None:
    # One round of n rows for _instructions' subprocess, the rows list made for ``made`` rows either way.
    global ROWS
    ROWS = rows(made)
    N_ROWS[1] = n
    one = _InProcessRound(("uvloop", impl), 1, typed=True)
    one.setup()
    try:
        one.run()
    finally:
        one.teardown()
