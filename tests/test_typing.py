"""The package type-checks cleanly under the repo's mypy config (``[tool.mypy]``, strict).

Checks the ``factstream`` that is imported (the source tree or an installed
wheel), so a wheel's copy is held to the same bar. Compiled ``.so`` modules next
to the ``.py`` files are ignored by mypy; the selectors type through the pure
twins (``_wire_py``, ``_heap_py``).

An installed package is checked with ``-p factstream`` rather than by path: given
a directory inside site-packages, mypy would make site-packages a source root and
then trip over (or type-check) every third-party module in it.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import factstream
from conftest import require

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"


def test_mypy_strict_is_clean() -> None:
    require(module="mypy", how="pip install 'factstream[dev]' (or pip install 'mypy>=1.10')")
    package = Path(factstream.__file__).resolve().parent
    site_dirs = {Path(d).resolve() for d in [*site.getsitepackages(), site.getusersitepackages()]}
    target = ["-p", "factstream"] if package.parent in site_dirs else [str(package)]
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}  # -p must find the installed copy
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), *target],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, (
        f"mypy {package} (config {CONFIG}) exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    )
