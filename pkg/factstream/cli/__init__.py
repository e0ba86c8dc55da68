"""The ``factstream`` command line. Each subcommand lives in its own module
with ``register(subparsers)``; the module list below is the whole CLI."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Subcommand modules, in the order --help lists them.
SUBCOMMANDS: tuple[str, ...] = ("decode", "demo", "events-demo", "serve", "tail", "positions", "logs", "synapse")


def build_parser() -> argparse.ArgumentParser:
    import factstream

    parser = argparse.ArgumentParser(
        prog="factstream",
        description="Streams of facts and their replication between processes (Synapse-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"factstream {factstream.__version__} ({factstream.IMPL})")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{name.replace('-', '_')}":
                continue  # subcommand not part of this build
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``factstream`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
