"""A small in-memory writer: reserve a token, write rows, complete, publish.

Used for streams that live only in a writer's memory (typing, the caches
stream when no database backs it), in tests and in benchmarks. It follows
the id-generator contract: tokens are reserved in order, complete in any
order (success or rollback), and the position advances to the largest token
below which everything completed; listeners get ``(stream, writer, old,
new)`` synchronously, exactly like ``factstream.ids`` listeners.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from .memory_source import MemoryUpdateSource

__all__ = ["LocalStream"]

Listener = Callable[[str, str, int, int], None]


class LocalStream:
    """An in-memory stream written by this process (see module doc)."""

    def __init__(
        self, name: str, instance_name: str, *, start: int = 0, source: MemoryUpdateSource | None = None
    ) -> None:
        self.name = name
        self.instance_name = instance_name
        self.source = source or MemoryUpdateSource()
        self._next = start
        self._position = start
        self._pending: list[int] = []  # reserved, not completed (heap)
        self._done: set[int] = set()
        self._listeners: list[Listener] = []

    def add_listener(self, cb: Listener) -> None:
        """``cb(stream, writer, old, new)`` whenever the position advances."""
        self._listeners.append(cb)

    def current_token(self) -> int:
        """Largest token with everything at or below it completed."""
        return self._position

    def reserve(self) -> int:
        """Reserve the next token (complete it later with :meth:`complete`)."""
        self._next += 1
        heapq.heappush(self._pending, self._next)
        return self._next

    def complete(self, token: int, rows: Iterable[Any] | None = ()) -> None:
        """Complete ``token`` with ``rows`` (None or empty = rolled back, a hole)."""
        if rows:
            for row in rows:
                self.source.add(self.instance_name, token, row)
        self._done.add(token)
        pending = self._pending
        new = self._position
        while pending and pending[0] in self._done:
            t = heapq.heappop(pending)
            self._done.discard(t)
            new = t
        if new > self._position:
            old, self._position = self._position, new
            for cb in self._listeners:
                cb(self.name, self.instance_name, old, new)

    def write(self, rows: Iterable[Any]) -> int:
        """Reserve, write ``rows`` at one token and complete; returns the token."""
        if self._pending:
            token = self.reserve()
            self.complete(token, list(rows))
            return token
        # Nothing in flight: the new token completes at once (the hot path).
        token = self._next = self._next + 1
        add, inst = self.source.add, self.instance_name
        for row in rows:
            add(inst, token, row)
        old, self._position = self._position, token
        for cb in self._listeners:
            cb(self.name, inst, old, token)
        return token

    def write_many(self, facts: Iterable[Iterable[Any]]) -> int:
        """Write each of ``facts`` (the rows of one fact) at its own next token, in order; returns the last token.

        The same tokens and rows as one :meth:`write` per fact (an empty fact
        is a hole), but the listeners hear the position move once, to the
        last token, so a publisher turns the whole run into pages of
        commands instead of one publication per fact (a writer's batch, as
        Synapse persists events in batches); a hole inside the run needs no
        POSITION of its own, the next row's token closes it. Returns the
        current token when ``facts`` is empty.
        """
        if self._pending:
            # Reservations in flight hold the position back: each fact completes as write() would.
            token = self._position
            for rows in facts:
                token = self.write(rows)
            return token
        token = done = self._next
        add, inst = self.source.add, self.instance_name
        try:
            for rows in facts:
                token += 1
                for row in rows:
                    add(inst, token, row)
                done = token
        finally:
            # A failure (a fact's rows raising as they are iterated) leaves the tokens up to the failing one
            # used, as write() leaves its token; the facts written before it are announced all the same.
            self._next = token
            if done > self._position:
                old, self._position = self._position, done
                for cb in self._listeners:
                    cb(self.name, inst, old, done)
        return done
