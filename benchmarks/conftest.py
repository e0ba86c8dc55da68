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
