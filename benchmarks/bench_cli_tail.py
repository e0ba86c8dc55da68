"""``factstream tail`` printing rows to a file, the installed executable end to end (issue 17, target 4).

A blaster process (tail_blaster.py) answers REPLICATE with N pre-encoded RDATA lines in the shape
``serve --produce`` writes (one fact in eight a 3-row batch), so the writer costs nothing and the
reader is what is measured. Variants, in the same run:

* ``wire``: the default output, printed from the bytes received (no decoding);
* ``typed``: a ``--format`` asking for a row field, which decodes every row into its typed row
  (the cost every row paid before, and still pays when fields are asked for);
* ``json``: ``--json``.

Each round is a whole command (start-up included); extra_info has rows/s by wall clock and by the
tail process's CPU time, which is what a loaded machine does not distort.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import factstream

N = 500_000
FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def blaster() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, str(HERE / "tail_blaster.py"), str(N)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield port
    proc.kill()
    proc.wait()
    proc.stdout.close()


VARIANTS = {"wire": [], "typed": ["--format", r"%s %w %t %{cache_func}\n"], "json": ["--json"]}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tail_rows_to_a_file(benchmark: Any, blaster: int, variant: str, tmp_path: Path) -> None:
    out = tmp_path / "rows.txt"
    cpu: list[float] = []

    def once() -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(out, "wb") as fh:
            subprocess.run([FACTSTREAM, "tail", f"127.0.0.1:{blaster}", "--count", str(N), *VARIANTS[variant]],
                           stdout=fh, check=True, timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

    benchmark.group = "cli-tail-to-file"
    benchmark.pedantic(once, rounds=3, iterations=1)
    with open(out, "rb") as fh:
        lines = sum(1 for _ in fh)
    assert lines == N
    benchmark.extra_info["items"] = N
    benchmark.extra_info["impl"] = factstream.IMPL
    benchmark.extra_info["rows_per_s_wall_best"] = round(N / benchmark.stats["min"])
    benchmark.extra_info["rows_per_s_cpu_best"] = round(N / min(cpu))
