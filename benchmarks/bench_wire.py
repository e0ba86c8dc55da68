"""Codec throughput, compiled twin vs pure-Python twin, on one mixed corpus.

Run: make bench PYTEST_ARGS="-k bench_wire"  (or: .venv/bin/python -m pytest
benchmarks/bench_wire.py --benchmark-only --benchmark-json=wire.json and then
.venv/bin/python benchmarks/ratios.py wire.json). ratios.py gives the compiled
twin's speed-up over the pure one per group; test_against_synapse's
extra_info gives each twin's speed-up over Synapse's own codec, per operation
(parse with rows decoded, LineDecoder.feed in 4 KiB / 64 KiB chunks and the
whole buffer at once, the whole buffer through LineDecoder.iter_feed,
serialise), and for the compiled twin its speed-up over
the pure one timed in the same alternating rounds (``*_speedup_over_pure``;
the per-group ratios come from separate, consecutive timings instead).

Rows are decoded two ways: ``rows=True`` (``parse_line(line, rows=True)``,
``LineDecoder(rows=True)``: each row built in the pass that validates it, as
Synapse decodes eagerly: the same work) and lazily (parse, then read
``.row``: validated by the parse, built on first read; the ``*_lazy``
operations and the "lazy .row" groups).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest

from callgrind import bench_module_script
from corpus import generate
from factstream.commands import RdataCommand

@pytest.fixture(autouse=True)
def _record_impl(request: pytest.FixtureRequest) -> None:
    """Every result says which build ran it (factstream.IMPL) beside the twin it measured."""
    import factstream

    if "benchmark" in request.fixturenames:
        request.getfixturevalue("benchmark").extra_info["factstream_impl"] = factstream.IMPL


N_LINES = 20_000
LINES = generate(N_LINES)
BUFFER = b"".join(line + b"\n" for line in LINES)


def _consume(cmds: Iterable[object]) -> int:
    """What a reader does with each command: look at it, decode RDATA rows, drop it. How many (-1: an iterator)."""
    if type(cmds) is list:
        for cmd in cmds:
            if type(cmd) is RdataCommand:
                cmd.row  # noqa: B018
        return len(cmds)
    for cmd in cmds:  # an iterator: not counted (a list's len costs nothing per command; counting would)
        if type(cmd) is RdataCommand:
            cmd.row  # noqa: B018
    return -1


CHUNKS = {"4KiB": 4096, "64KiB": 65536, "whole": None}
#: The whole buffer given to ``iter_feed`` (timed beside the CHUNKS, named ``feed_whole_iter`` in notes).
WHOLE_ITER = -1


def _feed_all(wire_impl: ModuleType, chunk: int | None, rows: bool = True) -> int:
    """Feed BUFFER in ``chunk``-byte pieces (or all at once, or all through iter_feed) and consume every command."""
    if chunk is None:
        return _consume(wire_impl.LineDecoder(max_line_length=1 << 30, rows=rows).feed(BUFFER))
    if chunk == WHOLE_ITER:
        return _consume(wire_impl.LineDecoder(max_line_length=1 << 30, rows=rows).iter_feed(BUFFER))
    dec = wire_impl.LineDecoder(rows=rows)
    n = 0
    for i in range(0, len(BUFFER), chunk):
        n += _consume(dec.feed(BUFFER[i : i + chunk]))
    return n


@pytest.mark.parametrize("rows", ["rows=True", "lazy .row"])
@pytest.mark.parametrize("chunk", list(CHUNKS))
@pytest.mark.benchmark(group="decode buffer, rows decoded")
def test_decode_buffer(benchmark, wire_impl: ModuleType, chunk: str, rows: str) -> None:
    benchmark.group = f"decode buffer in {chunk} chunks, rows decoded ({rows})"
    assert benchmark(_feed_all, wire_impl, CHUNKS[chunk], rows == "rows=True") == N_LINES
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.parametrize("rows", ["rows=True", "lazy .row"])
def test_decode_buffer_whole_iter_feed(benchmark, wire_impl: ModuleType, rows: str) -> None:
    """The whole buffer through ``iter_feed``: each command built as it is taken and dropped after use."""
    benchmark.group = f"decode buffer whole through iter_feed, rows decoded ({rows})"
    dec = wire_impl.LineDecoder(max_line_length=1 << 30, rows=rows == "rows=True")
    assert sum(1 for _ in dec.iter_feed(BUFFER)) == N_LINES  # counted once, outside the timing
    benchmark(_feed_all, wire_impl, WHOLE_ITER, rows == "rows=True")
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.parametrize("rows", ["rows=True", "lazy .row"])
def test_decode_buffer_64k_chunks_all_kept(benchmark, wire_impl: ModuleType, rows: str) -> None:
    """64 KiB chunks whose commands are all kept until the end, as one whole-buffer feed keeps them.

    The other chunked rows free each chunk's commands before the next
    chunk; a whole-buffer feed returns all of them at once. This row holds
    the same objects as the whole buffer does, so the two compare the
    decoder's handling of a big buffer with the size of what it returns
    taken out.
    """
    benchmark.group = f"decode buffer in 64KiB chunks, every command kept to the end, rows decoded ({rows})"

    def run() -> int:
        dec = wire_impl.LineDecoder(rows=rows == "rows=True")
        kept: list[object] = []
        for i in range(0, len(BUFFER), 65536):
            kept += dec.feed(BUFFER[i : i + 65536])
        return _consume(kept)

    assert benchmark(run) == N_LINES
    benchmark.extra_info["lines"] = N_LINES


def _parse_rows(parse, eager: bool) -> int:
    """Parse every line and decode every RDATA row: ``rows=True``, or parse then read ``.row``."""
    n = 0
    if eager:
        for line in LINES:
            parse(line, rows=True)
            n += 1
        return n
    for line in LINES:
        cmd = parse(line)
        if type(cmd) is RdataCommand:
            cmd.row  # noqa: B018
        n += 1
    return n


@pytest.mark.parametrize("rows", ["rows=True", "lazy .row"])
@pytest.mark.benchmark(group="parse_line, rows decoded")
def test_parse_line_rows(benchmark, wire_impl: ModuleType, rows: str) -> None:
    benchmark.group = f"parse_line, rows decoded ({rows})"
    assert benchmark(_parse_rows, wire_impl.parse_line, rows == "rows=True") == N_LINES
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.benchmark(group="parse_line, headers only")
def test_parse_line_headers(benchmark, wire_impl: ModuleType) -> None:
    parse = wire_impl.parse_line

    def run() -> int:
        n = 0
        for line in LINES:
            parse(line)
            n += 1
        return n

    assert benchmark(run) == N_LINES
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.benchmark(group="encode_lines, fresh commands")
def test_encode_lines_fresh(benchmark, wire_impl: ModuleType) -> None:
    # Commands built by the application (no received bytes to reuse).
    from factstream import _wire_py

    cmds = [_wire_py.parse_line(line) for line in LINES]
    data = benchmark(wire_impl.encode_lines, cmds)
    assert data == BUFFER
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.benchmark(group="encode_lines, relaying parsed commands")
def test_encode_lines_relay(benchmark, wire_impl: ModuleType) -> None:
    cmds = [wire_impl.parse_line(line) for line in LINES]
    data = benchmark(wire_impl.encode_lines, cmds)
    assert data == BUFFER
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.benchmark(group="reference: Synapse's own codec")
def test_against_synapse(benchmark, tmp_path, wire_impl: ModuleType) -> None:
    """Synapse 1.163.2's codec (the oracle venv, `make oracle`) on the same corpus, rounds alternating with ours.

    extra_info holds, per operation, lines/s of each and this twin's speed-up
    over Synapse: each side's best time over ROUNDS rounds, Synapse's script
    and our loops taking turns so that both see the same machine load. For
    the compiled twin the pure twin takes its turn in the same rounds too
    (``*_speedup_over_pure``).
    """
    import json
    import os
    import subprocess

    from conftest import synapse_python

    python = synapse_python()  # skips locally without the oracle; fails under CI=true
    corpus = tmp_path / "corpus.log"
    corpus.write_bytes(BUFFER)
    script = Path(__file__).resolve().parent / "synapse_speed.py"
    from factstream import _wire_py

    ours_ops = _ops(wire_impl)
    # The compiled twin also takes turns with the pure one, so that its
    # speed-up over the pure twin comes from the same machine load as well.
    pure_ops = _ops(_wire_py) if wire_impl is not _wire_py else {}
    theirs_of = {"parse_rows": "parse_s", "parse_rows_lazy": "parse_s", "encode": "encode_s",
                 **{f"feed_{n}": "decode_s" for n in FEEDS}, **{f"feed_{n}_lazy": "decode_s" for n in FEEDS},
                 "feed_64KiB_with_reader": "decode_s"}
    ours = {op: float("inf") for op in ours_ops}
    pure = {op: float("inf") for op in pure_ops}
    theirs = {key: float("inf") for key in ("parse_s", "decode_s", "encode_s")}
    for _ in range(ROUNDS):
        syn = json.loads(subprocess.run([python, str(script), str(corpus), "2"], capture_output=True, text=True,
                                        check=True, cwd="/", env={**os.environ, "PYTHONPATH": ""}).stdout)
        for key in theirs:
            theirs[key] = min(theirs[key], syn[key])
        for op, fn in ours_ops.items():
            ours[op] = min(ours[op], _time(fn), _time(fn))
            if op in pure_ops:
                pure[op] = min(pure[op], _time(pure_ops[op]), _time(pure_ops[op]))
    benchmark(ours_ops["feed_whole"])
    benchmark.extra_info.update(lines=N_LINES, impl=wire_impl.__name__.rsplit("_", 1)[-1], rounds=ROUNDS)
    for op, seconds in ours.items():
        their = theirs[theirs_of[op]]
        benchmark.extra_info[f"{op}_lines_per_s"] = round(N_LINES / seconds)
        benchmark.extra_info[f"synapse_{op}_lines_per_s"] = round(N_LINES / their)
        benchmark.extra_info[f"{op}_speedup_over_synapse"] = round(their / seconds, 2)
        if op in pure:
            benchmark.extra_info[f"{op}_speedup_over_pure"] = round(pure[op] / seconds, 2)
    # The whole buffer against 64 KiB chunks, per line, from the same rounds (above 1: the whole buffer is faster).
    for whole in ("feed_whole", "feed_whole_iter"):
        benchmark.extra_info[f"{whole}_speed_vs_64KiB"] = round(ours["feed_64KiB"] / ours[whole], 3)


def _feed_only(wire_impl: ModuleType, chunk: int | None) -> None:
    """Decode BUFFER with rows decoded (``rows=True``) and drop every command: the work Synapse's decode does.

    Synapse's loop parses each line (its row decoded) and drops the command;
    here the decoder's lists are dropped as they come (an iterator is run to
    its end in C). No reader loop in Python: ``_feed_all`` is the one with it.
    """
    if chunk is None:
        wire_impl.LineDecoder(max_line_length=1 << 30, rows=True).feed(BUFFER)
    elif chunk == WHOLE_ITER:
        deque(wire_impl.LineDecoder(max_line_length=1 << 30, rows=True).iter_feed(BUFFER), 0)
    else:
        feed = wire_impl.LineDecoder(rows=True).feed
        for i in range(0, len(BUFFER), chunk):
            feed(BUFFER[i : i + chunk])


def _ops(wire_impl: ModuleType) -> dict[str, object]:
    """The timed operations of one twin: parse with rows decoded, feed per chunk size, serialise.

    Rows decoded with ``rows=True`` (as Synapse: eagerly; each command then
    dropped, as Synapse's loop drops it) and, as ``*_lazy``, by reading
    ``.row`` after the parse (a reader's loop over the commands: the read is
    the decode). ``feed_64KiB_with_reader`` is ``feed_64KiB`` with that
    reader's loop too (how ``feed_*`` was timed until 2026-11-29: work
    Synapse's side does not do).
    """
    cmds = wire_impl.LineDecoder().feed(BUFFER)
    _consume(cmds)  # rows read: encoding below serialises them, it does not reuse received bytes
    parse = wire_impl.parse_line

    return {
        "parse_rows": lambda: _parse_rows(parse, True),
        "parse_rows_lazy": lambda: _parse_rows(parse, False),
        **{f"feed_{name}": (lambda chunk=chunk: _feed_only(wire_impl, chunk)) for name, chunk in FEEDS.items()},
        "feed_64KiB_with_reader": lambda: _feed_all(wire_impl, 65536),
        **{f"feed_{name}_lazy": (lambda chunk=chunk: _feed_all(wire_impl, chunk, False))
           for name, chunk in FEEDS.items()},
        "encode": lambda: wire_impl.encode_lines(cmds),
    }


#: The feed operations timed against Synapse's decode of the buffer: chunk sizes, then the whole through iter_feed.
FEEDS: dict[str, int | None] = {**CHUNKS, "whole_iter": WHOLE_ITER}

ROUNDS = 5  # best of 5 alternating rounds: the shared machine's load moves between runs


def _time(fn) -> float:
    import time

    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


#: Our operations and the Synapse operation each is compared with, by instructions.
INSTR_OPS = {"parse_rows": "parse", "feed_64KiB": "decode", "feed_whole": "decode", "feed_whole_iter": "decode",
             "encode": "encode"}

#: The subprocess each count of ours runs: this module loaded as the benchmark session loads it, then
#: ``passes`` runs of one operation of one twin.
_OUR_PASSES = bench_module_script(
    "bench_wire",
    "op = module._ops(conftest.twin('_wire', sys.argv[2]))[sys.argv[3]]\nfor _ in range(int(sys.argv[4])):\n    op()\n",
)


# Some seven to ten minutes alone; with another job on the machine it passed the default 600 s timeout, and the
# failed test's empty timings then cost the whole run's JSON (pytest-benchmark cannot save a test with none).
@pytest.mark.timeout(1800)
def test_against_synapse_instructions(benchmark, tmp_path) -> None:
    """Instructions per line, compiled twin vs Synapse 1.163.2's codec (and vs the pure twin), by callgrind.

    The same operations and corpus as ``test_against_synapse``, counted
    instead of timed: the machine's speed moves the timed ratios by tens of
    per cent from run to run (and between the two sides of a ratio); the
    instructions do not. What a count does not see is the memory system (a
    whole-file buffer's objects out of the cache): the timed test is the one
    for that. Some seven minutes (valgrind runs Python some 50x slower).
    """
    import os
    import sys

    from callgrind import instructions, require_valgrind
    from conftest import synapse_python

    require_valgrind()
    python = synapse_python()
    corpus = tmp_path / "corpus.log"
    corpus.write_bytes(BUFFER)
    here = Path(__file__).resolve().parent
    syn_env = {**os.environ, "PYTHONPATH": ""}

    counts: dict[str, float] = {}

    def count() -> None:
        # per side (Synapse, each twin): a run doing no pass (start-up, corpus read, commands made), then
        # a run per operation doing two passes; per line = the difference / (2 x the lines)
        def syn(op: str, n: int) -> list[str]:
            return [python, str(here / "synapse_speed.py"), str(corpus), "--passes", op, str(n)]

        def ours(impl: str, op: str, n: int) -> list[str]:
            return [sys.executable, "-c", _OUR_PASSES, str(here), impl, op, str(n)]

        start = instructions(syn("decode", 0), tmp_path / "cg.syn", cwd="/", env=syn_env)
        for op in sorted(set(INSTR_OPS.values())):
            got = instructions(syn(op, 2), tmp_path / f"cg.syn.{op}", cwd="/", env=syn_env)
            counts[f"synapse_{op}"] = (got - start) / (2 * N_LINES)
        for impl, ops in (("c", list(INSTR_OPS)), ("py", ["feed_whole"])):
            start = instructions(ours(impl, "encode", 0), tmp_path / f"cg.{impl}")
            for op in ops:
                got = instructions(ours(impl, op, 2), tmp_path / f"cg.{impl}.{op}")
                counts[f"{impl}_{op}"] = (got - start) / (2 * N_LINES)

    benchmark.group = "codec vs Synapse, instructions per line (callgrind)"
    benchmark.pedantic(count, rounds=1, iterations=1)
    info = benchmark.extra_info
    info["lines"] = N_LINES
    for op, theirs in INSTR_OPS.items():
        ours = counts[f"c_{op}"]
        info[f"{op}_instructions_per_line"] = round(ours)
        info[f"synapse_{theirs}_instructions_per_line"] = round(counts[f"synapse_{theirs}"])
        info[f"{op}_fewer_than_synapse"] = round(counts[f"synapse_{theirs}"] / ours, 2)
    info["py_feed_whole_instructions_per_line"] = round(counts["py_feed_whole"])
    info["feed_whole_fewer_than_pure"] = round(counts["py_feed_whole"] / counts["c_feed_whole"], 2)
