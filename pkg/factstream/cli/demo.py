"""``factstream demo``: the main job on the embedded default."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the demonstration job",
        description="Decode the sample replication log shipped inside the package.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def sample_log_path() -> str:
    """Path of the sample replication log that ships inside the package."""
    return str(resources.files("factstream") / "data" / "sample.log")


def run(args: argparse.Namespace) -> int:
    from . import decode

    path = sample_log_path()
    print(f"factstream demo: decoding {path}", file=sys.stderr)
    status = decode.run(argparse.Namespace(files=[path], json=args.json, max_errors=100))
    # The sample deliberately holds bad lines; finding them is success.
    return 0 if status in (0, 1) else status
