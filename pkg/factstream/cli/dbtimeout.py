"""``--db-timeout SECONDS``: the option of the commands that read a database (positions, tail --db, synapse).

The deadline itself (cancel, then cut, a database that has not answered) is
:mod:`factstream.store.deadline`; this module is its command-line face, and
passes the rest through so that a command imports one name.
"""

from __future__ import annotations

import argparse

from ..store.deadline import (
    CANCEL_WAIT,
    DEFAULT,
    NoAnswer,
    QueriesWithin,
    bounded_url,
    watch,
    within,
    within_thread,
    within_thread_async,
)
from .argtypes import duration

__all__ = ["CANCEL_WAIT", "DEFAULT", "NoAnswer", "QueriesWithin", "add_option", "bounded_url", "seconds", "watch",
           "within", "within_thread", "within_thread_async"]


def add_option(parser: argparse.ArgumentParser, applies: str = "", note: str = "") -> None:
    """The ``--db-timeout`` option (None when not given: a command may refuse it without a database).

    ``applies`` starts its help ("with --db: "), ``note`` ends it.
    """
    parser.add_argument(
        "--db-timeout", type=duration(), default=None, metavar="SECONDS",
        help=f"{applies}give up when the database has not answered after this long (default {DEFAULT:g}: a table "
             f"locked by a migration, a server that stopped answering){note}")


def seconds(given: float | None) -> float:
    """The --db-timeout to apply: the value given, else the default."""
    return DEFAULT if given is None else given
