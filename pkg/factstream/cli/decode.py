"""``factstream decode``: read replication lines, report what they contain."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import IO, Any, cast

from .. import wire
from ..errors import ProtocolError


def sample_log_path() -> str:
    """Path of the sample replication log that ships inside the package."""
    return str(resources.files("factstream") / "data" / "sample.log")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "decode",
        help="decode replication lines from files or stdin and summarise them",
        description=(
            "Read replication protocol lines (one per line, as on the TCP wire or a Redis "
            "channel) and print per-command and per-stream counts, token ranges and every bad "
            "line with its line number and reason. Files ending in .gz are decompressed. "
            "Exit status 1 if any line was bad. Try it on the sample that ships with the package: "
            "factstream decode --sample."
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="files to read ('-' or nothing for stdin)")
    p.add_argument("--sample", action="store_true", help="also read the sample log shipped inside the package")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--max-errors", type=int, default=100, metavar="N", help="list at most N bad lines (default 100)")
    p.set_defaults(func=run)


@dataclass
class StreamStats:
    rows: int = 0
    batch_rows: int = 0
    positions: int = 0
    min_token: int | None = None
    max_token: int | None = None

    def see(self, token: int) -> None:
        self.min_token = token if self.min_token is None else min(self.min_token, token)
        self.max_token = token if self.max_token is None else max(self.max_token, token)


@dataclass
class Summary:
    lines: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    streams: dict[tuple[str, str], StreamStats] = field(default_factory=dict)
    errors: list[tuple[str, int, str]] = field(default_factory=list)
    error_count: int = 0

    def add(self, cmd: wire.Command) -> None:
        self.commands[cmd.NAME] += 1
        if isinstance(cmd, (wire.RdataCommand, wire.PositionCommand)):
            stats = self.streams.setdefault((cmd.stream_name, cmd.instance_name), StreamStats())
            if isinstance(cmd, wire.RdataCommand):
                stats.rows += 1
                if cmd.token is None:
                    stats.batch_rows += 1
                else:
                    stats.see(cmd.token)
            else:
                stats.positions += 1
                stats.see(cmd.prev_token)
                stats.see(cmd.new_token)

    def as_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "commands": dict(sorted(self.commands.items())),
            "streams": [
                {"stream": s, "instance": i, **vars(st)} for (s, i), st in sorted(self.streams.items())
            ],
            "error_count": self.error_count,
            "errors": [{"file": f, "line": n, "reason": r} for f, n, r in self.errors],
        }


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    with _open(path) as fh:
        for number, line in enumerate(fh, 1):
            yield number, line.rstrip(b"\n")


def summarise(paths: list[str], max_errors: int = 100) -> Summary:
    """Parse every line of ``paths``; blank lines are skipped, bad ones recorded."""
    summary = Summary()
    parse = wire.parse_line
    for path in paths:
        for number, line in _lines(path):
            if not line.strip():
                continue
            summary.lines += 1
            try:
                summary.add(parse(line))
            except ProtocolError as err:
                summary.error_count += 1
                if len(summary.errors) < max_errors:
                    summary.errors.append((path, number, str(err)))
    return summary


def _print_text(summary: Summary, out: IO[str]) -> None:
    out.write(f"{summary.lines} lines, {summary.error_count} bad\n\ncommands:\n")
    for name, count in sorted(summary.commands.items()):
        out.write(f"  {name:<18}{count:>10}\n")
    if summary.streams:
        out.write("\nstreams:\n")
        out.write(f"  {'stream':<22}{'writer':<16}{'rows':>9}{'batch':>8}{'POSITION':>10}  tokens\n")
        for (stream, instance), st in sorted(summary.streams.items()):
            tokens = "-" if st.min_token is None else f"{st.min_token}..{st.max_token}"
            out.write(f"  {stream:<22}{instance:<16}{st.rows:>9}{st.batch_rows:>8}{st.positions:>10}  {tokens}\n")
    if summary.errors:
        out.write("\nbad lines:\n")
        for path, number, reason in summary.errors:
            out.write(f"  {path}:{number}: {reason}\n")
        if summary.error_count > len(summary.errors):
            out.write(f"  ... and {summary.error_count - len(summary.errors)} more\n")


def run(args: argparse.Namespace) -> int:
    paths = list(args.files) + ([sample_log_path()] if getattr(args, "sample", False) else [])
    paths = paths or ["-"]
    try:
        summary = summarise(paths, args.max_errors)
    except OSError as err:
        print(f"factstream decode: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(summary.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(summary, sys.stdout)
    return 1 if summary.error_count else 0
