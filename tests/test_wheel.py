"""The built wheel is whole: installed alone into a fresh venv it imports the compiled codec."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent


def _newest(pattern: str) -> Path | None:
    wheels = sorted(ROOT.glob(pattern), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def _clean_env() -> dict[str, str]:
    # Nothing from this process may leak into the fresh venv's imports.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "FACTSTREAM_NO_EXTENSIONS")}


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True, env=_clean_env())
    return python


def _need(wheel: Path | None) -> Path:
    if wheel is None:
        unavailable("no wheel in wheels/: run 'make wheel'")
    return wheel


@pytest.mark.slow
def test_compiled_wheel_imports_the_compiled_codec(tmp_path: Path) -> None:
    wheel = _need(_newest("wheels/factstream-*-cp*.whl"))
    python = _fresh_venv(tmp_path, wheel)
    code = (
        "import factstream, factstream.wire as w, factstream._wire_c as c;"
        "print(factstream.IMPL, w.parse_line.__module__, c.__file__.endswith('.so'));"
        "print(w.encode(w.parse_line(b'RDATA events master 5 [\"a\"]')).decode())"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=_clean_env()).stdout
    assert out.splitlines() == ["c factstream._wire_c True", 'RDATA events master 5 ["a"]']
    # The sample log and the type marker ship too.
    files = subprocess.run([python, "-c", "import factstream, os; d = factstream.__path__[0]; "
                            "print(os.path.exists(os.path.join(d, 'data', 'sample.log')), "
                            "os.path.exists(os.path.join(d, 'py.typed')))"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env=_clean_env()).stdout.split()
    assert files == ["True", "True"]


@pytest.mark.slow
def test_pure_wheel_runs_the_twins(tmp_path: Path) -> None:
    wheel = _need(_newest("wheels/pure/factstream-*-py3-none-any.whl"))
    python = _fresh_venv(tmp_path, wheel)
    out = subprocess.run([python, "-c", "import factstream; print(factstream.IMPL)"],
                         capture_output=True, text=True, check=True, cwd=tmp_path, env=_clean_env()).stdout.strip()
    assert out == "python"
    assert sys.version_info >= (3, 11)
