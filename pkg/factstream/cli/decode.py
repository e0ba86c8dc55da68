"""``factstream decode``: read replication lines, report what they contain.

Reads every archive format ``logs parse`` reads (bare wire lines, the
recorder's timestamp/direction prefixes and ``#`` notes, redis-cli MONITOR,
``--csv`` and raw SUBSCRIBE output; gzip or plain), detected per input by the
same detector (:mod:`factstream.spark.formats`, which imports neither pyarrow
nor pyspark).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import shlex
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import IO, Any

from .. import wire
from ..errors import ProtocolError
from ..spark.formats import (
    ENDS_MID_LINE, MAGIC_BYTES, NOTE, READ_ERRORS, compression_of, detect_format, payloads, read_problem,
    unsupported_compression, without_bom,
)
from ..spark.gunzip import GunzipRaw
from .argtypes import whole_number

#: Lines read ahead of parsing to detect an input's format.
HEAD_LINES = 200


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
            "line with its line number and reason. Reads what 'logs parse' reads, format "
            "detected per input: bare wire lines, lines prefixed with an ISO-8601 timestamp "
            "and direction (what 'factstream record' writes; its '#' notes count as "
            "#disconnected/#connected), redis-cli MONITOR, --csv and raw SUBSCRIBE output. "
            "gzip input (a file or stdin) is decompressed, whatever its name. A last line without a newline is bad "
            "(the file was cut, or is still being written). Exit status 1 if any line was bad, 2 if an "
            "input could not be read (missing, truncated or corrupt gzip, not an archive); the "
            "other inputs are still read. Try it on the sample that ships with the package: "
            "factstream decode --sample."
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="files to read ('-' for stdin, at most once; nothing and no --sample: stdin); for a directory "
                   "use 'factstream logs parse DIR'")
    p.add_argument("--sample", action="store_true",
                   help="read the sample log shipped inside the package, after the FILEs given (stdin only if '-' is one)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--max-errors", type=whole_number(0), default=100, metavar="N", help="list at most N bad lines (default 100)")
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
    #: per input: (path, format or None, problem reading it or None)
    inputs: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    @property
    def bad_inputs(self) -> list[tuple[str, str]]:
        """(path, problem) of every input that could not be read to its end."""
        return [(path, problem) for path, _, problem in self.inputs if problem is not None]

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
            "inputs": [{"file": f, "format": fmt, "problem": p} for f, fmt, p in self.inputs],
        }


class _NotRead(Exception):
    """An input that is not read at all (compressed with something other than gzip): the reason."""


def _open(path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """``path`` ('-': stdin, left open) for reading, decompressed if it starts like gzip, whatever its name.

    Raises _NotRead for other compressions (xz, bzip2, zstd ...): read as text they are lines of garbage.
    """
    if path == "-":
        stdin = sys.stdin.buffer
        head = stdin.peek(MAGIC_BYTES)[:MAGIC_BYTES] if isinstance(stdin, io.BufferedReader) else b""
        kind = compression_of(head)
        if kind == "gzip":
            return _gunzipped(stdin, close=False)
        if kind is not None:
            raise _NotRead(unsupported_compression(kind, "-"))
        return contextlib.nullcontext(stdin)
    fh = open(path, "rb")
    try:
        kind = compression_of(fh.read(MAGIC_BYTES))
        fh.seek(0)
    except OSError:
        fh.close()
        raise
    if kind == "gzip":
        return _gunzipped(fh)
    if kind is not None:
        fh.close()
        raise _NotRead(unsupported_compression(kind, path))
    return fh


@contextlib.contextmanager
def _gunzipped(src: IO[bytes], close: bool = True) -> Iterator[IO[bytes]]:
    """``src`` decompressed as far as it goes: a truncated or corrupt gzip input ends where it breaks.

    Every byte before the break is given (the last line of a file cut short
    too); :func:`_damage` then says what broke. ``src`` is closed afterwards if ``close``.
    """
    try:
        yield io.BufferedReader(GunzipRaw(src.read), buffer_size=1 << 20)
    finally:
        if close:
            src.close()


def _damage(fh: IO[bytes]) -> BaseException | None:
    """Why a gzip input read by :func:`_gunzipped` ended before the end of its last member, if it did."""
    raw = getattr(fh, "raw", None)
    return raw.gunzip.error if isinstance(raw, GunzipRaw) else None


class _Lines:
    """The lines of an open input without their newlines, counting how many were read.

    A last line without a newline (the input was cut, or is still being
    written) is not given out: it is kept in ``cut`` as (line number, bytes),
    for it is no line yet (a token cut short can look valid). A UTF-8
    byte-order mark at the start of the input is no part of line 1 (as in
    ``logs parse``): an input of nothing else has no line.
    """

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.count = 0
        self.cut: tuple[int, bytes] | None = None

    def __iter__(self) -> Iterator[bytes]:
        for line in self.fh:
            if self.count == 0:
                line = without_bom(line)
                if not line:  # the input held the mark and nothing else
                    return
            if not line.endswith(b"\n"):  # only the last line can lack one
                self.cut = (self.count + 1, line)
                return
            self.count += 1
            line = line[:-1]
            yield line[:-1] if line.endswith(b"\r") else line  # CRLF ends a line too (see spark.lines)


_READ_ERRORS = READ_ERRORS
_read_problem = read_problem


def _summarise_one(path: str, summary: Summary, max_errors: int) -> None:
    parse = wire.parse_line
    fmt: str | None = None
    lines: _Lines | None = None
    try:
        with _open(path) as fh:
            lines = _Lines(fh)
            it = iter(lines)
            head = list(itertools.islice(it, HEAD_LINES))
            fmt = detect_format(head + [lines.cut[1]] if lines.cut else head)  # what it looks like, cut or not
            if fmt is None:
                damage = _damage(fh)  # a gzip input cut before its first lines is no archive yet: say why
                summary.inputs.append((path, None, _read_problem(damage, lines.count) if damage is not None
                                       else "not a replication archive (no line in a known format)"))
                return
            for number, payload, _ts, direction, _channel, problem in payloads(itertools.chain(head, it), fmt):
                summary.lines += 1
                if problem is None and direction == NOTE:  # a recorder note, e.g. "#disconnected"
                    summary.commands["#" + payload.split(b" ", 1)[0].decode("utf-8", "replace")] += 1
                    continue
                try:
                    if problem is not None:
                        raise ProtocolError(problem)
                    summary.add(parse(payload))
                except ProtocolError as err:
                    summary.error_count += 1
                    if len(summary.errors) < max_errors:
                        summary.errors.append((path, number, str(err)))
            damage = _damage(fh)
            # A gzip input damaged inside a line (not cut short) ends in no line: left out, as 'logs parse' does.
            if lines.cut is not None and (damage is None or isinstance(damage, EOFError)):
                # never parsed: 'logs parse' makes it a malformed row, with the same reason
                summary.lines += 1
                summary.error_count += 1
                if len(summary.errors) < max_errors:
                    summary.errors.append((path, lines.cut[0], _ends_mid_line(path)))
            if damage is not None:  # truncated or corrupt gzip: every line before the break was read
                summary.inputs.append((path, fmt, _read_problem(damage, lines.count)))
                return
    except _NotRead as err:
        summary.inputs.append((path, None, str(err)))
        return
    except _READ_ERRORS as err:
        summary.inputs.append((path, fmt, _read_problem(err, lines.count if lines is not None else 0)))
        return
    summary.inputs.append((path, fmt, None))


def _ends_mid_line(path: str) -> str:
    return ENDS_MID_LINE.replace("the file", "the input", 1) if path == "-" else ENDS_MID_LINE


def summarise(paths: list[str], max_errors: int = 100) -> Summary:
    """Parse every line of ``paths``; blank lines are skipped, bad ones recorded.

    An input that cannot be read to its end (missing, truncated or corrupt
    gzip, not an archive) is recorded in ``inputs`` with what went wrong and
    where; the others are still read.
    """
    summary = Summary()
    for path in paths:
        _summarise_one(path, summary, max_errors)
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
    if summary.bad_inputs:
        out.write("\ninputs not read to the end:\n")
        for path, problem in summary.bad_inputs:
            out.write(f"  {path}: {problem}\n")


def run(args: argparse.Namespace) -> int:
    if args.files.count("-") > 1:
        print(f"factstream decode: '-' (stdin) given {args.files.count('-')} times; stdin can be read once: "
              "give '-' once", file=sys.stderr)
        return 2
    paths = list(args.files) + ([sample_log_path()] if getattr(args, "sample", False) else [])
    paths = paths or ["-"]
    folders = [path for path in paths if path != "-" and os.path.isdir(path)]
    if folders:
        # decode reads files (no Spark, no pyarrow); walking a directory tree, with its links, hidden
        # directories and non-archives, is what 'logs parse' does: say so before reading anything.
        them = " ".join(map(shlex.quote, folders))
        first = shlex.quote(folders[0].rstrip("/"))
        print(f"factstream decode: {', '.join(folders)}: {'a directory' if len(folders) == 1 else 'directories'}; "
              f"decode reads files: name the files (factstream decode {first}/*.log), or parse "
              f"every archive in {'it' if len(folders) == 1 else 'them'} with Spark "
              f"(factstream logs parse {them} --out PARQUET_DIR)", file=sys.stderr)
        return 2
    summary = summarise(paths, args.max_errors)
    for path, problem in summary.bad_inputs:
        print(f"factstream decode: {path}: {problem}", file=sys.stderr)
    if args.json:
        json.dump(summary.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(summary, sys.stdout)
    if summary.bad_inputs:
        return 2
    return 1 if summary.error_count else 0
