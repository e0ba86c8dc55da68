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

Which files are archives: everything found in directories and by globs
except hidden files (``.x``, ``_SUCCESS``), whatever is inside hidden
directories (``.git/``, ``_temporary/``, ``.snapshots/``: a directory named
on its own is still walked) and the recorder's in-progress ``*.part`` files
(a file named on its own is always taken); not files that
cannot be read or are compressed with something other than gzip, nor (with
format ``auto``) files whose first lines are in no archive format (a
MANIFEST.json, a README): those are skipped with a warning
(:func:`archive_formats`). gzip is recognised by its first bytes, not by the
file name. Local directories are walked following symbolic links, but a
file or directory reached twice (a ``current.log`` link to today's file, a
link back up the tree) is taken once, and broken links are named.
"""

from __future__ import annotations

import fnmatch
import glob as globbing
import logging
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow.fs as pafs

from .formats import (
    MAGIC_BYTES, READ_ERRORS, UTF8_BOM, compression_of, detect_format, read_problem, unsupported_compression,
    without_bom,
)
from .gunzip import Gunzip

__all__ = [
    "NoFilesystem",
    "filesystem_of",
    "CHUNKS_PER_CORE",
    "MAX_CHUNK_BYTES",
    "Chunk",
    "archive_formats",
    "count_newlines",
    "gzip_problem",
    "input_problem",
    "list_inputs",
    "is_gzip",
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
#: Decompressed bytes per read when only checking a gzip file (gzip_problem).
_CHECK = 256 * 1024


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
        """Whether the file is gzip, from its first bytes (a gzip ``capture.1`` is one; a plain ``x.gz`` is not).

        A file that cannot be opened is judged by its name: reading it says what is wrong.
        """
        try:
            return is_gzip(self.path, self.size)
        except READ_ERRORS:
            return self.path.endswith((".gz", ".gzip"))


#: (path, size) -> compression of files already looked at (a Chunk's ``gzip`` is asked several times).
_COMPRESSION: dict[tuple[str, int], str | None] = {}


def _compression(path: str, size: int | None = None) -> str | None:
    """The compression of ``path`` from its first bytes (see formats.compression_of); OSError if unreadable."""
    key = (path, -1 if size is None else size)
    if size is not None and key in _COMPRESSION:
        return _COMPRESSION[key]
    fs, local = filesystem_of(path)
    if isinstance(fs, pafs.LocalFileSystem):
        with open(local, "rb") as fh:  # Python's own errors: "Permission denied", not pyarrow's paragraph
            head = fh.read(MAGIC_BYTES)
    else:
        with fs.open_input_stream(local, compression=None) as raw:
            head = b""
            while len(head) < MAGIC_BYTES:
                data = raw.read(MAGIC_BYTES - len(head))
                if not data:
                    break
                head += data
    found = compression_of(head)
    if size is not None:
        if len(_COMPRESSION) > 100_000:
            _COMPRESSION.clear()
        _COMPRESSION[key] = found
    return found


def is_gzip(path: str, size: int | None = None) -> bool:
    """Whether ``path`` is gzip by its content; ``size`` (as listed) lets the answer be remembered."""
    return _compression(path, size) == "gzip"


def input_problem(path: str, size: int | None = None) -> str | None:
    """Why ``path`` cannot be parsed at all (unreadable, compressed with other than gzip), or None.

    ``size`` (as listed) lets what the file's first bytes say be remembered (no second request for remote files).
    """
    try:
        kind = _compression(path, size)
    except READ_ERRORS as err:
        return read_problem(err, 0)
    if kind is not None and kind != "gzip":
        return unsupported_compression(kind, path)
    return None


class NoFilesystem(OSError):
    """pyarrow.fs, which reads the inputs, cannot open a URI's filesystem (a scheme it lacks, no libhdfs)."""


def filesystem_of(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem ``path`` (a local path, ``file://``, or a URI) is read with, and the path within it.

    Raises :class:`NoFilesystem` saying what to do where pyarrow cannot open
    it (its own words are "Unrecognized filesystem type", or 88 lines of
    dlopen attempts for hdfs:// without a JVM).
    """
    if "://" in path and not path.startswith("file://"):
        try:
            return cast("tuple[pafs.FileSystem, str]", pafs.FileSystem.from_uri(path))
        except (ValueError, OSError) as err:  # pyarrow.ArrowInvalid is a ValueError
            raise NoFilesystem(_no_filesystem(path, err)) from err
    if path.startswith("file://"):
        path = path[len("file://"):]
    return pafs.LocalFileSystem(), os.path.abspath(path)


#: Hadoop's names of schemes that pyarrow knows by another.
_PYARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def _no_filesystem(uri: str, err: BaseException) -> str:
    """Why pyarrow cannot read ``uri``, in one line, and what to do."""
    said = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
    scheme = uri.split("://", 1)[0].lower()
    if "Unrecognized filesystem type" in said:
        alias = _PYARROW_SCHEMES.get(scheme)
        instead = f": write {alias}:// for {scheme}://" if alias else " (it reads s3://, gs://, hdfs:// and local paths)"
        return f"{uri}: archives are read with pyarrow.fs, which has no filesystem for {scheme}://{instead}"
    if "libjvm" in said or "libhdfs" in said:
        return (f"{uri}: {said}: pyarrow reads hdfs:// through a JVM and Hadoop's libhdfs; set JAVA_HOME to a JDK "
                "and HADOOP_HOME (or ARROW_LIBHDFS_DIR, the folder of libhdfs.so), or copy the archives to a path "
                "every node reads")
    return f"{uri}: {said}"


def _has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _glob_match(path: str, pattern: str) -> bool:
    """Shell-style matching where wildcards do not cross '/' (like glob, unlike fnmatch)."""
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def _is_data_file(name: str) -> bool:
    base = os.path.basename(name)
    return not base.startswith((".", "_")) and not base.endswith(".part")  # .part: the recorder is still writing it


def _is_hidden(name: str) -> bool:
    """A hidden file or directory name (Hadoop's and Spark's rule: ``.git``, ``_temporary``, ``_SUCCESS``)."""
    return name.startswith((".", "_"))


def _hidden_part(path: str, base: str, named: Sequence[str] = ()) -> str | None:
    """The first hidden directory of ``path`` below ``base`` (not counting the file's own name), or None.

    Components in ``named`` were written out by the user (a glob's literal parts): never hidden.
    """
    rel = os.path.relpath(path, base) if base else path
    parts = rel.split("/")[:-1]
    for k, part in enumerate(parts):
        if part not in ("", ".", "..") and _is_hidden(part) and part not in named:
            return "/".join([base.rstrip("/")] + parts[: k + 1]) if base else "/".join(parts[: k + 1])
    return None


def list_files(inputs: Sequence[str], *, quiet: bool = False) -> list[tuple[str, int]]:
    """Expand files, directories (recursively) and globs into (path, size), sorted (see list_inputs)."""
    return list_inputs(inputs, quiet=quiet)[0]


def list_inputs(inputs: Sequence[str], *, quiet: bool = False) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """Expand files, directories (recursively) and globs into (path, size), sorted; and what could not be listed.

    A path that exists is taken as it is, even if it holds glob characters
    (``capture[1].log``); a file named on its own is taken whatever its name.
    Local directories are walked following symbolic links, each directory and
    each file once (the same file reached by two paths is taken by the
    shorter, non-link one); hidden directories inside them (``.git``,
    ``_temporary``) are not walked, but one named on its own is. Skipped
    links (warning) and hidden directories (info) are logged once (unless
    ``quiet``: a listing made only to check the inputs, repeated later). The second list
    holds (path, problem) of the directories that could not be read (their
    files are missing from the first). Raises FileNotFoundError naming every
    input that matched nothing.
    """
    found: dict[str, int] = {}
    missing = []
    walk = _LocalWalk()
    for item in inputs:
        hidden_before = len(walk.hidden_dirs)
        if "://" in item and not item.startswith("file://"):
            files = _remote_files(item, walk.hidden_dirs)
            if not files:
                missing.append(item + _only_hidden(walk.hidden_dirs, hidden_before))
            found.update(files)
            continue
        _, path = filesystem_of(item)
        before = len(walk.files) + walk.seen_again
        unreadable_before = len(walk.unreadable)
        if os.path.lexists(path):
            if os.path.isdir(path):
                walk.directory(path)
            elif os.path.isfile(path):
                walk.file(path, named=True)
            elif os.path.islink(path):
                missing.append(f"{item} (a broken symbolic link to {os.readlink(path)})")
                continue
            else:
                walk.file(path, named=True)  # a FIFO or device: reading it says what is wrong
        elif _has_glob(path):
            literal = [part for part in path.split("/") if not _has_glob(part)]
            for match in sorted(globbing.glob(path, recursive=True)):
                is_dir = os.path.isdir(match)
                # a hidden directory matched by a wildcard, not named, is left out as in a walk
                hidden = _hidden_part(os.path.join(match, "") if is_dir else match, "", literal)
                if hidden is not None:
                    walk.hidden_dirs.add(hidden)
                    continue
                if is_dir:
                    walk.directory(match)
                elif _is_data_file(match):
                    walk.file(match, named=False)
        if len(walk.files) + walk.seen_again == before:
            cannot = [why for where, why in walk.unreadable[unreadable_before:] if where == path]
            missing.append(f"{item} ({cannot[0]})" if cannot else item + _only_hidden(walk.hidden_dirs, hidden_before))
    if not quiet:
        walk.report()
    if missing:
        raise FileNotFoundError(f"no archive files found for: {', '.join(missing)} (check the paths and globs)")
    found.update(walk.files)
    return sorted(found.items()), sorted(walk.unreadable)


def _only_hidden(hidden: set[str], before: int) -> str:
    """What to add to an input that gave no file when it held hidden directories (they were left out)."""
    if len(hidden) == before:
        return ""
    return " (it holds only hidden directories, left out: name one on its own to parse it)"


def _remote_files(item: str, hidden: set[str]) -> dict[str, int]:
    """The files of a URI input (``s3://...``): pyarrow lists them (no symbolic links there).

    Hidden directories inside a listed one are left out and added to ``hidden``.
    """
    fs, path = filesystem_of(item)
    prefix = item.split("://", 1)[0] + "://"
    matches: list[tuple[pafs.FileInfo, str]] = []  # (file, the directory it was listed under)
    if _has_glob(path):
        base = path
        while _has_glob(base):
            base = os.path.dirname(base)
        sel = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        for info in fs.get_file_info(sel):
            if not _glob_match(info.path, path):
                continue
            if info.type == pafs.FileType.Directory:
                matches.extend((i, info.path) for i in fs.get_file_info(pafs.FileSelector(info.path, recursive=True)))
            else:
                matches.append((info, ""))
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            matches = [(i, path) for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))]
        elif info.type == pafs.FileType.File:
            return {prefix + info.path: int(info.size or 0)}
    found = {}
    for i, base in matches:
        if i.type != pafs.FileType.File or not _is_data_file(i.path):
            continue
        inside = _hidden_part(i.path, base) if base else None
        if inside is not None:
            hidden.add(prefix + inside)
            continue
        found[prefix + i.path] = int(i.size or 0)
    return found


class _LocalWalk:
    """Local files found so far: each real file and directory once, however many links lead to it."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self._by_id: dict[tuple[int, int], str] = {}  # (device, inode) of a file -> the path it was taken by
        self._dirs: set[tuple[int, int]] = set()
        self.seen_again = 0  # paths that lead to a file already taken (they match, but add nothing)
        self.duplicates: list[tuple[str, str]] = []
        self.loops: list[str] = []
        self.broken: list[str] = []
        self.unreadable: list[tuple[str, str]] = []
        self.hidden_dirs: set[str] = set()  # hidden directories inside walked ones: not walked

    def file(self, path: str, named: bool) -> None:
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.broken.append(path)
            return
        except OSError as err:
            self.unreadable.append((path, f"cannot read: {err.strerror}"))
            return
        key = (st.st_dev, st.st_ino)
        taken = self._by_id.get(key)
        if taken is None:
            self._by_id[key] = path
            self.files[path] = st.st_size
            return
        if taken == path:
            self.seen_again += 1
            return
        # two paths, one file: keep the one that is not a link (then the shorter, then the first in order)
        keep, drop = sorted((taken, path), key=lambda p: (os.path.islink(p), len(p), p))
        if keep != taken:
            del self.files[taken]
            self.files[keep] = st.st_size
            self._by_id[key] = keep
        self.seen_again += 1
        self.duplicates.append((drop, keep))

    def directory(self, root: str) -> None:
        root = os.path.abspath(root)

        def failed(err: OSError) -> None:
            self.unreadable.append((str(err.filename), f"cannot read the directory: {err.strerror}"))

        for here, dirs, names in os.walk(root, followlinks=True, onerror=failed):
            try:
                st = os.stat(here)
            except OSError:
                dirs[:] = []
                continue
            key = (st.st_dev, st.st_ino)
            if key in self._dirs:  # reached again through a link: already read (or being read: a loop)
                self.loops.append(here)
                dirs[:] = []
                continue
            self._dirs.add(key)
            self.hidden_dirs.update(os.path.join(here, d) for d in dirs if _is_hidden(d))
            dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
            for name in sorted(names):
                if _is_data_file(name):
                    self.file(os.path.join(here, name), named=False)

    def report(self) -> None:
        """Log what was left out, so that nothing goes unnoticed."""
        _log_hidden(self.hidden_dirs)
        if self.duplicates:
            _log.warning(
                "skipped %d path(s) that lead to a file already taken (links): %s",
                len(self.duplicates), ", ".join(f"{drop} (= {keep})" for drop, keep in self.duplicates[:10])
                + (" ..." if len(self.duplicates) > 10 else ""),
            )
        if self.loops:
            _log.warning("skipped %d directory link(s) to a directory already read: %s",
                         len(self.loops), ", ".join(self.loops[:10]) + (" ..." if len(self.loops) > 10 else ""))
        if self.broken:
            _log.warning("skipped %d broken symbolic link(s): %s", len(self.broken), ", ".join(self.broken[:10])
                         + (" ..." if len(self.broken) > 10 else ""))
        if self.unreadable:
            _log.warning("skipped %d path(s) that cannot be read: %s", len(self.unreadable),
                         "; ".join(f"{p}: {why}" for p, why in self.unreadable[:10])
                         + (" ..." if len(self.unreadable) > 10 else ""))


def _log_hidden(dirs: set[str]) -> None:
    """One INFO line for the hidden directories not walked (by design, so no warning)."""
    if dirs:
        names = sorted(dirs)
        _log.info("left out %d hidden director%s inside the inputs (names starting with '.' or '_'; "
                  "name one on its own to parse it): %s", len(names), "y" if len(names) == 1 else "ies",
                  ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""))


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
    fs, path = filesystem_of(chunk.path)
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


def read_head(path: str, nbytes: int = 65536, size: int | None = None) -> list[bytes]:
    """The first complete lines of a file (decompressed if gzip), for format detection.

    A gzip file that is truncated or corrupt gives the lines before the damage
    (perhaps none): detection looks at what is there, the parse reports the damage.
    A UTF-8 byte-order mark at the start is left out, as the parse leaves it out.
    """
    fs, local = filesystem_of(path)
    gzipped = is_gzip(path, size)
    with fs.open_input_stream(local, compression=None) as raw:
        if gzipped:
            data = _gunzip_head(raw, nbytes)
        else:
            data = raw.read(nbytes)
    lines = without_bom(data).split(b"\n")
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
    """The format of each archive file, and the files skipped (unreadable, not gzip-compressed, no format).

    Every file is opened: one that cannot be read, or is compressed with
    something other than gzip (xz, bzip2, zstd ...), is skipped whatever
    ``fmt`` says (read as text it would be lines of garbage). With ``fmt``
    other than "auto" every other file is taken as that format; with "auto"
    a file whose first lines are in no format is skipped. Skipped files are
    logged as warnings, with the reason; if every file is skipped,
    FileNotFoundError says so (nothing to parse is the user's mistake, not an
    empty result).
    """
    formats: dict[str, str] = {}
    undetected: list[str] = []
    unreadable: list[tuple[str, str]] = []
    for path, size in files:
        problem = input_problem(path, size)
        found: str | None = fmt
        if problem is None and fmt == "auto":
            try:
                found = detect_format(read_head(path, size=size))
            except READ_ERRORS as err:  # gone or changed since it was listed
                problem = read_problem(err, 0)
        if problem is not None:
            unreadable.append((path, problem))
        elif found is None:
            undetected.append(path)
        else:
            formats[path] = found
    if unreadable:
        _log.warning("skipped %d file(s) that cannot be parsed: %s", len(unreadable),
                     "; ".join(f"{path}: {problem}" for path, problem in unreadable))
    if undetected:
        _log.warning(
            "skipped %d file(s) whose format was not detected (not replication archives): %s",
            len(undetected), ", ".join(undetected),
        )
    skipped = [path for path, _ in unreadable] + undetected
    if skipped and not formats:
        why = "no line in a known format; see --format" if not unreadable else "see the warnings above"
        raise FileNotFoundError(
            f"no replication archives among {len(skipped)} file(s): {', '.join(skipped[:5])}"
            f"{' ...' if len(skipped) > 5 else ''} ({why})"
        )
    return formats, skipped


def read_chunk_blocks(
    chunk: Chunk, newlines_before: int = 0, block_bytes: int = _READ,
    on_damage: Callable[[str, str], None] | None = None,
) -> tuple[int, Iterator[bytes]]:
    """The lines starting inside ``chunk``: (number of the first line, blocks of whole lines).

    Each block ends just after a newline, except the last one of a file
    without a final newline; line numbers run on from block to block.
    ``newlines_before`` is the number of newlines in the file before
    ``chunk.start``. The file is opened here and closed when the blocks are
    exhausted (or the iterator is closed). A gzip file is read up to its
    listed size; if it breaks before (truncated, corrupt), the blocks end
    there and ``on_damage(path, problem)`` is called once they are exhausted
    (``problem`` as :func:`gzip_problem` gives it). A UTF-8 byte-order mark at
    the start of the file (of its decompressed bytes, if gzip) is left out: it
    says how the file is encoded, it is no part of line 1.
    """
    stream = _chunk_stream(chunk, newlines_before, block_bytes, on_damage)
    first = next(stream, None)
    if first is None:
        return 1 + newlines_before, iter(())
    assert isinstance(first, int)
    return first, cast("Iterator[bytes]", stream)


def _chunk_stream(
    chunk: Chunk, newlines_before: int, block_bytes: int, on_damage: Callable[[str, str], None] | None = None,
) -> Iterator[int | bytes]:
    """The first line number, then the blocks (see read_chunk_blocks); nothing if no line starts in the chunk."""
    fs, path = filesystem_of(chunk.path)
    if chunk.gzip:
        with fs.open_input_stream(path, compression=None) as raw:
            yield 1
            # A truncated or corrupt file ends where it breaks, and the reader says so (on_damage), so
            # one bad file kills no job. Every line decompressed before the break is parsed; a file cut
            # mid-line ends with that line's start, which the builder makes a malformed row (the file
            # ends mid-line). Damage in the middle of a line cuts no line short: it is no line at all,
            # and is left out.
            unzip = Gunzip(raw.read, chunk.size or None)
            yield from _line_blocks(_SkipBom(unzip.read).read, block_bytes,
                                    last=lambda: unzip.error is None or unzip.truncated)
        if unzip.error is not None and on_damage is not None:
            # Damage is rare: only a damaged file is read again, to count the lines before the break.
            on_damage(chunk.path, gzip_problem(chunk.path, chunk.size) or read_problem(unzip.error, 0))
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
        read = _RangeReader(fh, pos, chunk.end, chunk.size).read
        yield from _line_blocks(_SkipBom(read).read if pos == 0 else read, block_bytes)  # pos 0: the file's start


def gzip_problem(path: str, size: int | None = None) -> str | None:
    """What is wrong with a gzip file (truncated, corrupt) and after which line, or None if it reads to its end.

    The line is the last whole one that the parse gives (read_chunk_blocks
    reads it the same way): a file cut mid-line has one more, malformed row.
    ``size``: read only the first ``size`` bytes (the length a listing saw,
    for a file that may still grow); None or 0: to the end.
    """
    fs, local = filesystem_of(path)
    lines = 0
    try:
        with fs.open_input_stream(local, compression=None) as raw:
            unzip = Gunzip(raw.read, size or None)
            while data := unzip.read(_CHECK):  # small pieces: counted while still in the cache
                lines += data.count(b"\n")
    except READ_ERRORS as err:  # gone since it was listed
        return read_problem(err, lines)
    if unzip.error is None:
        return None
    return read_problem(unzip.error, lines)


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


class _SkipBom:
    """A stream's ``read`` without the UTF-8 byte-order mark its first bytes may hold (see without_bom)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._started = False

    def read(self, n: int) -> bytes:
        if self._started:
            return self._read(n)
        self._started = True
        data = self._read(n)
        while data and len(data) < len(UTF8_BOM) and UTF8_BOM.startswith(data):  # the mark may come in pieces
            more = self._read(n)
            if not more:
                break
            data += more
        data = without_bom(data)
        return data or self._read(n)  # b"" only at the end of the stream: a stream of just the mark has none


def _line_blocks(read: Callable[[int], bytes], block_bytes: int, last: Callable[[], bool] | None = None) -> Iterator[bytes]:
    """Cut a byte stream into blocks that end at a newline (the last one: at the end of the stream).

    ``last``: asked at the end whether the bytes after the last newline are given (default: they are).
    """
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
    if rest and (last is None or last()):
        yield rest
