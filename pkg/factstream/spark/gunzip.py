"""gzip decompression that gives everything up to where a file breaks.

A ``.log.gz`` is a sequence of gzip members (``factstream record`` finishes
one every ``--flush-interval``). A file cut short (a recorder killed inside
a member, a copy interrupted, a file still being written) still holds
everything before the cut; :class:`Gunzip` decompresses it as a stream,
member by member (``zlib.decompressobj(wbits=31)``), and gives all of it,
the last line as far as it goes included, before saying that the file is
truncated. Python's ``gzip.GzipFile`` raises instead, and whatever its
buffered reads had decompressed since the last read returned is lost
(up to a whole read: tens of KiB of lines, or every line of a small file).

Damage inside a member (corrupt data, a wrong CRC or length, bytes after a
member that start no member) ends the stream where zlib notices it: the
output up to that point is kept to the byte (:func:`_salvage`), whatever
the sizes of the reads. Zero bytes between or after members are padding
(gzip(1) and Python's gzip skip them too).

Imports neither pyarrow nor pyspark: ``factstream decode`` reads with it.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

__all__ = ["Gunzip", "GunzipRaw", "TRUNCATED"]

#: Compressed bytes read from the file at a time.
_IN = 256 * 1024
#: Compressed bytes fed at a time while finding where damage starts (then one byte at a time).
_STEP = 4096
#: What EOFError says when the file ends inside a member (the words of Python's gzip module).
TRUNCATED = "Compressed file ended before the end-of-stream marker was reached"


class Gunzip:
    """The decompressed bytes of a gzip stream of any number of members, as far as they go.

    ``read(n)`` gives up to about ``n`` bytes, b"" at the end; at the end
    ``error`` says why it ended if not at the end of a whole last member:
    EOFError (truncated: every byte before the cut was given, the last line
    included), ``zlib.error`` (corrupt: every byte before the damage was
    given), or the OSError of ``read_raw``.
    """

    def __init__(self, read_raw: Callable[[int], bytes], limit: int | None = None) -> None:
        self._read_raw = read_raw
        self._left = limit  # compressed bytes still to read (None: to the end of the file)
        self._d: zlib._Decompress | None = None  # None: between members
        self._tail = b""  # compressed bytes read, not yet fed
        self._raw_end = False
        self._done = False
        self._extra: list[bytes] = []  # what a salvage gave beyond n
        self.error: BaseException | None = None

    @property
    def truncated(self) -> bool:
        """Whether the stream ended inside a member (or its header): nothing after the cut was damaged."""
        return isinstance(self.error, EOFError)

    def _more(self) -> bytes:
        if self._raw_end:
            return b""
        want = _IN if self._left is None else min(_IN, self._left)
        data = self._read_raw(want) if want > 0 else b""
        if not data:
            self._raw_end = True
            return b""
        if self._left is not None:
            self._left -= len(data)
        return bytes(data)

    def read(self, n: int) -> bytes:
        """Up to about ``n`` decompressed bytes (more only once, where damage was found); b"" at the end."""
        if self._extra:
            data = self._extra.pop(0)
            return data
        out: list[bytes] = []
        got = 0
        while got < n and not self._done:
            if not self._tail:
                try:
                    self._tail = self._more()
                except OSError as err:
                    self.error, self._done = err, True
                    break
            if self._d is None:  # between members: zero bytes are padding, anything else starts one
                self._tail = self._tail.lstrip(b"\0")
                if not self._tail:
                    if self._raw_end:
                        self._done = True  # the end of the last whole member: the file is whole
                    continue
                self._d = zlib.decompressobj(wbits=31)
            d = self._d
            saved = d.copy()
            try:
                data = d.decompress(self._tail, n - got)
            except zlib.error as err:
                data = _salvage(saved, self._tail)
                self.error, self._done = err, True
            else:
                if d.eof:  # this member is whole: the next one starts in what is left
                    self._tail, self._d = d.unused_data, None
                else:
                    self._tail = d.unconsumed_tail
                    if not data and not self._tail and self._raw_end:
                        self.error, self._done = EOFError(TRUNCATED), True  # everything was given
            if data:
                out.append(data)
                got += len(data)
        if not out:
            return b""
        if got > n and len(out) > 1:  # only a salvage overshoots: give it on the next call
            self._extra.append(out.pop())
        return out[0] if len(out) == 1 else b"".join(out)


def _salvage(d: zlib._Decompress, data: bytes) -> bytes:
    """What ``d`` (copied before the call that failed on ``data``) gives from ``data`` before the damage.

    Fed in small steps, then one byte at a time, so the output does not depend on how the file was read.
    """
    out: list[bytes] = []
    for pos in range(0, len(data), _STEP):
        before = d.copy()
        try:
            out.append(d.decompress(data[pos: pos + _STEP]))
        except zlib.error:
            d = before
            for k in range(pos, min(pos + _STEP, len(data))):
                try:
                    out.append(d.decompress(data[k: k + 1]))
                except zlib.error:
                    return b"".join(out)
            break
        if d.eof:
            break
    return b"".join(out)


class GunzipRaw(io.RawIOBase):
    """A readable binary stream of :class:`Gunzip` (wrap it in ``io.BufferedReader`` to read lines).

    It ends (reads give b"") where the data ends or breaks; ``gunzip.error`` then says which.
    """

    def __init__(self, read_raw: Callable[[int], bytes]) -> None:
        super().__init__()
        self.gunzip = Gunzip(read_raw)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        data = self._rest or self.gunzip.read(len(view))
        n = min(len(view), len(data))
        view[:n] = data[:n]
        self._rest = data[n:]
        return n
