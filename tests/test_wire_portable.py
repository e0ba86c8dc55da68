"""The codec's portable path: built with ``FACTSTREAM_NO_SIMD=1``, the codec's own tests must pass on it.

On x86-64 the compiled codec scans strings sixteen bytes at a time with SSE2;
elsewhere (aarch64, or any compiler without SSE2) it uses byte and eight-byte
loops. Those loops would otherwise never run here, so this test compiles
``factstream._wire_c`` from this checkout's ``csrc/`` with the switch, then runs
the codec's test files against that module as the compiled twin (the pure
twin stays the reference they compare with).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import factstream

ROOT = Path(__file__).resolve().parent.parent

BUILD = r"""
import os, sys
from Cython.Build import cythonize
from setuptools import Extension
from setuptools.dist import Distribution

root, out = sys.argv[1], sys.argv[2]
os.chdir(root)
ext = Extension("factstream._wire_c", ["csrc/factstream/_wire_c.pyx"], extra_compile_args=["-O1"],
                define_macros=[("FACTSTREAM_NO_SIMD", "1")])
mods = cythonize([ext], include_path=["csrc"], build_dir=os.path.join(out, "cython"), quiet=True,
                 compiler_directives={"language_level": "3", "cdivision": True})
dist = Distribution({"ext_modules": mods})
cmd = dist.get_command_obj("build_ext")
cmd.build_lib = os.path.join(out, "lib")
cmd.build_temp = os.path.join(out, "tmp")
cmd.ensure_finalized()
cmd.run()
print(cmd.get_ext_fullpath("factstream._wire_c"))
"""


@pytest.mark.slow
@pytest.mark.c
def test_the_codec_tests_pass_on_the_portable_build(tmp_path: Path) -> None:
    if factstream.IMPL != "c":
        pytest.skip("the compiled core is switched off in this run")
    built = subprocess.run([sys.executable, "-c", BUILD, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    module = built.stdout.strip().splitlines()[-1]
    assert Path(module).is_file(), built.stdout
    env = {**os.environ, "FACTSTREAM_TEST_WIRE_C": module}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", "c",
         "tests/test_wire.py", "tests/test_wire_fuzz.py", "tests/test_wire_synapse.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    tail = run.stdout[-3000:]
    assert run.returncode == 0, tail + run.stderr[-2000:]
    summary = tail.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 100 and "skipped" not in summary and "deselected" in summary, tail
    print(summary)
