"""The build: which implementation is active, and that the switch works."""

from __future__ import annotations

import os
import subprocess
import sys

import factstream
from factstream import _compat


def test_compiled_core_active_unless_switched_off() -> None:
    # Sentinel: a normal install must run the compiled core, never silently the twins.
    if os.environ.get("FACTSTREAM_NO_EXTENSIONS", "") in ("", "0"):
        assert factstream.IMPL == "c", "compiled core expected but the pure twins are active; run 'make install'"
    else:
        assert factstream.IMPL == "python"


def test_switch_selects_pure_twin() -> None:
    env = dict(os.environ, FACTSTREAM_NO_EXTENSIONS="1")
    out = subprocess.run(
        [sys.executable, "-c", "import factstream, factstream.wire as w; print(factstream.IMPL, w.parse_line.__module__)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out == ["python", "factstream._wire_py"]


def test_every_compiled_module_has_a_twin() -> None:
    for compiled, pure in _compat.COMPILED_MODULES.items():
        assert compiled.endswith("_c") and pure == compiled[:-2] + "_py"
        assert _compat.load(compiled[:-2], "python").__name__ == f"factstream.{pure}"


def test_package_ships_py_typed() -> None:
    assert (factstream.__path__[0] + "/py.typed") and os.path.exists(os.path.join(factstream.__path__[0], "py.typed"))
