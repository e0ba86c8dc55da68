"""The test suite's own rule: a missing prerequisite skips locally, and fails under CI=true.

Runs a small pytest session in a subprocess whose tests ``require()`` things
that do not exist, once as a developer would and once as CI does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require

TESTS = Path(__file__).resolve().parent

NEEDS = '''
from conftest import require

def test_module():
    require(module="factstream_no_such_module", how="pip install nothing")

def test_binary():
    require(binary="factstream-no-such-tool", how="apt-get install nothing")

def test_service():
    require(service="Nothing", at=("127.0.0.1", {port}), how="start nothing")
'''

MODULE_LEVEL = '''
from conftest import require

pa = require(module="factstream_no_such_module", how="pip install nothing")

def test_uses_it():
    assert pa
'''


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when we return


def _pytest(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -rsf -p no:cacheprovider -p no:randomly --continue-on-collection-errors\n"
                                        "asyncio_default_fixture_loop_scope = function\n")
    (tmp_path / "test_needs.py").write_text(NEEDS.format(port=_closed_port()))
    (tmp_path / "test_module_level.py").write_text(MODULE_LEVEL)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_missing_prerequisites_skip_with_their_reason_locally(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 skipped" in proc.stdout
    assert "'factstream-no-such-tool' is not on PATH; apt-get install nothing" in proc.stdout
    assert "Python module 'factstream_no_such_module' is not installed" in proc.stdout
    assert "Nothing is not reachable at 127.0.0.1:" in proc.stdout


def test_missing_prerequisites_fail_under_ci(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, ci=True)
    assert proc.returncode != 0
    assert "skipped" not in proc.stdout
    assert "3 failed" in proc.stdout and "1 error" in proc.stdout  # the module-level need fails its collection
    assert proc.stdout.count("CI=true: a missing prerequisite is a failure, not a skip") >= 4


def test_require_returns_what_it_found() -> None:
    assert require(module="json", how="-").__name__ == "json"
    assert Path(require(binary=Path(sys.executable).name if os.sep not in sys.executable else "sh", how="-")).exists()
    with pytest.raises(TypeError):
        require(how="nothing asked")  # type: ignore[call-overload]


@pytest.mark.parametrize("binary", ["redis-server", "redis-cli", "openssl", "java"])
def test_the_machine_has_the_tools_the_suite_uses(binary: str) -> None:
    # The tools other tests start themselves; `make prerequisites` installs them.
    assert Path(require(binary=binary, how="make prerequisites")).exists()
