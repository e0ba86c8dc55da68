"""Capture files of ``factstream record``: rotating gzip files of timestamped wire lines.

The layout is the project's convention (read by ``logs parse`` and Spark):
``<capture>.<UTC start YYYYmmddTHHMMSSffffffZ>.<6-digit sequence>.log.gz``,
written as ``... .log.gz.part`` and renamed when complete, so names sort in
time order and readers never see a file being written. Each line is
``<ISO-8601 UTC> <dir> <wire line>`` with dir ``>`` (server to client),
``<`` (client to server) or ``#`` (a recorder note: ``# connected ...``,
``# disconnected ...``).

Why members: the gzip member in progress is finished ``flush_interval``
seconds after its first line (by the first write or :meth:`~CaptureWriter.tick`
after that, or by the owner's timer at :attr:`~CaptureWriter.due` through
:meth:`~CaptureWriter.flush`), on rotation and on close (SIGTERM), so a crash
loses at most the open member; :func:`recover_parts` keeps the complete
members of a file a crashed recorder left behind.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import time
import zlib
from typing import IO

__all__ = ["CaptureWriter", "CaptureError", "recover_parts", "capture_file_name", "prefix_lines", "check_capture_name"]

_NAME = re.compile(r"^(?P<capture>[^.]+)\.(?P<stamp>\d{8}T\d{12}Z)\.(?P<seq>\d{6})\.log\.gz(?P<part>\.part)?$")


def check_capture_name(capture: str) -> None:
    """ValueError unless ``capture`` can be a file name's first part (what ``logs parse`` splits on)."""
    if not capture or "." in capture or "/" in capture:
        raise ValueError(f"capture name {capture!r} must be non-empty without '.' or '/'")


def capture_file_name(capture: str, started: float, seq: int) -> str:
    """The final name of file ``seq`` of ``capture`` started at ``started`` (epoch seconds)."""
    whole = int(started)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole)) + f"{int((started - whole) * 1e6):06d}Z"
    return f"{capture}.{stamp}.{seq:06d}.log.gz"


def prefix_lines(stamp: bytes, direction: bytes, chunk: bytes) -> bytes:
    """``chunk`` (complete lines, each ending in newline) with ``<stamp> <dir> `` before every line."""
    head = stamp + b" " + direction + b" "
    body = chunk.replace(b"\n", b"\n" + head)
    return head + body[: -len(head)]


def _complete_members(data: bytes) -> int:
    """Length of the prefix of ``data`` made of complete gzip members."""
    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            d.decompress(data[pos:])
        except zlib.error:
            break
        if not d.eof:
            break
        pos = len(data) - len(d.unused_data)
    return pos


def recover_parts(directory: str, capture: str) -> list[str]:
    """Finish the ``.part`` files of ``capture`` a crashed recorder left: keep complete members, rename."""
    done = []
    for name in sorted(os.listdir(directory)):
        m = _NAME.match(name)
        if not m or m["capture"] != capture or not m["part"]:
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as fh:
            data = fh.read()
        keep = _complete_members(data)
        if keep == 0:
            os.remove(path)
            continue
        if keep < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(keep)
        final = path[: -len(".part")]
        os.replace(path, final)
        done.append(final)
    return done


def next_sequence(directory: str, capture: str) -> int:
    """One more than the highest sequence number of ``capture`` in ``directory``."""
    seqs = [int(m["seq"]) for m in map(_NAME.match, os.listdir(directory)) if m and m["capture"] == capture]
    return max(seqs) + 1 if seqs else 0


class CaptureError(Exception):
    """The capture files cannot be written (disk full, --dir removed or replaced): recording must stop.

    The file in progress was cut back to its last complete gzip member and finished (or, when even that
    failed, left as ``.part`` for the next recorder to finish); ``saved``/``lost`` count the lines."""

    def __init__(self, path: str, err: OSError, saved: int, lost: int) -> None:
        self.path = path
        self.reason = (err.strerror or str(err)).lower() if isinstance(err, OSError) else str(err)
        self.saved = saved
        self.lost = lost
        super().__init__(f"cannot write {path}: {self.reason}")


class CaptureWriter:
    """Appends prefixed lines to the capture's current file, rotating by size and by time.

    An OSError writing, finishing or renaming a file (and a file found removed when a member is
    finished) becomes one :class:`CaptureError`; the writer then refuses further lines."""

    def __init__(self, directory: str, capture: str, *, rotate_bytes: int = 64 << 20,
                 rotate_seconds: float = 3600.0, flush_interval: float = 1.0) -> None:
        check_capture_name(capture)
        self.directory = directory
        self.capture = capture
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_interval = flush_interval
        os.makedirs(directory, exist_ok=True)
        self.recovered = recover_parts(directory, capture)
        self.seq = next_sequence(directory, capture)
        self.files: list[str] = []  # completed files, in order
        self.lines = 0
        self._raw: IO[bytes] | None = None
        self._gz: gzip.GzipFile | None = None
        self._path = ""
        self._opened = 0.0
        self._member_started = 0.0
        self._safe = 0  # bytes of the current file in finished (fsynced) members
        self.saved = 0  # lines in finished members
        self._member_lines = 0
        #: When the open member is due to be finished (``time.time()``; None: no member open). An owner with
        #: an event loop arms a timer for it, so a quiet capture is on disk ``flush_interval`` after its line.
        self.due: float | None = None
        self.members = 0  # members started: tells a timer whether the member it was armed for is still open
        self.failed: CaptureError | None = None

    @property
    def current(self) -> str:
        """The file being written ('' between files)."""
        return self._path

    def write(self, data: bytes, lines: int) -> None:
        """Append ``data`` (complete, prefixed lines); rotates first when the file is due."""
        self._check()
        try:
            self._write(data, lines)
        except OSError as err:
            raise self._fail(err) from err

    def _write(self, data: bytes, lines: int) -> None:
        self.lines += lines  # counted before the disk is touched: lost if it fails
        now = time.time()
        if self._raw is not None and (now - self._opened >= self.rotate_seconds or self._raw.tell() >= self.rotate_bytes):
            self.rotate()
        if self._raw is None:
            self._open(now)
        if self._gz is None:
            assert self._raw is not None
            self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=int(now))
            self._member_started = now
            self.due = now + self.flush_interval
            self.members += 1
        self._gz.write(data)
        self._member_lines += lines
        if now - self._member_started >= self.flush_interval:
            self.finish_member()

    def tick(self) -> None:
        """Called periodically: finish a member that is due and rotate a file that is due even when idle."""
        self._check()
        now = time.time()
        try:
            if self._gz is not None and now - self._member_started >= self.flush_interval:
                self.finish_member()
            if self._raw is not None and now - self._opened >= self.rotate_seconds:
                self.rotate()
        except OSError as err:
            raise self._fail(err) from err

    def flush(self) -> None:
        """Finish the member in progress now (the owner's timer at :attr:`due`), failing as :meth:`write`."""
        self._check()
        try:
            self.finish_member()
        except OSError as err:
            raise self._fail(err) from err

    def finish_member(self) -> None:
        """Close the gzip member in progress (its bytes are then safe on disk)."""
        if self._gz is not None:
            self._gz.close()  # writes the member's trailer; the file stays open
            self._gz = None
            self.due = None
            assert self._raw is not None
            self._raw.flush()
            os.fsync(self._raw.fileno())
            if os.fstat(self._raw.fileno()).st_nlink == 0:  # unlinked: --dir removed, or the file deleted
                raise FileNotFoundError(errno.ENOENT, "the file was removed while being written (was --dir deleted?)")
            self._safe = self._raw.tell()
            self.saved += self._member_lines
            self._member_lines = 0

    def rotate(self) -> None:
        """Finish the current file (rename it from .part); the next write starts a new one."""
        if self._raw is None:
            return
        self.finish_member()
        self._raw.close()
        self._raw = None
        final = self._path[: -len(".part")]
        os.replace(self._path, final)
        self.files.append(final)
        self._path = ""

    def close(self) -> None:
        """Finish everything (on SIGTERM, Ctrl-C or the end of --duration); nothing to do after a failure."""
        if self.failed is not None:
            return
        try:
            self.rotate()
        except OSError as err:
            raise self._fail(err) from err

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed

    def _fail(self, err: OSError) -> CaptureError:
        """Keep what is safe after a failed write: cut the file back to its finished members and finish it."""
        path = self._path or self.directory
        self._member_lines = 0
        self.due = None
        if self._gz is not None:
            self._gz.fileobj = None  # type: ignore[assignment]  # drop the member unfinished: close() writes nothing
            self._gz = None
        if self._raw is not None:
            try:
                self._raw.close()  # its buffer may fail to flush again: the truncate below drops it anyway
            except OSError:
                pass
            self._raw = None
        if self._path:
            try:
                if self._safe:
                    os.truncate(self._path, self._safe)
                    final = self._path[: -len(".part")]
                    os.replace(self._path, final)
                    self.files.append(final)
                else:
                    os.remove(self._path)
            except OSError:
                pass  # left as .part: the next recorder of this capture keeps its complete members
            self._path = ""
        self.failed = CaptureError(path, err, self.saved, self.lines - self.saved)
        return self.failed

    def _open(self, now: float) -> None:
        name = capture_file_name(self.capture, now, self.seq)
        self.seq += 1
        self._path = os.path.join(self.directory, name + ".part")
        self._raw = open(self._path, "xb")
        self._safe = 0
        self._opened = now
