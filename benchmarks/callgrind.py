"""Instructions counted by valgrind's callgrind: figures the machine's load and speed do not move.

A shared VM's speed moves by tens of per cent between runs (and between the
two sides of a ratio); the instructions a piece of work takes do not. Each
figure here is the difference between two runs of one program that differ
only in how much work they do, so start-up (imports, the corpus read) cancels.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest


def require_valgrind() -> None:
    """Skip without valgrind (every machine kind here has it; ``make bench`` is not CI)."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")


def instructions(argv: Sequence[str], out: Path, *, cwd: str | None = None, env: dict[str, str] | None = None) -> int:
    """Instructions of the whole run of ``argv`` (every thread), counted by callgrind into ``out``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
        capture_output=True, text=True, timeout=1800, cwd=cwd, env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise AssertionError(f"no instruction total in {out}")


def bench_module_script(module: str, body: str) -> str:
    """Source for ``python -c`` in a counted run: benchmark ``module`` loaded as the benchmark session loads it
    (the tests' conftest beside it; ``sys.argv[1]`` is the benchmarks folder), then ``body``, which sees it as
    ``module`` (and ``conftest``)."""
    return (
        "import importlib.util, sys\n"
        "from pathlib import Path\n"
        "here = Path(sys.argv[1])\n"
        "sys.path[:0] = [str(here.parent / 'tests'), str(here)]\n"
        "import conftest\n"
        f"spec = importlib.util.spec_from_file_location({module!r}, here / {module + '.py'!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        + body
    )
