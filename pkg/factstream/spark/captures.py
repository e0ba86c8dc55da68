"""Which files make up one capture, and in which order: the unit of sequence judging.

A recorder rotates a long capture into several files; judged file by file,
every rotation would look like a gap (the next file starts after tokens the
judge never saw) or an unterminated batch (a ``batch`` run cut by the
rotation). Files of one capture are therefore judged as one sequence, in file
order then line order.

By default the recorder's naming says it (docs/spark.md):
``<capture>.<UTC start YYYYmmddTHHMMSS[ffffff]Z>.<6-digit sequence>.log[.gz]``
(the part before the first '.' is the capture; files sort by start time, then
sequence). Other files are a capture of their own each, unless an explicit
``capture_pattern`` (a regular expression on the file's base name) says
otherwise: its group named ``capture`` (or its first group) names the
capture, an optional group named ``order`` orders the files (else the base
name does).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "DISCONNECTED", "RECORDER_PATTERN", "CapturePatternError", "check_pattern", "capture_columns", "pattern_matches",
]

#: The ``command`` logs parse gives a recorder's ``<ts> # disconnected <reason>`` line.
DISCONNECTED = "#disconnected"

#: Recorder file names (docs/spark.md, "Report"; written by ``factstream record``, cli/capture.py).
RECORDER_PATTERN = r"^(?P<capture>[^./]+)\.(?P<order>\d{8}T\d{6}\d{0,9}Z\.\d{6})\.log(?:\.gz)?$"


class CapturePatternError(ValueError):
    """A --capture-pattern that is not a usable regular expression."""


def check_pattern(pattern: str) -> tuple[str, int, int]:
    """(Java regex, capture group index, order group index or 0) for ``pattern``.

    Raises CapturePatternError naming the problem.
    """
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise CapturePatternError(f"--capture-pattern {pattern!r} is not a regular expression: {err}") from None
    if compiled.groups < 1:
        raise CapturePatternError(
            f"--capture-pattern {pattern!r} has no group; put the capture name in (?P<capture>...)"
        )
    for name in compiled.groupindex:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name):
            raise CapturePatternError(f"--capture-pattern group name {name!r}: use letters and digits only")
    capture = compiled.groupindex.get("capture", 1)
    order = compiled.groupindex.get("order", 0)
    return pattern.replace("(?P<", "(?<"), capture, order


def pattern_matches(pattern: str, base_name: str) -> bool:
    """Whether ``pattern`` names a capture for a file of this base name (as :func:`capture_columns` matches it)."""
    _, cap_i, _ = check_pattern(pattern)
    found = re.search(pattern, base_name)
    return bool(found and found.group(cap_i))


def capture_columns(df: DataFrame, capture_pattern: str | None = None) -> DataFrame:
    """``df`` with ``capture`` (its capture's name) and ``file_order`` (sorts its files) columns.

    Files matching neither ``capture_pattern`` nor the recorder's naming are a
    capture of their own, named by their path.
    """
    from pyspark.sql import functions as F

    base = F.regexp_extract(F.col("source_file"), r"([^/]*)$", 1)
    capture = F.lit(None).cast("string")
    order = F.lit(None).cast("string")
    for pattern in ([capture_pattern] if capture_pattern else []) + [RECORDER_PATTERN]:
        java, cap_i, order_i = check_pattern(pattern)
        matched = base.rlike(java) & (F.regexp_extract(base, java, cap_i) != "")
        capture = F.when(capture.isNull() & matched, F.regexp_extract(base, java, cap_i)).otherwise(capture)
        this_order = F.regexp_extract(base, java, order_i) if order_i else base
        order = F.when(order.isNull() & matched, this_order).otherwise(order)
    return df.withColumn("capture", F.coalesce(capture, F.col("source_file"))).withColumn(
        "file_order", F.concat_ws("/", F.coalesce(order, F.lit("")), F.col("source_file"))
    )
