"""Codec throughput, compiled twin vs pure-Python twin, on one mixed corpus.

Run: make bench PYTEST_ARGS="-k bench_wire"  (or: .venv/bin/python -m pytest
benchmarks/bench_wire.py --benchmark-only --benchmark-json=wire.json and then
.venv/bin/python benchmarks/ratios.py wire.json)
"""

from __future__ import annotations

from types import ModuleType

import pytest

from corpus import generate
from factstream.commands import RdataCommand

N_LINES = 20_000
LINES = generate(N_LINES)
BUFFER = b"".join(line + b"\n" for line in LINES)


def _consume(cmds: list[object]) -> int:
    """What a reader does with each command: look at it, decode RDATA rows, drop it."""
    for cmd in cmds:
        if type(cmd) is RdataCommand:
            cmd.row  # noqa: B018
    return len(cmds)


@pytest.mark.benchmark(group="decode buffer, rows decoded")
def test_decode_buffer(benchmark, wire_impl: ModuleType) -> None:
    def run() -> int:
        dec = wire_impl.LineDecoder()
        n = 0
        for i in range(0, len(BUFFER), 65536):  # socket-sized chunks
            n += _consume(dec.feed(BUFFER[i : i + 65536]))
        return n

    assert benchmark(run) == N_LINES
    benchmark.extra_info["lines"] = N_LINES


@pytest.mark.benchmark(group="parse_line, rows decoded")
def test_parse_line_rows(benchmark, wire_impl: ModuleType) -> None:
    parse = wire_impl.parse_line

    def run() -> int:
        n = 0
        for line in LINES:
            cmd = parse(line)
            if type(cmd) is RdataCommand:
                cmd.row  # noqa: B018
            n += 1
        return n

    assert benchmark(run) == N_LINES
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
    """Synapse's codec (in the oracle venv, `make oracle`) on the same corpus, same run.

    Reported in extra_info as lines/s and as this twin's speed-up over it.
    """
    import json
    import os
    import subprocess
    import time
    from pathlib import Path

    python = Path(__file__).resolve().parent.parent / ".venv-synapse" / "bin" / "python"
    if not python.exists():
        pytest.skip("Synapse oracle not installed: run 'make oracle'")
    corpus = tmp_path / "corpus.log"
    corpus.write_bytes(BUFFER)
    script = Path(__file__).resolve().parent / "synapse_speed.py"
    syn = json.loads(subprocess.run([str(python), str(script), str(corpus)], capture_output=True, text=True,
                                    check=True, cwd="/", env={**os.environ, "PYTHONPATH": ""}).stdout)

    def ours() -> None:
        dec = wire_impl.LineDecoder()
        for i in range(0, len(BUFFER), 65536):
            _consume(dec.feed(BUFFER[i : i + 65536]))

    benchmark(ours)
    best = min(_time(ours) for _ in range(5))  # best-of-5, as the Synapse script measures
    cmds = wire_impl.LineDecoder().feed(BUFFER)
    for cmd in cmds:
        if type(cmd) is RdataCommand:
            cmd.row  # noqa: B018 - measure real serialisation, not byte reuse
    enc = min(_time(lambda: wire_impl.encode_lines(cmds)) for _ in range(5))
    benchmark.extra_info.update(
        lines=N_LINES,
        synapse_decode_lines_per_s=round(N_LINES / syn["decode_s"]),
        synapse_encode_lines_per_s=round(N_LINES / syn["encode_s"]),
        decode_speedup_over_synapse=round(syn["decode_s"] / best, 2),
        encode_speedup_over_synapse=round(syn["encode_s"] / enc, 2),
    )


def _time(fn) -> float:
    import time

    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
