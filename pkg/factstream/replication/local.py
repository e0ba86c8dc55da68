"""A small in-memory writer: reserve a token, write rows, complete, publish.

Used for streams that live only in a writer's memory (typing, the caches
stream when no database backs it), in tests and in benchmarks. It follows
the id-generator contract: tokens are reserved in order, complete in any
order (success or rollback), and the position advances to the largest token
below which everything completed; listeners get ``(stream, writer, old,
new)`` synchronously, exactly like ``factstream.ids`` listeners.

``write`` (reserve, write and complete at once, the common case) is the
relay's :class:`factstream.replication._relay.LocalWriter`, compiled in a
compiled build, so a write costs no Python frame of its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from . import _relay
from .memory_source import MemoryUpdateSource

__all__ = ["LocalStream"]

Listener = Callable[[str, str, int, int], None]


class LocalStream:
    """An in-memory stream written by this process (see module doc)."""

    #: ``write(rows) -> token``: reserve the next token, write ``rows`` at it and complete it. With
    #: reservations in flight it completes like :meth:`reserve` + :meth:`complete` (the position waits
    #: for them); otherwise at once, in the relay (no Python frame in a compiled build).
    write: Callable[[Iterable[Any]], int]

    def __init__(
        self,
        name: str,
        instance_name: str,
        *,
        start: int = 0,
        source: MemoryUpdateSource | None = None,
        relay: ModuleType | None = None,
    ) -> None:
        self.name = name
        self.instance_name = instance_name
        self._source = source or MemoryUpdateSource(relay=relay)
        self._pending: list[int] = []  # reserved, not completed (heap)
        self._done: set[int] = set()
        self._listeners: list[Listener] = []
        #: The token counters (``next``, ``position``) and the hot path of ``write``; ``relay`` picks the twin.
        self._core = (relay or _relay).LocalWriter(
            name, instance_name, self._source.add, self._listeners, self._pending, self._write_reserved, start
        )
        self.write = self._core.write

    @property
    def source(self) -> MemoryUpdateSource:
        """Where the rows are kept (and the publisher reads them)."""
        return self._source

    @source.setter
    def source(self, value: MemoryUpdateSource) -> None:
        self._source = value
        self._core.add = value.add

    @property
    def _next(self) -> int:
        return int(self._core.next)

    @_next.setter
    def _next(self, value: int) -> None:
        self._core.next = value

    @property
    def _position(self) -> int:
        return int(self._core.position)

    @_position.setter
    def _position(self, value: int) -> None:
        self._core.position = value

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

    def _write_reserved(self, rows: Iterable[Any]) -> int:
        """``write`` while reservations are in flight: reserve and complete (the position waits for them)."""
        token = self.reserve()
        self.complete(token, list(rows))
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
        return int(self._core.write_many(facts))
