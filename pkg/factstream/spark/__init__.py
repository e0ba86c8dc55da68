"""Bulk analysis of archived replication traffic with PySpark.

Nothing here imports pyspark at import time: ``import factstream.spark`` is
cheap, and the heavy modules load on first use of the names below. Install
the ``spark`` extra (pyspark, pyarrow, pandas, matplotlib) and Java 17.

>>> from factstream.spark import make_session, parse_archives   # doctest: +SKIP
>>> spark = make_session("local[*]")                            # doctest: +SKIP
>>> df = parse_archives(spark, ["/var/log/replication/*.log.gz"])  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "FORMATS",
    "make_session",
    "parse_archives",
    "write_parquet",
    "build_report",
    "render_text",
    "render_chart",
    "ParseOptions",
]

# public name -> submodule defining it
_LAZY = {
    "FORMATS": "formats",
    "ParseOptions": "lines",
    "make_session": "session",
    "parse_archives": "pipeline",
    "write_parquet": "pipeline",
    "build_report": "report",
    "render_text": "report",
    "render_chart": "chart",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
