"""Damaged gzip inputs (truncated, corrupt), named with the line after which they break.

A parse reads every byte of a damaged file up to the damage and then goes
on (one bad file kills no job); the driver still has to name the file. The
tasks that read it know: :class:`DamagedInputs` gathers what they met into
the driver (a Spark accumulator), so a healthy gzip input is decompressed
once, by the parse, not a second time to check it. Files the plan left out
(no format found in a head cut short) were never read by a task and are
checked on their own (:func:`gzip_problems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from .formats import READ_ERRORS
from .sources import gzip_problem, is_gzip

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DamagedInputs", "gzip_problems", "what_was_parsed"]


class _Extend(AccumulatorParam):  # type: ignore[type-arg]
    """Lists that tasks extend: (path, problem) pairs."""

    def zero(self, value: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return []

    def addInPlace(self, value1: list[tuple[str, str]], value2: list[tuple[str, str]]) -> list[tuple[str, str]]:
        value1.extend(value2)
        return value1


class DamagedInputs:
    """The damaged gzip inputs the tasks of one parse met: made before the action, read after it.

    Give it to :func:`.pipeline.parse_archives` (``damaged=``); after the
    action that ran the parse (a write, a count), :meth:`found` lists each
    damaged file once, with what is wrong and after which line, as
    :func:`.sources.gzip_problem` says it. A task run again (a retry, a
    second action on the same DataFrame) reports its file again: found
    keeps one.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._acc: Any = spark.sparkContext.accumulator([], _Extend())

    def add(self, path: str, problem: str) -> None:
        """Called in the task that met the damage."""
        self._acc.add([(path, problem)])

    def found(self) -> list[tuple[str, str]]:
        """(path, problem) of every damaged input met so far, sorted by path."""
        return sorted(dict(self._acc.value).items())


def gzip_problems(spark: SparkSession, files: Sequence[tuple[str, int]]) -> list[tuple[str, str]]:
    """(path, problem) of the gzip files (by content) among ``files`` that are truncated or corrupt, sorted.

    Each is read up to the length listed with it, in parallel by Spark: for
    files no parse reads (a parse reports its own through
    :class:`DamagedInputs`). Files gone since they were listed are left out
    (they are named where they were found missing).
    """
    gz = []
    for path, size in files:
        try:
            if is_gzip(path, size):
                gz.append((path, size))
        except READ_ERRORS:
            pass
    if not gz:
        return []
    sc = spark.sparkContext
    sc.setJobDescription("factstream: checking gzip inputs")
    try:
        found = sc.parallelize(gz, len(gz)).map(lambda f: (f[0], gzip_problem(f[0], f[1]))).collect()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    return sorted((path, problem) for path, problem in found if problem is not None)


def what_was_parsed(problem: str) -> str:
    """What to say after a parsed input's problem: its lines before the break were parsed, or it had none."""
    return "the lines before it were parsed" if " after line " in problem else "it holds no whole line"
