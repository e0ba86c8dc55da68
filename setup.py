"""Build step for factstream's compiled core.

Only the extension modules live here; metadata is in pyproject.toml.
Every ``csrc/factstream/*.pyx`` becomes ``factstream.<name>``.

``FACTSTREAM_NO_EXTENSIONS=1`` skips the compiled modules (pure-Python build).
A build that was asked for extensions and cannot compile them fails loudly.
"""

from __future__ import annotations

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
NO_EXTENSIONS = os.environ.get("FACTSTREAM_NO_EXTENSIONS", "") not in ("", "0")

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
    sources = sorted(glob.glob(os.path.join("csrc", "factstream", "*.pyx")))
    exts = [
        Extension(
            "factstream." + os.path.splitext(os.path.basename(src))[0],
            [src],
            extra_compile_args=["-O3"],
        )
        for src in sources
    ]
    return cythonize(
        exts,
        include_path=["csrc"],
        build_dir=os.path.join("build", "cython"),
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
        quiet=True,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": LoudBuildExt})
