"""What one JetStream message holds: a page of wire lines, its message id, and reading it back.

A page is consecutive commands of one (stream, writer), each line exactly as
the codec writes it and ended by a newline (``wire.encode_lines``), so every
line-reading tool reads a stored message as it reads a TCP capture. A page
ends on a fact boundary, except when one fact alone does not fit in a message:
its rows are then cut into several pages.

The message id names the page by its first and last line, so that the same
lines published again (a retry, a writer re-publishing after a crash) get the
same id and JetStream stores them once:

* a line's key is ``<token>:<row index>`` for an RDATA row (the token of the
  fact the row belongs to, and its place among the fact's rows) and
  ``<new>:p<prev>`` for ``POSITION s w prev new``;
* a one-line page's id is ``<stream>:<writer>:<key>``, a longer one's
  ``<stream>:<writer>:<first key>..<last key>``; either may end in ``/r<seq>``
  (a fact re-published with fresh ids after a cut, see the writer).

Readers take from the id where a page starts and ends inside a fact, which is
all they need to join a fact cut across pages and to notice a cut one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ... import wire
from ...commands import Command, PositionCommand, RdataCommand

#: (fact token, row index) of a page's first or last line; the index is None for a POSITION.
LineKey = tuple[int, "int | None"]

_KEYS = re.compile(rb"(-?\d+):(\d+|p-?\d+)(?:\.\.(-?\d+):(\d+|p-?\d+))?(?:/r\d+)?$")


def decode_page(data: bytes) -> list[Command]:
    """The commands of one message, decoded by the codec in one call (raises ProtocolError).

    A last line without its newline (a message written by another tool) is
    read too; blank lines are ignored.
    """
    if data[-1:] != b"\n":
        data += b"\n"
    return wire.LineDecoder(max_line_length=len(data) + 1).feed(data)


def line_key(cmd: Command, token: int, index: int) -> str:
    """The key of ``cmd`` (an RDATA row ``index`` of fact ``token``, or a POSITION)."""
    if type(cmd) is PositionCommand:
        return f"{cmd.new_token}:p{cmd.prev_token}"
    return f"{token}:{index}"


def page_id(stream: str, writer: str, first: str, last: str, lines: int, suffix: str = "") -> str:
    """The message id of a page of ``lines`` lines from key ``first`` to key ``last``."""
    if lines == 1:
        return f"{stream}:{writer}:{first}{suffix}"
    return f"{stream}:{writer}:{first}..{last}{suffix}"


def parse_keys(msg_id: bytes) -> tuple[LineKey | None, LineKey | None]:
    """(first line's key, last line's key) from a message id; None where absent or malformed."""
    m = _KEYS.search(msg_id.strip())
    if m is None:
        return None, None
    first = int(m[1]), (None if m[2][:1] == b"p" else int(m[2]))
    if m[3] is None:
        return first, first
    return first, (int(m[3]), None if m[4][:1] == b"p" else int(m[4]))


def header_chain(raw: bytes | None) -> tuple[int | None, LineKey | None, LineKey | None]:
    """(``Fs-Prev``, first key, last key) of a raw header block; None where absent or bad."""
    if not raw:
        return None, None, None
    prev: int | None = None
    first = last = None
    i = raw.find(b"\r\nFs-Prev:")
    if i >= 0:
        end = raw.find(b"\r", i + 11)
        try:
            prev = int(raw[i + 11:end])
        except ValueError:
            prev = None
    j = raw.find(b"\r\nNats-Msg-Id:")
    if j >= 0:
        end = raw.find(b"\r", j + 15)
        first, last = parse_keys(raw[j + 15:end])
    return prev, first, last


def page_top(cmds: Sequence[Command], last: LineKey | None, prev: int | None) -> int:
    """The highest token a page reaches: its last fact or POSITION (a fact cut at its end: that fact)."""
    tail = cmds[-1] if cmds else None
    if last is not None and type(tail) is RdataCommand and tail.token is None:
        return last[0]
    return page_end(cmds, prev) or 0


def page_end(cmds: Sequence[Command], prev: int | None) -> int | None:
    """The token up to which a page holds complete facts (``prev`` when it holds none)."""
    for cmd in reversed(cmds):
        if type(cmd) is PositionCommand:
            return cmd.new_token
        token = cmd.token  # type: ignore[attr-defined]
        if token is not None:
            return int(token)
    return prev


def fact_units(cmds: Sequence[Command]) -> list[list[Command]]:
    """``cmds`` cut into facts (batch rows with their closing row) and single POSITIONs."""
    units: list[list[Command]] = []
    unit: list[Command] = []
    for cmd in cmds:
        unit.append(cmd)
        if type(cmd) is PositionCommand or cmd.token is not None:  # type: ignore[attr-defined]
            units.append(unit)
            unit = []
    if unit:
        units.append(unit)
    return units


class Page:
    """One page ready to publish: its payload, message id, the token before it and the last one in it."""

    __slots__ = ("payload", "msg_id", "prev", "end", "lines")

    def __init__(self, payload: bytes, msg_id: str, prev: int | None, end: int | None, lines: int) -> None:
        self.payload = payload
        self.msg_id = msg_id
        self.prev = prev
        self.end = end
        self.lines = lines


def build_pages(stream: str, writer: str, cmds: Sequence[Command], prev: int | None, max_bytes: int,
                fresh: tuple[int, str] | None = None) -> tuple[list[Page], list[Command]]:
    """``cmds`` (whole facts and POSITIONs of one (stream, writer)) as pages of at most ``max_bytes``.

    ``prev`` is the token published before them. Returns (pages, rows too
    large for any message); a fact with such a row is left out whole (readers
    find the hole through the chain and take the fact from the table). A fact
    larger than ``max_bytes`` is cut across pages by rows. ``fresh`` is
    ``(token, suffix)``: the pages holding that fact get the suffix on their id.
    """
    payload = wire.encode_lines(cmds)
    if len(payload) <= max_bytes and cmds:
        return [_page(stream, writer, cmds, payload, prev, fresh)], []
    pages: list[Page] = []
    too_large: list[Command] = []
    chunk: list[Command] = []
    size = 0
    for unit in fact_units(cmds):
        encoded = wire.encode_lines(unit)
        if size + len(encoded) > max_bytes and chunk:
            page = _page(stream, writer, chunk, None, prev, fresh)
            pages.append(page)
            prev = page.end
            chunk, size = [], 0
        if len(encoded) <= max_bytes:
            chunk.extend(unit)
            size += len(encoded)
            continue
        lines = [wire.encode(c) + b"\n" for c in unit]  # the page before it was closed just above
        token = page_end(unit, prev)
        if max(len(line) for line in lines) > max_bytes:
            # Left out whole; the next page's Fs-Prev (this fact's token) shows readers the hole.
            too_large.extend(c for c, line in zip(unit, lines) if len(line) > max_bytes)
            prev = token
            continue
        start = 0
        while start < len(unit):  # one fact over several pages, cut by rows
            end, size = start, 0
            while end < len(unit) and size + len(lines[end]) <= max_bytes:
                size += len(lines[end])
                end += 1
            part = unit[start:end]
            suffix = fresh[1] if fresh is not None and fresh[0] == token else ""
            first = f"{token}:{start}"
            last = f"{token}:{end - 1}"
            done = end == len(unit)
            pages.append(Page(b"".join(lines[start:end]), page_id(stream, writer, first, last, len(part), suffix),
                              prev, token if done else None, len(part)))
            start = end
        prev = token
        size = 0
    if chunk:
        pages.append(_page(stream, writer, chunk, None, prev, fresh))
    return pages, too_large


def _page(stream: str, writer: str, cmds: Sequence[Command], payload: bytes | None, prev: int | None,
          fresh: tuple[int, str] | None) -> Page:
    first_cmd = cmds[0]
    last_cmd = cmds[-1]
    end = page_end(cmds, prev)
    if type(first_cmd) is PositionCommand:
        first = line_key(first_cmd, 0, 0)
    else:
        token = next((c.token for c in cmds if type(c) is RdataCommand and c.token is not None), end)
        first = f"{token}:0"
    if type(last_cmd) is PositionCommand:
        last = line_key(last_cmd, 0, 0)
    else:
        k = len(cmds) - 1
        while k > 0 and type(cmds[k - 1]) is RdataCommand and cmds[k - 1].token is None:  # type: ignore[attr-defined]
            k -= 1
        last = f"{last_cmd.token}:{len(cmds) - 1 - k}"  # type: ignore[attr-defined]
    suffix = ""
    if fresh is not None and any(type(c) is RdataCommand and c.token == fresh[0] for c in cmds):
        suffix = fresh[1]
    return Page(payload if payload is not None else wire.encode_lines(cmds),
                page_id(stream, writer, first, last, len(cmds), suffix), prev, end, len(cmds))
