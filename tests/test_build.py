"""The build: which implementation is active, and that the switch works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import factstream
from factstream import _compat


def test_compiled_core_active_unless_switched_off() -> None:
    # Sentinel: a normal install must run the compiled core, never silently the twins.
    if _compat.REQUESTED_IMPL != "python":
        assert factstream.IMPL == "c", (
            f"compiled core expected but the pure twins are active ({_compat.FALLBACK_REASON}); run 'make install'"
        )
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


# ------------------------------------------------------------ FACTSTREAM_IMPL

PROBE = "import factstream, factstream.wire as w; print(factstream.IMPL, w.parse_line.__module__)"


def _python(code: str, tmp_path: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python, importing factstream from ``tmp_path`` when given (else the installed one)."""
    child = {k: v for k, v in os.environ.items() if k not in ("FACTSTREAM_IMPL", "FACTSTREAM_NO_EXTENSIONS")}
    child.update(env)
    if tmp_path is not None:
        child["PYTHONPATH"] = os.pathsep.join([str(tmp_path), child.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, cwd=tmp_path or "/")


def _package_copy(tmp_path: Path, damage: str) -> Path:
    """A copy of the installed package whose compiled modules are ``damage``d: "missing", "broken" or "one-broken"."""
    if factstream.IMPL != "c":
        pytest.fail("these tests need the compiled core installed (run 'make install')")
    src = Path(factstream.__file__).resolve().parent
    dst = tmp_path / "factstream"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    compiled = sorted(
        p
        for p in dst.rglob("*")
        if p.suffix in (".so", ".pyd")
        and ".".join(p.relative_to(dst).with_name(p.name.split(".")[0]).parts) in _compat.COMPILED_MODULES
    )
    assert len(compiled) == len(_compat.COMPILED_MODULES), compiled
    for lib in compiled[:1] if damage == "one-broken" else compiled:
        if damage == "missing":
            lib.unlink()
        else:
            lib.write_bytes(b"this is not a shared library")
    return tmp_path


def test_impl_python_forces_the_pure_twins_even_when_compiled_is_installed() -> None:
    proc = _python(PROBE, FACTSTREAM_IMPL="python")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["python", "factstream._wire_py"]


def test_impl_c_loads_the_compiled_core() -> None:
    proc = _python(PROBE, FACTSTREAM_IMPL="c")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["c", "factstream._wire_c"]


@pytest.mark.parametrize("damage", ["missing", "broken", "one-broken"])
def test_impl_c_makes_an_absent_or_broken_core_an_error_with_its_reason(tmp_path: Path, damage: str) -> None:
    proc = _python(PROBE, _package_copy(tmp_path, damage), FACTSTREAM_IMPL="c")
    assert proc.returncode == 1
    assert "ImportError: FACTSTREAM_IMPL=c but the compiled core cannot be imported" in proc.stderr
    assert "factstream._wire_c" in proc.stderr or damage == "one-broken"
    # the reason itself, not just the fact
    assert ("No module named" in proc.stderr) if damage == "missing" else ("invalid ELF header" in proc.stderr or "too short" in proc.stderr)


def test_without_impl_an_absent_core_falls_back_and_logs_why_at_debug(tmp_path: Path) -> None:
    code = "import logging; logging.basicConfig(level=logging.DEBUG); " + PROBE + "; print(repr(factstream._compat.FALLBACK_REASON))"
    proc = _python(code, _package_copy(tmp_path, "missing"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["python", "factstream._wire_py"]
    assert "No module named 'factstream._wire_c'" in proc.stdout  # kept for whoever asks
    assert "DEBUG:factstream:factstream: compiled core not installed" in proc.stderr
    assert "No module named 'factstream._wire_c'" in proc.stderr
    quiet = _python(PROBE, tmp_path)  # nothing printed when logging is not set up for debug
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_without_impl_a_broken_core_falls_back_with_a_warning(tmp_path: Path) -> None:
    proc = _python(PROBE, _package_copy(tmp_path, "broken"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["python", "factstream._wire_py"]
    assert "compiled core installed but not importable" in proc.stderr  # logging's last-resort handler
    assert "factstream._wire_c: ImportError" in proc.stderr


def test_partly_compiled_is_an_error_naming_the_broken_module(tmp_path: Path) -> None:
    proc = _python(PROBE, _package_copy(tmp_path, "one-broken"))
    assert proc.returncode == 1
    assert "factstream is partly compiled" in proc.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FACTSTREAM_IMPL": "cython"}, "FACTSTREAM_IMPL='cython' is not an implementation"),
        ({"FACTSTREAM_IMPL": "c", "FACTSTREAM_NO_EXTENSIONS": "1"}, "contradicts FACTSTREAM_NO_EXTENSIONS"),
    ],
)
def test_bad_impl_settings_are_clear_errors(env: dict[str, str], message: str) -> None:
    proc = _python(PROBE, **env)
    assert proc.returncode == 1
    assert message in proc.stderr


def test_no_extensions_still_selects_the_pure_twins() -> None:
    proc = _python(PROBE, FACTSTREAM_NO_EXTENSIONS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["python", "factstream._wire_py"]
