"""The one place that decides between the compiled core and the pure twins.

All compiled modules load or none do, so a process never mixes halves.

- ``FACTSTREAM_IMPL=c``: the compiled core or nothing; a missing or broken
  compiled module is an ``ImportError`` that says which one and why.
- ``FACTSTREAM_IMPL=python`` (or ``FACTSTREAM_NO_EXTENSIONS=1``): the pure
  twins, even when the compiled core is installed.
- unset: the compiled core when it imports; otherwise the pure twins, and why
  the compiled core did not load is kept in :data:`FALLBACK_REASON` and logged
  (at debug when it is simply not installed, at warning when it is installed
  but fails to import).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from types import ModuleType

__all__ = ["IMPL", "NO_EXTENSIONS", "REQUESTED_IMPL", "FALLBACK_REASON", "COMPILED_MODULES", "load"]

logger = logging.getLogger("factstream")

#: Compiled module -> its pure-Python twin.
COMPILED_MODULES: dict[str, str] = {
    "_wire_c": "_wire_py",
    "ids._heap_c": "ids._heap_py",
    "spark._archive_c": "spark._archive_py",
    "replication._relay_c": "replication._relay_py",
}

NO_EXTENSIONS: bool = os.environ.get("FACTSTREAM_NO_EXTENSIONS", "") not in ("", "0")

_IMPL_NAMES = {"": "", "c": "c", "python": "python", "py": "python"}


def _requested() -> str:
    raw = os.environ.get("FACTSTREAM_IMPL", "")
    try:
        wanted = _IMPL_NAMES[raw.strip().lower()]
    except KeyError:
        raise ImportError(f"FACTSTREAM_IMPL={raw!r} is not an implementation: use 'c' or 'python' (or leave it unset)") from None
    if wanted == "c" and NO_EXTENSIONS:
        raise ImportError("FACTSTREAM_IMPL=c contradicts FACTSTREAM_NO_EXTENSIONS=1: unset one of them")
    return "python" if NO_EXTENSIONS else wanted


#: What the environment asked for: "c", "python", or "" (whichever imports).
REQUESTED_IMPL: str = _requested()

#: Why the compiled core is not in use when it was not switched off ("" when it is, or was switched off).
FALLBACK_REASON: str = ""


def _import_compiled(name: str) -> ModuleType:
    """Import the compiled module ``factstream.<name>`` without running its package's ``__init__``.

    The twins live with their subsystems (``ids._heap_c``), and a subsystem's
    ``__init__`` imports its selector, which asks this module for ``IMPL``:
    importing the package from here, while ``IMPL`` is being decided, would be
    a circular import. So the extension is loaded from its file and entered
    in ``sys.modules``, where the normal import finds it later.
    """
    full = f"factstream.{name}"
    if full in sys.modules:
        return sys.modules[full]
    *package, leaf = name.split(".")
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), *package)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, leaf + suffix)
        if os.path.exists(path):
            break
    else:
        raise ModuleNotFoundError(f"No module named {full!r}", name=full)
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:  # pragma: no cover - an extension file always has a loader
        raise ImportError(f"cannot load {path}", name=full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


def _try_compiled(required: bool) -> bool:
    """Import every compiled module; True if all did, False if none is installed (or one is broken and not required)."""
    global FALLBACK_REASON
    found: list[str] = []
    missing: dict[str, ImportError] = {}
    for name in COMPILED_MODULES:
        try:
            _import_compiled(name)
        except ImportError as err:
            missing[name] = err
        else:
            found.append(name)
    if not missing:
        return True
    reasons = "; ".join(f"factstream.{name}: {type(err).__name__}: {err}" for name, err in missing.items())
    first = next(iter(missing.values()))
    if required:
        raise ImportError(
            f"FACTSTREAM_IMPL=c but the compiled core cannot be imported ({reasons}); "
            "reinstall factstream from a compiled wheel, or unset FACTSTREAM_IMPL to allow the pure-Python twins"
        ) from first
    if found:
        raise ImportError(
            f"factstream is partly compiled ({reasons}); reinstall it, "
            "or set FACTSTREAM_NO_EXTENSIONS=1 to use the pure-Python implementation"
        ) from first
    FALLBACK_REASON = reasons
    not_installed = all(
        isinstance(err, ModuleNotFoundError) and err.name == f"factstream.{name}" for name, err in missing.items()
    )
    if not_installed:
        logger.debug("factstream: compiled core not installed, using the pure-Python twins (%s)", reasons)
    else:
        logger.warning("factstream: compiled core installed but not importable, using the pure-Python twins (%s)", reasons)
    return False


IMPL: str = "python" if REQUESTED_IMPL == "python" or not _try_compiled(REQUESTED_IMPL == "c") else "c"


def load(twin: str, impl: str | None = None) -> ModuleType:
    """The module implementing ``twin`` (e.g. ``"_wire"``) for ``impl`` ("c" or "python")."""
    impl = impl or IMPL
    suffix = {"c": "_c", "python": "_py", "py": "_py"}[impl]
    return importlib.import_module(f"factstream.{twin}{suffix}")
