"""Ship factstream, compiled core included, to executors whose Python lacks it.

``--py-files`` cannot carry a compiled extension (Python does not import
``.so`` files from a zip), and a packed virtualenv (venv-pack) still needs the
driver's base interpreter at the same path on every worker. What we ship
instead is a *site-packages overlay*: the installed files of factstream and
of what executors import (its requirements and pyarrow), copied file by file
from the driver's installation as their ``RECORD`` lists them, in one zip.
Spark distributes it with ``spark.archives`` and unpacks it into each
executor's working directory as ``factstream_env/``; ``PYTHONPATH`` points
the executors' Python there. The workers' own Python runs it (``python3`` on
their PATH, or ``--executor-python``); it must be the same CPython minor
version and platform as the driver's, because the compiled core and pyarrow
are built for one ABI. Nothing is downloaded: the overlay is what the driver
runs, so driver and executors parse with the same code.

The zip is cached under ``~/.cache/factstream/`` keyed by a hash of the
``RECORD`` files (which hold every file's sha256), so it is rebuilt only when
an installed distribution changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig
import zipfile
from importlib import metadata

__all__ = ["EXECUTOR_DISTRIBUTIONS", "ENV_DIR", "overlay_distributions", "pack_executor_env", "ship_settings"]

#: What executors import besides factstream's own requirements.
EXECUTOR_DISTRIBUTIONS = ("factstream", "pyarrow")

#: Directory name the archive is unpacked to in each executor's working directory.
ENV_DIR = "factstream_env"

# Provided by the cluster's Spark (pyspark.zip, py4j on the executors' PYTHONPATH), never shipped.
_NOT_SHIPPED = {"pyspark", "py4j"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def overlay_distributions(roots: tuple[str, ...] = EXECUTOR_DISTRIBUTIONS) -> list[metadata.Distribution]:
    """``roots`` and, recursively, their unconditional requirements that are installed."""
    seen: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        raw, extras = todo.pop()
        name = _canonical(raw)
        if (name, extras) in done or name in _NOT_SHIPPED:
            continue
        done.add((name, extras))
        try:
            dist = seen.get(name) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-specific requirement not installed here
        seen[name] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            wanted = re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if wanted and not set(wanted) & extras:
                continue
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", spec)
            if match:
                req_extras = frozenset(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
                todo.append((match.group(1), req_extras))
    return [seen[k] for k in sorted(seen)]


def _files(dist: metadata.Distribution) -> list[tuple[str, str]]:
    """(absolute path, path inside site-packages) of every installed file of ``dist``."""
    out = []
    for f in dist.files or []:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel:
            continue  # scripts in bin/, byte code (rebuilt on the executors)
        path = str(f.locate())
        if os.path.isfile(path):
            out.append((path, rel))
    return out


def pack_executor_env(dest_dir: str | None = None) -> str:
    """Build (or reuse) the overlay zip and return its path.

    ``dest_dir`` defaults to ``~/.cache/factstream``. Files are stored, not
    deflated: the zip crosses a network once per executor and is unpacked at
    disk speed.
    """
    dists = overlay_distributions()
    if not any(_canonical(d.metadata["Name"]) == "factstream" for d in dists):
        raise RuntimeError("factstream is not installed as a distribution (pip install it) and cannot be shipped")
    digest = hashlib.sha256(f"{sys.version_info[:2]}{sysconfig.get_platform()}".encode())
    for dist in dists:
        digest.update(dist.metadata["Name"].encode() + dist.version.encode())
        digest.update((dist.read_text("RECORD") or "").encode())
    dest_dir = dest_dir or os.path.join(os.path.expanduser("~"), ".cache", "factstream")
    os.makedirs(dest_dir, exist_ok=True)
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    path = os.path.join(dest_dir, f"factstream-executor-env-{py}-{digest.hexdigest()[:16]}.zip")
    if os.path.exists(path):
        return path
    tmp = f"{path}.{os.getpid()}.part"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for dist in dists:
            for src, rel in _files(dist):
                zf.write(src, rel)
    os.replace(tmp, path)
    return path


def ship_settings(archive: str, executor_python: str = "python3") -> dict[str, str]:
    """Spark settings that ship ``archive`` and make executors run ``executor_python`` on it."""
    uri = archive if "://" in archive else "file://" + os.path.abspath(archive)
    return {
        "spark.archives": f"{uri}#{ENV_DIR}",
        "spark.executorEnv.PYTHONPATH": ENV_DIR,
        "spark.pyspark.python": executor_python,
        "spark.executorEnv.PYSPARK_PYTHON": executor_python,
    }
