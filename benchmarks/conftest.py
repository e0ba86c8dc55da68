"""Shared benchmark fixtures: the implementation twins, reused from tests/conftest.py.

Every benchmark that has a compiled and a pure twin takes ``impl`` and so
reports both rows side by side; ``benchmarks/ratios.py`` turns a
``--benchmark-json`` file into speed-up ratios per group.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import impl, twin, wire_impl  # noqa: E402,F401 - the twins fixtures, shared

# Service fixtures (postgres_dsn, redis_url, ...) are shared with the tests.
from conftest import channel_prefix, postgres_dsn, redis_url  # noqa: E402,F401


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in ("factstream", "cython", "uvloop", "redis", "hiredis", "psycopg", "pyspark", "pyarrow", "nats-py"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


#: The load when the run began: pytest-benchmark asks for machine_info only when it writes the JSON.
_LOAD_AT_START: list[float] = []


def pytest_sessionstart(session: object) -> None:
    import os

    _LOAD_AT_START[:] = os.getloadavg()


def pytest_benchmark_update_machine_info(config: object, machine_info: dict[str, object]) -> None:
    """Record what a figure depends on: the implementation, versions, CPU and load."""
    import os

    import factstream

    machine_info["factstream_impl"] = factstream.IMPL
    machine_info["factstream_path"] = os.path.dirname(factstream.__file__)
    machine_info["versions"] = _versions()
    machine_info["cpu_model"] = _cpu_model()
    machine_info["cpu_count"] = os.cpu_count()
    machine_info["loadavg_start"] = list(_LOAD_AT_START or os.getloadavg())


def pytest_benchmark_update_json(config: object, benchmarks: object, output_json: dict[str, object]) -> None:
    """Every result carries the implementation it ran on, and the load at the end of the run."""
    import os

    import factstream

    info = output_json.get("machine_info")
    if isinstance(info, dict):
        info["loadavg_end"] = list(os.getloadavg())
    for bench in output_json.get("benchmarks", []):  # type: ignore[union-attr]
        bench.setdefault("extra_info", {}).setdefault("factstream_impl", factstream.IMPL)


def pytest_configure(config: object) -> None:
    """Refuse to measure the pure twins by accident (a clean checkout on PYTHONPATH=pkg)."""
    import os

    import factstream
    import pytest

    if factstream.IMPL != "c" and os.environ.get("FACTSTREAM_BENCH_ALLOW_PURE") != "1":
        raise pytest.UsageError(
            f"benchmarks need the compiled build, but factstream.IMPL is {factstream.IMPL!r} "
            f"(imported from {os.path.dirname(factstream.__file__)}); run 'make bench', "
            "or set FACTSTREAM_BENCH_ALLOW_PURE=1 to measure the pure build on purpose"
        )
