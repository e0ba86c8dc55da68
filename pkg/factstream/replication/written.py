"""Rows a writer has just committed, published without reading them back.

A publisher normally reads a completed range back from the stream's table:
the table is the truth, whatever happened to the transactions. A writer that
knows a transaction committed also knows exactly which rows it holds, so
reading them back (a query, every column decoded from JSON) only costs time.
:class:`WrittenRows` wraps the table's update source: the writer records a
committed transaction's tokens and rows *before* its ids complete, and the
publisher's request for a range those records cover whole is answered from
memory. Anything else goes to the table: a transaction whose outcome is not
known (an outage cut it off), ids reserved by someone else (another writer
on a shared PostgreSQL sequence), rows already forgotten. Recorded rows must
be what the table gives back (JSON values: lists, not tuples).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from ..streams.sources import UpdateSource, Updates, page

__all__ = ["WrittenRows"]


class WrittenRows:
    """An update source answering from the rows this writer committed, else from ``source``.

    ``capacity`` bounds the rows kept (oldest forgotten first); rows are
    dropped as soon as a request shows they were published.
    """

    def __init__(self, source: UpdateSource, instance_name: str, capacity: int = 100_000) -> None:
        self.source = source
        self.instance_name = instance_name
        self.capacity = capacity
        #: (first token, last token, that range's rows in token order), ranges ascending and apart
        self._ranges: deque[tuple[int, int, list[tuple[int, Any]]]] = deque()
        self._rows = 0
        #: the largest token any record claimed
        self._high = 0
        #: requests answered from memory / from the table (for tests and curious operators)
        self.from_memory = 0
        self.from_source = 0

    def record(self, first: int, last: int, updates: Sequence[tuple[int, Any]]) -> None:
        """Tokens ``first``..``last`` were reserved by this writer and committed holding exactly ``updates``.

        ``updates`` are ``(token, row)`` in token order (a token without
        rows is a hole). Call it after the commit, before the ids complete.
        The claim is that no other id of this writer lies in ``first..last``:
        reserve one transaction's ids before the next one's (two fetches in
        flight from one sequence can interleave). A range overlapping or
        below one recorded before breaks that claim for both: the records are
        forgotten and this one is not kept (the table answers, until new
        ranges follow each other again).
        """
        if first > last:
            raise ValueError(f"empty token range {first}..{last}")
        ranges = self._ranges
        if first <= self._high:
            ranges.clear()
            self._rows = 0
            self._high = max(self._high, last)
            return
        self._high = last
        ranges.append((first, last, list(updates)))
        self._rows += len(updates)
        while self._rows > self.capacity and ranges:
            self._rows -= len(ranges.popleft()[2])

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        """Rows of ``instance_name`` in ``(from_token, upto_token]``, at most about ``limit`` (see ``UpdateSource``)."""
        if instance_name == self.instance_name:
            got = self._recorded(from_token, upto_token, limit)
            if got is not None:
                self.from_memory += 1
                return got
        self.from_source += 1
        return await self.source.get_updates(instance_name, from_token, upto_token, limit)

    def _recorded(self, from_token: int, upto_token: int, limit: int) -> Updates | None:
        ranges = self._ranges
        while ranges and ranges[0][1] <= from_token:  # published: no request goes below from_token again
            self._rows -= len(ranges.popleft()[2])
        if not ranges or ranges[0][0] > from_token + 1 or upto_token <= from_token:
            return None
        out: list[tuple[int, Any]] = []
        expect = ranges[0][0]
        for first, last, updates in ranges:
            if first != expect:
                return None  # tokens between two records were not recorded: the table knows
            if first > from_token and last <= upto_token:
                out.extend(updates)
            else:
                out.extend(u for u in updates if from_token < u[0] <= upto_token)
            if last >= upto_token:
                return page(out, upto_token, limit)
            expect = last + 1
        return None
