"""Build step for factstream's compiled core.

Only the extension modules live here; metadata is in pyproject.toml.
Every ``csrc/factstream/*.pyx`` becomes ``factstream.<name>``.

``FACTSTREAM_NO_EXTENSIONS=1`` skips the compiled modules (pure-Python build).
A build that was asked for extensions and cannot compile them fails loudly.

Build switches (environment variables, as asyncpg has them):

- ``FACTSTREAM_CYTHON_TRACE=1``: line tracing in the compiled modules, so that
  coverage.py (with the Cython plugin) can measure which ``.pyx`` lines ran.
  Much slower; never for a release.
- ``FACTSTREAM_CYTHON_ANNOTATE=1``: write Cython's HTML annotation next to the
  generated C (``build/cython/...html``): yellow lines call into CPython.
- ``FACTSTREAM_DEBUG=1``: ``-O0 -g`` and C asserts kept, for gdb and sanitizers.
- ``FACTSTREAM_NO_SIMD=1``: the codec's portable byte loops instead of its SSE2
  scanning (what a machine without SSE2 builds anyway); tests use it to check
  that path on x86-64.
"""

from __future__ import annotations

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
def _switch(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


NO_EXTENSIONS = _switch("FACTSTREAM_NO_EXTENSIONS")
CYTHON_TRACE = _switch("FACTSTREAM_CYTHON_TRACE")
CYTHON_ANNOTATE = _switch("FACTSTREAM_CYTHON_ANNOTATE")
DEBUG = _switch("FACTSTREAM_DEBUG")
NO_SIMD = _switch("FACTSTREAM_NO_SIMD")

HINT = (
    "factstream: building the Cython extensions failed ({err}).\n"
    "  Install a C and C++ compiler and the Python headers (e.g. 'apt install gcc g++ python3-dev'),\n"
    "  or build the pure-Python package instead: FACTSTREAM_NO_EXTENSIONS=1 pip install ."
)


class LoudBuildExt(build_ext):
    """Turn compiler failures into one clear message instead of a silent fallback."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - re-raised with a hint
            sys.stderr.write(HINT.format(err=err) + "\n")
            raise SystemExit(1) from err

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001 - re-raised with a hint
            sys.stderr.write(HINT.format(err=err) + "\n")
            raise SystemExit(1) from err


def extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as err:
        sys.stderr.write(HINT.format(err="Cython is not installed") + "\n")
        raise SystemExit(1) from err
    # csrc/ mirrors the package: csrc/factstream/ids/_heap_c.pyx -> factstream.ids._heap_c
    sources = sorted(glob.glob(os.path.join("csrc", "factstream", "**", "*.pyx"), recursive=True))
    macros = [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")] if CYTHON_TRACE else []
    if NO_SIMD:
        macros.append(("FACTSTREAM_NO_SIMD", "1"))
    compile_args = ["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3"]
    exts = [
        Extension(
            os.path.splitext(os.path.relpath(src, "csrc"))[0].replace(os.sep, "."),
            [src],
            extra_compile_args=compile_args,
            define_macros=macros,
        )
        for src in sources
    ]
    # No global boundscheck/wraparound: each module or function that indexes Python
    # sequences in a hot loop turns them off itself, where its loop keeps indices in range
    # (pointer indexing, most of the codec, is never checked anyway).
    directives = {
        "language_level": "3",
        "cdivision": True,
        "embedsignature": True,
    }
    if CYTHON_TRACE:
        directives.update(linetrace=True, binding=True)
    return cythonize(
        exts,
        include_path=["csrc"],
        build_dir=os.path.join("build", "cython"),
        compiler_directives=directives,
        annotate=CYTHON_ANNOTATE,
        force=CYTHON_TRACE or DEBUG,
        quiet=True,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": LoudBuildExt})
