"""The one place that decides between the compiled core and the pure twins.

All compiled modules load or none do, so a process never mixes halves.
``FACTSTREAM_NO_EXTENSIONS=1`` forces the pure-Python twins.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["IMPL", "NO_EXTENSIONS", "COMPILED_MODULES", "load"]

#: Compiled module -> its pure-Python twin.
COMPILED_MODULES: dict[str, str] = {
    "_wire_c": "_wire_py",
    "_heap_c": "_heap_py",
    "_archive_c": "_archive_py",
    "_relay_c": "_relay_py",
}

NO_EXTENSIONS: bool = os.environ.get("FACTSTREAM_NO_EXTENSIONS", "") not in ("", "0")


def _try_compiled() -> bool:
    found = []
    for name in COMPILED_MODULES:
        try:
            importlib.import_module(f"factstream.{name}")
        except ImportError:
            continue
        found.append(name)
    if found and len(found) != len(COMPILED_MODULES):
        missing = sorted(set(COMPILED_MODULES) - set(found))
        raise ImportError(
            f"factstream is partly compiled (missing {', '.join(missing)}); reinstall it, "
            "or set FACTSTREAM_NO_EXTENSIONS=1 to use the pure-Python implementation"
        )
    return bool(found)


IMPL: str = "python" if NO_EXTENSIONS or not _try_compiled() else "c"


def load(twin: str, impl: str | None = None) -> ModuleType:
    """The module implementing ``twin`` (e.g. ``"_wire"``) for ``impl`` ("c" or "python")."""
    impl = impl or IMPL
    suffix = {"c": "_c", "python": "_py", "py": "_py"}[impl]
    return importlib.import_module(f"factstream.{twin}{suffix}")
