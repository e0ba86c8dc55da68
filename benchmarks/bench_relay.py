"""The relay's per-row loops three ways: the pure twin, the hand-written Cython
module, and the pure twin compiled by Cython in pure-Python mode with a
``.pxd`` (issue 12: "try compiling the pure module, keep it if it holds the
measured speed").

The third module is built here, at the start of the run, from a copy of
``factstream/replication/_relay_py.py`` (relative imports made absolute, the
``__slots__`` lines dropped since extension types declare their fields in
``benchmarks/relay_pure/_relay_pm.pxd``), so the figure always measures the
pure twin as it is today. Workloads: ``gather`` over 100,000 RDATA (3 rows a
fact), ``StreamEmitter.commands`` publishing 100,000 rows, and
``RowWindow.add`` + ``get_updates_now`` of 100,000 rows.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
N = 100_000


def _build_pure_mode(tmp: Path) -> ModuleType:
    import factstream.replication  # noqa: F401 - the package first: its modules import each other through it
    from factstream.replication import _relay_py as pure

    text = Path(pure.__file__).read_text()
    text = re.sub(r"^from \.\.(\w+)", r"from factstream.\1", text, flags=re.M)
    text = re.sub(r"^    __slots__ = .*\n", "", text, flags=re.M)
    (tmp / "_relay_pm.py").write_text(text)
    shutil.copy(HERE / "relay_pure" / "_relay_pm.pxd", tmp / "_relay_pm.pxd")
    (tmp / "setup.py").write_text(
        "from setuptools import setup\nfrom Cython.Build import cythonize\n"
        "setup(ext_modules=cythonize(['_relay_pm.py'], compiler_directives={'language_level': 3}, quiet=True))\n"
    )
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tmp, check=True,
                   capture_output=True)
    built = next(tmp.glob("_relay_pm*.so"))
    spec = importlib.util.spec_from_file_location("_relay_pm", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def relays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    import factstream.replication  # noqa: F401 - the package first: its modules import each other through it
    from factstream.replication import _relay_c as compiled, _relay_py as pure

    return {"py": pure, "cython-pyx": compiled, "cython-pure-mode": _build_pure_mode(tmp_path_factory.mktemp("relay"))}


KINDS = ["py", "cython-pyx", "cython-pure-mode"]


def _rdata() -> list[Any]:
    from factstream.commands import RdataCommand

    out: list[Any] = []
    for token in range(1, N // 3 + 1):
        out.append(RdataCommand("caches", "master", None, ["f", ["k"], token]))
        out.append(RdataCommand("caches", "master", None, ["f", ["k"], token]))
        out.append(RdataCommand("caches", "master", token, ["f", ["k"], token]))
    return out


@pytest.mark.benchmark(group="relay-gather")
@pytest.mark.parametrize("kind", KINDS)
def test_gather(benchmark: Any, relays: dict[str, ModuleType], kind: str) -> None:
    relay = relays[kind]
    cmds = _rdata()
    end, facts, batch, stale = benchmark(relay.gather, cmds, 0, 0, [])
    assert end == len(cmds) and len(facts) == N // 3 and batch == [] and stale == 0
    benchmark.extra_info.update(rows=len(cmds), relay=kind)


@pytest.mark.benchmark(group="relay-commands")
@pytest.mark.parametrize("kind", KINDS)
def test_stream_emitter_commands(benchmark: Any, relays: dict[str, ModuleType], kind: str) -> None:
    relay = relays[kind]
    updates = [(t // 2 + 1, ["f", ["k"], t]) for t in range(N)]
    upto = updates[-1][0] + 5

    def run() -> int:
        em = relay.StreamEmitter("caches", "master", None, 0, None, [], 500)
        return len(em.commands(updates, upto))

    assert benchmark(run) == N + 1  # every row, then POSITION over the tail
    benchmark.extra_info.update(rows=N, relay=kind)


@pytest.mark.benchmark(group="relay-window")
@pytest.mark.parametrize("kind", KINDS)
def test_row_window_add_and_read(benchmark: Any, relays: dict[str, ModuleType], kind: str) -> None:
    relay = relays[kind]

    def run() -> int:
        win = relay.RowWindow(N)
        got = 0
        for t in range(1, N + 1):
            win.add("master", t, t)
            updates, _upto, _limited = win.get_updates_now("master", t - 1, t, 100)
            got += len(updates)
        return got

    assert benchmark(run) == N
    benchmark.extra_info.update(rows=N, relay=kind)
