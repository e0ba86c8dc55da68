"""Shared benchmark fixtures: the implementation twins, reused from tests/conftest.py.

Every benchmark that has a compiled and a pure twin takes ``impl`` and so
reports both rows side by side; ``benchmarks/ratios.py`` turns a
``--benchmark-json`` file into speed-up ratios per group.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import IMPL_PARAMS, twin  # noqa: E402

# Service fixtures (postgres_dsn, redis_url, ...) are shared with the tests.
from conftest import channel_prefix, postgres_dsn, redis_url  # noqa: E402,F401


@pytest.fixture(params=IMPL_PARAMS, scope="session")
def impl(request: pytest.FixtureRequest) -> str:
    """Implementation name, "c" or "py"."""
    return str(request.param)


@pytest.fixture(scope="session")
def wire_impl(impl: str) -> ModuleType:
    return twin("_wire", impl)
