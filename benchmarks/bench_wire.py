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
