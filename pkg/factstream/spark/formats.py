"""Archive formats: what a file of captured replication traffic looks like, and its payloads.

One detector and one splitter for every reader of archives: ``logs parse``
(through :mod:`.lines`, which turns the payloads into columns) and
``factstream decode``. Kept free of pyarrow and pyspark (only ``re``), so the
CLI's ``--help`` and ``decode`` stay light.

Formats (``FORMATS``; ``FORMATS_HELP`` is the user's version):

``lines``
    one protocol line per line, optionally prefixed by an ISO-8601 timestamp
    and/or a direction marker (``>`` server to client, ``<`` client to
    server): ``2026-11-22T01:02:03.456Z > RDATA events master 5 [...]``. The
    direction ``#`` after a timestamp marks a recorder note
    (``<ts> # disconnected <reason>``), never a wire line.
``monitor``
    ``redis-cli MONITOR`` output: ``<unix-time> [db addr] "PUBLISH" "<channel>" "<payload>"``.
``redis-csv``
    ``redis-cli --csv SUBSCRIBE``/``PSUBSCRIBE`` output: ``"message","<channel>","<payload>"``.
``redis-raw``
    ``redis-cli SUBSCRIBE`` piped to a file: ``message``, channel and payload on
    three lines (records span lines, so such files are never split).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable, Iterator

__all__ = [
    "FORMATS",
    "FORMATS_HELP",
    "GZIP_MAGIC",
    "MAGIC_BYTES",
    "compression_of",
    "ENDS_MID_LINE",
    "unsupported_compression",
    "NOTE",
    "Payload",
    "detect_format",
    "payloads",
    "read_problem",
    "READ_ERRORS",
    "redis_unquote",
    "split_csv",
    "split_line",
    "split_monitor",
    "UTF8_BOM",
    "without_bom",
]

#: Archive formats understood by the parser; "auto" sniffs each file.
FORMATS: tuple[str, ...] = ("auto", "lines", "monitor", "redis-csv", "redis-raw")

FORMATS_HELP = """\
  lines      one protocol line per line, optionally prefixed by an ISO-8601 timestamp
             and/or a direction marker ('>' server to client, '<' client to server;
             '#' a recorder note such as '<ts> # disconnected <reason>'):
             2026-11-22T01:02:03.456Z > RDATA events master 54 ["ev",[...]]
  monitor    redis-cli MONITOR output: <unix time> [db addr] "PUBLISH" "<channel>" "<payload>"
  redis-csv  redis-cli --csv SUBSCRIBE/PSUBSCRIBE output: "message","<channel>","<payload>"
  redis-raw  redis-cli SUBSCRIBE piped to a file: message, channel, payload on three lines
  auto       detect the format of each file from its first lines (default); files whose
             format is not recognised (a MANIFEST.json, a README) are skipped with a warning
"""

#: The direction of a recorder note line (see docs/spark.md).
NOTE = b"#"

#: The problem of a file's last line when no newline ends it. A line exists only once its
#: newline arrives (the wire's LineDecoder holds an unterminated tail too): without it, a token
#: may be cut short and still look valid (``POSITION events master 1 12`` cut from ``123``).
ENDS_MID_LINE = "the file ends mid-line (no newline after its last line): cut short, or still being written"

#: (line number, protocol line, timestamp text, direction, channel, problem);
#: ``problem`` names what is wrong with the capture record itself, else None.
Payload = tuple[int, bytes, "bytes | None", "bytes | None", "bytes | None", "str | None"]

_PREFIX = re.compile(
    rb"(?:(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)(?: +|$))?(?:([<>#])(?: +|$))?"
)
_MONITOR = re.compile(rb'(\d+(?:\.\d+)?) \[[^\]]*\] (.*)')
_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}
# A protocol command name (what a `lines` archive's payloads start with).
_COMMAND = re.compile(rb"[A-Z][A-Z_]*(?: |$)")
_CSV_KINDS = (b'"message",', b'"pmessage",', b'"subscribe",', b'"psubscribe",', b'"smessage",', b'"ssubscribe",')
_RAW_KINDS = (b"subscribe", b"psubscribe", b"message", b"pmessage", b"ssubscribe", b"smessage")
_SUBSCRIBE_KINDS = (b"subscribe", b"psubscribe", b"ssubscribe", b"unsubscribe", b"punsubscribe")


def _unescape(match: re.Match[bytes]) -> bytes:
    code = match.group(1)
    if len(code) == 3:
        return bytes((int(code[1:], 16),))
    return _SIMPLE_ESCAPES.get(code, code)


def redis_unquote(text: bytes) -> bytes:
    """Undo redis-cli's quoting of one string (the body between the quotes)."""
    if b"\\" not in text:
        return text
    return _ESCAPE.sub(_unescape, text)


def _quoted_fields(text: bytes) -> list[bytes] | None:
    """The quoted, comma- or space-separated strings of a redis-cli line; None if it is not one."""
    fields = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _QUOTED.match(text, pos)
        if m is None:
            # --csv prints integers bare (e.g. the subscription count)
            end = text.find(b",", pos)
            end = n if end < 0 else end
            fields.append(text[pos:end])
            pos = end
        else:
            fields.append(redis_unquote(m.group(1)))
            pos = m.end()
        if pos < n:
            if text[pos] not in (0x2C, 0x20):  # ',' or ' '
                return None
            pos += 1
    return fields


# ------------------------------------------------------------- detection


def _looks_like(line: bytes) -> str | None:
    """The format one line belongs to, if it is unmistakably one; None if it says nothing."""
    if _MONITOR.match(line) and b'"' in line:
        return "monitor"
    if line.startswith(_CSV_KINDS):
        return "redis-csv"
    if line in _RAW_KINDS:
        return "redis-raw"
    m = _PREFIX.match(line)
    assert m is not None  # every group of _PREFIX is optional: it always matches
    if m.group(2) == NOTE:
        return "lines" if m.group(1) is not None and m.end() < len(line) else None
    if _COMMAND.match(line, m.end()):
        return "lines"
    return None


def detect_format(head: Iterable[bytes], lines_to_try: int = 50) -> str | None:
    """The format of an archive from its first lines, or None if it is not an archive.

    The first line (of the first ``lines_to_try`` non-blank ones) that is
    unmistakably one format decides; a file without any (a MANIFEST.json, a
    README, binary data) has no format. An empty file is a (``lines``) archive
    without lines.
    """
    tried = 0
    for line in head:
        line = line.rstrip(b"\r\n")
        if not line.strip() or line == b"OK" or line.startswith(b"Reading messages"):
            continue  # MONITOR's first reply, redis-cli --csv's banner: not decisive
        fmt = _looks_like(line)
        if fmt is not None:
            return fmt
        tried += 1
        if tried >= lines_to_try:
            return None
    return "lines" if tried == 0 else None


# ------------------------------------------------------------- splitting
#
# Per line: (timestamp, direction, channel, protocol line, problem), or None for
# a line that carries no payload (blank, MONITOR's other commands, subscribe
# confirmations). These are the specification the compiled column builder
# (factstream.spark._archive_c) follows for its fast lines.

Split = tuple["bytes | None", "bytes | None", "bytes | None", bytes, "str | None"]


def split_line(line: bytes) -> Split | None:
    """One line of a ``lines`` archive: its prefix taken apart."""
    if line and 65 <= line[0] <= 90:  # starts with a command name: no prefix
        return None, None, None, line, None
    m = _PREFIX.match(line)
    assert m is not None  # every group of _PREFIX is optional: it always matches
    ts, direction = m.group(1), m.group(2)
    if direction == NOTE and ts is None:
        return None, None, None, line, None  # a recorder note always has a timestamp: this is no prefix
    payload = line[m.end():] if m.end() else line
    if not payload.strip():
        if ts is None and direction is None:
            return None  # blank line
        what = "recorder note without text" if direction == NOTE else "prefix without a replication line"
        return ts, direction, None, payload, what
    return ts, direction, None, payload, None


def split_monitor(line: bytes) -> Split | None:
    """One line of ``redis-cli MONITOR`` output (PUBLISH entries carry payloads)."""
    if not line.strip() or line == b"OK":
        return None
    m = _MONITOR.match(line)
    fields = _quoted_fields(m.group(2)) if m else None
    if not fields:
        return None, None, None, line, "not a redis-cli MONITOR line"
    assert m is not None  # fields is None when m is None
    verb = fields[0].upper()
    if verb not in (b"PUBLISH", b"SPUBLISH"):
        return None  # other Redis traffic: not replication data
    if len(fields) != 3:
        return m.group(1), None, None, line, "PUBLISH without channel and payload"
    return m.group(1), None, fields[1], fields[2], None


def split_csv(line: bytes) -> Split | None:
    """One line of ``redis-cli --csv`` SUBSCRIBE/PSUBSCRIBE output."""
    if not line.strip() or line.startswith(b"Reading messages"):
        return None
    fields = _quoted_fields(line)
    if not fields:
        return None, None, None, line, "not a redis-cli --csv line"
    kind = fields[0]
    if kind in (b"message", b"smessage") and len(fields) == 3:
        return None, None, fields[1], fields[2], None
    if kind == b"pmessage" and len(fields) == 4:
        return None, None, fields[2], fields[3], None
    if kind in _SUBSCRIBE_KINDS:
        return None
    return None, None, None, line, "not a redis-cli --csv message"


#: The per-line splitter of each format whose records are single lines.
SPLITTERS = {"lines": split_line, "monitor": split_monitor, "redis-csv": split_csv}


def _raw_records(lines: Iterable[bytes], first_line: int) -> Iterator[Payload]:
    """``redis-cli SUBSCRIBE`` output: records of three (pmessage: four) lines."""
    number = first_line - 1
    it = iter(lines)
    for line in it:
        number += 1
        if not line.strip():
            continue
        if line in (b"message", b"smessage", b"pmessage"):
            extra = 2 if line == b"pmessage" else 1
            parts = []
            for _ in range(extra + 1):
                nxt = next(it, None)
                if nxt is None:
                    break
                number += 1
                parts.append(nxt)
            if len(parts) != extra + 1:
                yield number, line, None, None, None, "redis-cli message record cut short"
                continue
            yield number, parts[-1], None, None, parts[-2], None
        elif line in _SUBSCRIBE_KINDS:
            for _ in range(2):
                if next(it, None) is not None:
                    number += 1
        else:
            yield number, line, None, None, None, "not part of a redis-cli message record"


def payloads(lines: Iterable[bytes], fmt: str, first_line: int = 1) -> Iterator[Payload]:
    """(line number, protocol line, ts, direction, channel, problem) per payload-bearing line.

    ``lines`` have no newline; ``fmt`` is a detected format (not "auto").
    """
    if fmt == "redis-raw":
        yield from _raw_records(lines, first_line)
        return
    split = SPLITTERS.get(fmt)
    if split is None:
        raise ValueError(f"cannot parse format {fmt!r} here; detect it first")
    for number, line in enumerate(lines, first_line):
        parts = split(line)
        if parts is not None:
            ts, direction, channel, payload, problem = parts
            yield number, payload, ts, direction, channel, problem


# ------------------------------------------------------------- byte-order mark

#: The UTF-8 byte-order mark that Windows tools (PowerShell, Notepad) write at the start of a text file.
UTF8_BOM = b"\xef\xbb\xbf"


def without_bom(start: bytes) -> bytes:
    """The first bytes of an input (plain, or gzip decompressed) without a UTF-8 byte-order mark.

    A mark at the very start of an input says how it is encoded; it is no part
    of line 1 (left in, ``RDATA`` would read as the unknown command
    ``\ufeffRDATA``). Only the start of an input is given here: a mark anywhere
    else is data.
    """
    return start[len(UTF8_BOM):] if start.startswith(UTF8_BOM) else start


# ------------------------------------------------------------- compression

#: The first two bytes of every gzip file (RFC 1952): archives are recognised by content, not by name.
GZIP_MAGIC = b"\x1f\x8b"
#: How many leading bytes :func:`compression_of` looks at.
MAGIC_BYTES = 10
#: (magic bytes, compression, how to undo it) of compressions that are recognised but not read.
_OTHER_COMPRESSIONS: tuple[tuple[tuple[bytes, ...], str, str], ...] = (
    ((b"\xfd7zXZ\x00",), "xz", "unxz"),
    ((b"\x28\xb5\x2f\xfd",), "zstd", "unzstd"),
    ((b"\x04\x22\x4d\x18",), "lz4", "unlz4"),
    ((b"\x1f\x9d",), "compress (.Z)", "uncompress"),
    ((b"PK\x03\x04",), "zip", "unzip"),
)
_UNDO = {name: tool for _, name, tool in _OTHER_COMPRESSIONS}
_UNDO["bzip2"] = "bunzip2"


def compression_of(head: bytes) -> str | None:
    """The compression a file's first bytes (at least MAGIC_BYTES of them, if it has them) show; None: plain.

    "gzip" is read everywhere archives are read, whatever the file is called
    (``capture.1`` rotated by logrotate, a ``traffic.log`` that is gzip); the
    others are named so that a user is told what to do with them.
    """
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    # bzip2: "BZh", a block size digit, then a block or end-of-stream magic (no text line looks like that)
    if len(head) >= 10 and head[:3] == b"BZh" and 0x31 <= head[3] <= 0x39 and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    for magics, name, _ in _OTHER_COMPRESSIONS:
        if head.startswith(magics):
            return name
    return None


def unsupported_compression(kind: str, path: str = "FILE") -> str:
    """What to tell a user about an input compressed with ``kind`` (not gzip): it is not read, and what to do."""
    tool = _UNDO.get(kind, "its tool")
    how = f"pipe it through {tool}" if path == "-" else f"{tool} {path}"
    return f"compressed with {kind}, which is not read (only gzip is): decompress it first ({how}) or recompress it with gzip"


#: What reading an archive (plain or gzip) can raise on damaged or missing input.
READ_ERRORS = (OSError, EOFError, zlib.error)


def read_problem(err: BaseException, where: int) -> str:
    """What went wrong reading an input, and where (``where``: complete lines read before it)."""
    if isinstance(err, FileNotFoundError | PermissionError | IsADirectoryError):
        return f"cannot read: {err.strerror}"
    if isinstance(err, EOFError):
        what = "truncated gzip (the file ends inside a compressed member)"
    elif isinstance(err, gzip.BadGzipFile | zlib.error):
        what = f"corrupt gzip ({err})"
    else:
        what = f"read error ({getattr(err, 'strerror', None) or err})"
    return f"{what} after line {where}" if where else what
