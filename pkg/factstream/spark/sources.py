"""Finding archive files and cutting them into chunks that executors read.

Files are read by the executors themselves through ``pyarrow.fs`` (local or
shared paths, or URIs pyarrow understands: ``s3://``, ``gs://``, ``hdfs://``),
not through Spark's text source, because only a reader that knows byte
offsets can number lines exactly. Plain files are cut into chunks at any
byte, only as far as the cores need (:func:`plan_chunks`): every chunk is one
Python task, and a Python task has a fixed cost of its own (BENCHMARKS.md).
A chunk owns the lines that *start* inside it, so a line is never split or
read twice. gzip files are not splittable and are one chunk each,
decompressed as a stream.

Which files are archives: everything found except hidden files (``.x``,
``_SUCCESS``), the recorder's in-progress ``*.part`` files, and (with format
``auto``) files whose first lines are in no archive format (a MANIFEST.json,
a README): those are skipped with a warning (:func:`archive_formats`).
"""

from __future__ import annotations

import fnmatch
import gzip
import logging
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow.fs as pafs

from .formats import READ_ERRORS, detect_format, read_problem

__all__ = [
    "CHUNKS_PER_CORE",
    "MAX_CHUNK_BYTES",
    "Chunk",
    "archive_formats",
    "count_newlines",
    "gzip_problem",
    "list_files",
    "plan_chunks",
    "read_chunk_blocks",
    "read_chunk_lines",
    "read_head",
]

_log = logging.getLogger(__name__)

#: Default smallest chunk of a plain file: a Python task's fixed cost (tens of ms) stays small against it.
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024
#: Chunks per core a plan aims for when files must be cut: some slack for uneven files and busy cores.
CHUNKS_PER_CORE = 2
#: Chunks cut for the cores' sake stay below this (unless ``chunk_bytes`` is larger): a retried
#: or straggling task redoes at most this much.
MAX_CHUNK_BYTES = 512 * 1024 * 1024
_READ = 8 * 1024 * 1024
#: Decompressed bytes per read of a gzip file: where it breaks, what was read is kept to within this.
_PIECE = 64 * 1024


@dataclass(frozen=True)
class Chunk:
    """A byte range ``[start, end)`` of one file; gzip files have one chunk covering all."""

    path: str
    start: int
    end: int
    size: int
    index: int = 0

    @property
    def gzip(self) -> bool:
        return self.path.endswith((".gz", ".gzip"))


def _fs(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path and not path.startswith("file://"):
        return cast("tuple[pafs.FileSystem, str]", pafs.FileSystem.from_uri(path))
    if path.startswith("file://"):
        path = path[len("file://"):]
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _glob_match(path: str, pattern: str) -> bool:
    """Shell-style matching where wildcards do not cross '/' (like glob, unlike fnmatch)."""
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def _is_data_file(name: str) -> bool:
    base = os.path.basename(name)
    return not base.startswith((".", "_")) and not base.endswith(".part")  # .part: the recorder is still writing it


def list_files(inputs: Sequence[str]) -> list[tuple[str, int]]:
    """Expand files, directories (recursively) and globs into (path, size), sorted.

    Raises FileNotFoundError naming every input that matched nothing.
    """
    found: dict[str, int] = {}
    missing = []
    for item in inputs:
        fs, path = _fs(item)
        prefix = item.split("://", 1)[0] + "://" if "://" in item and not item.startswith("file://") else ""
        matches: list[pafs.FileInfo] = []
        if _has_glob(path):
            base = path
            while _has_glob(base):
                base = os.path.dirname(base)
            sel = pafs.FileSelector(base, recursive=True, allow_not_found=True)
            matches = [i for i in fs.get_file_info(sel) if _glob_match(i.path, path)]
            expanded = []
            for info in matches:
                if info.type == pafs.FileType.Directory:
                    expanded.extend(fs.get_file_info(pafs.FileSelector(info.path, recursive=True)))
                else:
                    expanded.append(info)
            matches = expanded
        else:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                matches = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            elif info.type == pafs.FileType.File:
                matches = [info]
        files = [i for i in matches if i.type == pafs.FileType.File and _is_data_file(i.path)]
        if not files:
            missing.append(item)
        for info in files:
            found[prefix + info.path] = int(info.size or 0)
    if missing:
        raise FileNotFoundError(f"no archive files found for: {', '.join(missing)} (check the paths and globs)")
    return sorted(found.items())


def plan_chunks(
    files: Sequence[tuple[str, int]], chunk_bytes: int = DEFAULT_CHUNK_BYTES, cores: int | None = None
) -> list[Chunk]:
    """Cut plain files into chunks of equal size, never smaller than ``chunk_bytes``; gzip files stay whole.

    With ``cores``, files are cut only as far as needed for CHUNKS_PER_CORE
    chunks per core over the plain bytes of ``files``: a file no larger than
    its share stays whole (an archive of many files is then one task per
    file), a larger one is cut into equal chunks of at most that share, and
    none into chunks larger than MAX_CHUNK_BYTES (or ``chunk_bytes``, if
    larger). Without ``cores`` (as if there were plenty): as many chunks as
    ``chunk_bytes`` allows, each between ``chunk_bytes`` and twice that.
    ``chunk_bytes`` <= 0: no file is cut.
    """
    plain = [size for path, size in files if not Chunk(path, 0, size, size).gzip]
    share = 1
    if cores is not None and plain:
        share = max(1, -(-sum(plain) // (CHUNKS_PER_CORE * max(1, cores))))
    cap = max(chunk_bytes, MAX_CHUNK_BYTES)
    chunks = []
    for path, size in files:
        probe = Chunk(path, 0, size, size)
        pieces = 1
        if not probe.gzip and chunk_bytes > 0:
            pieces = max(-(-size // share), -(-size // cap))  # at most the share, at most the cap ...
            pieces = max(1, min(pieces, size // chunk_bytes))  # ... but never smaller than chunk_bytes
        if pieces == 1:
            chunks.append(probe)
            continue
        bounds = [size * i // pieces for i in range(pieces + 1)]
        chunks.extend(Chunk(path, bounds[i], bounds[i + 1], size, i) for i in range(pieces))
    return chunks


def count_newlines(chunk: Chunk) -> int:
    """Newlines in the chunk's byte range (the driver turns these into first line numbers)."""
    fs, path = _fs(chunk.path)
    total = 0
    with fs.open_input_file(path) as fh:
        pos = chunk.start
        while pos < chunk.end:
            data = fh.read_at(min(_READ, chunk.end - pos), pos)
            if not data:
                break
            total += data.count(b"\n")
            pos += len(data)
    return total


def read_head(path: str, nbytes: int = 65536) -> list[bytes]:
    """The first complete lines of a file (decompressed if gzip), for format detection.

    A gzip file that is truncated or corrupt gives the lines before the damage
    (perhaps none): detection looks at what is there, the parse reports the damage.
    """
    fs, local = _fs(path)
    with fs.open_input_stream(local, compression=None) as raw:
        if path.endswith((".gz", ".gzip")):
            data = _gunzip_head(raw, nbytes)
        else:
            data = raw.read(nbytes)
    lines = data.split(b"\n")
    return lines[:-1] if len(lines) > 1 else lines


def _gunzip_head(raw: pafs.NativeFile, nbytes: int) -> bytes:
    inflate = zlib.decompressobj(wbits=31)
    out = b""
    try:
        while len(out) < nbytes:
            block = raw.read(65536)
            if not block:
                break
            out += inflate.decompress(block, nbytes - len(out))
            if inflate.eof:
                break
    except zlib.error:
        pass
    return out


def archive_formats(files: Sequence[tuple[str, int]], fmt: str = "auto") -> tuple[dict[str, str], list[str]]:
    """The format of each archive file, and the files skipped because their format was not detected.

    With ``fmt`` other than "auto" every file is taken as that format. A
    skipped file is logged as a warning; if every file is skipped,
    FileNotFoundError says so (nothing to parse is the user's mistake, not an
    empty result).
    """
    if fmt != "auto":
        return {path: fmt for path, _ in files}, []
    formats: dict[str, str] = {}
    skipped: list[str] = []
    for path, _ in files:
        found = detect_format(read_head(path))
        if found is None:
            skipped.append(path)
        else:
            formats[path] = found
    if skipped:
        _log.warning(
            "skipped %d file(s) whose format was not detected (not replication archives): %s",
            len(skipped), ", ".join(skipped),
        )
    if skipped and not formats:
        raise FileNotFoundError(
            f"no replication archives among {len(skipped)} file(s): {', '.join(skipped[:5])}"
            f"{' ...' if len(skipped) > 5 else ''} (no line in a known format; see --format)"
        )
    return formats, skipped


def read_chunk_blocks(chunk: Chunk, newlines_before: int = 0, block_bytes: int = _READ) -> tuple[int, Iterator[bytes]]:
    """The lines starting inside ``chunk``: (number of the first line, blocks of whole lines).

    Each block ends just after a newline, except the last one of a file
    without a final newline; line numbers run on from block to block.
    ``newlines_before`` is the number of newlines in the file before
    ``chunk.start``. The file is opened here and closed when the blocks are
    exhausted (or the iterator is closed).
    """
    stream = _chunk_stream(chunk, newlines_before, block_bytes)
    first = next(stream, None)
    if first is None:
        return 1 + newlines_before, iter(())
    assert isinstance(first, int)
    return first, cast("Iterator[bytes]", stream)


def _chunk_stream(chunk: Chunk, newlines_before: int, block_bytes: int) -> Iterator[int | bytes]:
    """The first line number, then the blocks (see read_chunk_blocks); nothing if no line starts in the chunk."""
    fs, path = _fs(chunk.path)
    if chunk.gzip:
        with fs.open_input_stream(path, compression=None) as raw, gzip.GzipFile(fileobj=raw) as fh:
            yield 1
            # A truncated or corrupt file ends where it breaks: the lines before it are parsed, and
            # the driver names the file and the place (gzip_problem), so one bad file kills no job.
            yield from _line_blocks(_stop_at_damage(fh.read), block_bytes)
        return
    with fs.open_input_file(path) as fh:
        if chunk.start == 0:
            pos = 0
        else:
            pos = -1
            probe = chunk.start - 1  # a line starts at p when byte p-1 is a newline
            while probe < chunk.end - 1:
                data = fh.read_at(min(block_bytes, chunk.end - 1 - probe), probe)
                k = data.find(b"\n")
                if k >= 0:
                    pos = probe + k + 1
                    break
                probe += len(data)
            if pos < 0 or pos >= chunk.end:
                return  # no line starts in this chunk
        yield 1 + newlines_before + (1 if pos > chunk.start else 0)
        yield from _line_blocks(_RangeReader(fh, pos, chunk.end, chunk.size).read, block_bytes)


def _stop_at_damage(read: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """``read`` that ends the stream (returns b"") where the data is damaged, instead of raising."""
    broken = False

    def safe(n: int) -> bytes:
        nonlocal broken
        if broken:
            return b""
        pieces: list[bytes] = []
        got = 0
        while got < n:
            try:
                data = read(min(_PIECE, n - got))  # small reads: damage loses at most one piece
            except READ_ERRORS:
                broken = True
                whole = b"".join(pieces)
                return whole[: whole.rfind(b"\n") + 1]  # the line cut by the damage is not a line
            if not data:
                break
            pieces.append(data)
            got += len(data)
        return b"".join(pieces)

    return safe


def gzip_problem(path: str) -> str | None:
    """What is wrong with a gzip file (truncated, corrupt) and after which line, or None if it reads to its end."""
    fs, local = _fs(path)
    lines = 0
    try:
        with fs.open_input_stream(local, compression=None) as raw, gzip.GzipFile(fileobj=raw) as fh:
            while data := fh.read(_PIECE):
                lines += data.count(b"\n")
    except READ_ERRORS as err:
        return read_problem(err, lines)
    return None


def read_chunk_lines(chunk: Chunk, newlines_before: int = 0, block_bytes: int = _READ) -> Iterator[tuple[int, list[bytes]]]:
    """The lines starting inside ``chunk``, without newlines, as (first line number, lines) blocks."""
    first, blocks = read_chunk_blocks(chunk, newlines_before, block_bytes)
    for data in blocks:
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        yield first, lines
        first += len(lines)


class _RangeReader:
    """Reads ``[pos, end)`` and then on to the end of the line that straddles ``end``."""

    def __init__(self, fh: pafs.NativeFile, pos: int, end: int, size: int) -> None:
        self.fh, self.pos, self.end, self.size = fh, pos, end, size
        self.last = b""

    def read(self, n: int) -> bytes:
        cur = self.pos
        if cur >= self.end:
            if cur >= self.size or self.last.endswith(b"\n"):
                return b""
            data: bytes = self.fh.read_at(min(n, self.size - cur), cur)
            k = data.find(b"\n")
            if k >= 0:
                data = data[: k + 1]
        else:
            data = self.fh.read_at(min(n, self.end - cur), cur)
        self.pos = cur + len(data)
        if data:
            self.last = data
        return data


def _line_blocks(read: Callable[[int], bytes], block_bytes: int) -> Iterator[bytes]:
    """Cut a byte stream into blocks that end at a newline (the last one: at the end of the stream)."""
    rest = b""
    while True:
        data = read(block_bytes)
        if not data:
            break
        data = rest + data if rest else data
        cut = data.rfind(b"\n") + 1
        if cut:
            rest = data[cut:]
            yield data[:cut] if rest else data
        else:
            rest = data
    if rest:
        yield rest
