"""``factstream events-demo``: the room event store feeding the events stream, verified."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from ..demo import events as demo

    p = subparsers.add_parser(
        "events-demo",
        help="persist room events on a writer while reader processes answer 'new events for user', and verify",
        description=demo.__doc__.split("\n\n", 2)[2] if demo.__doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import events as demo

    return demo.run(args)
