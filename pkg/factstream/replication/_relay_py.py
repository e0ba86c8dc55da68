"""The replication relay's hot loops, pure-Python twin (the readable specification).

Both ends of a replication link repeat the same small steps for every row:
the writer turns the rows of a completed token range into RDATA (``batch``
rows for all but the last row of a token) and closes a range ending without
rows with POSITION; the reader folds a run of RDATA for one (stream, writer)
into facts (all rows of one token), dropping the ones at or below its
position. These loops are here, away from the publisher and the follower
that own the state, so that a compiled build runs them as C
(``factstream.replication._relay_c``, same names and behaviour) and every row costs no
Python call of its own.

* :class:`RowWindow` holds the recent rows of an in-memory stream (the
  storage of ``MemoryUpdateSource``): ``add`` as a writer completes,
  ``get_updates_now`` as the publisher (or a catching-up reader) asks.
* :class:`LocalWriter` is the hot path of ``LocalStream.write``: a token
  reserved, written and completed at once.
* :class:`StreamEmitter` is one published stream's progress (``sent``,
  ``target``, ``rows``); :meth:`StreamEmitter.commands` turns updates into
  commands and :meth:`StreamEmitter.publish_now` drains a synchronous source
  into the sinks.
* :class:`Router` is a writer's published streams by name; its ``notify``
  is the id generator's listener; :class:`Broadcast` is the sink handing
  the commands to every replicating connection.
* :func:`gather` folds consecutive RDATA of one (stream, writer) into facts;
  :class:`Fanout` holds the reader's handlers and queues and delivers facts
  to them in order.
* :func:`tally` counts commands by name (one metric update per name);
  :func:`same_source` checks that a carrier's page is of one (stream, writer).
* :class:`RowParser` turns a decoded row into its typed row; ``gather``
  given one builds the rows of plain row classes (see
  :func:`~factstream.streams.rows.wire_fields`) with no Python call per row
  in the compiled twin, and hands every other row to its ``fallback``.

Nothing here does I/O; the only contact with the event loop is ``put_nowait``
on the queues the follower hands to :class:`Fanout`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from ..commands import _UNSET, Command, PositionCommand, RdataCommand
from ..streams.rows import Row, wire_fields, wire_kinds
from ..streams.sources import Updates, UpdatesUnavailable, page

__all__ = [
    "RowWindow", "LocalWriter", "StreamEmitter", "Router", "Broadcast", "Fanout", "RowParser", "gather", "same_source", "tally",
    "Fact", "Sink", "SyncGet",
]

#: ``(token, rows)``: every row a writer wrote at one token.
Fact = tuple[int, list[Any]]
#: Receives each batch of outgoing commands (the hub's broadcast).
Sink = Callable[[list[Command]], None]
#: ``get_updates_now(instance, from_token, upto_token, limit) -> (updates, upto, limited)``.
SyncGet = Callable[[str, int, int, int], tuple[list[tuple[int, Any]], int, bool]]


def _wire(row: Any) -> Any:
    return row.to_wire() if isinstance(row, Row) else row


def _peek(cmd: RdataCommand) -> Any:
    """The row of ``cmd``, for a parser: decoded from the bytes a codec left, without ``cmd`` keeping it.

    What is handed out is the parsed row, not the decoded one, so the command
    stays as received (re-encodable from its bytes, and in the compiled
    twin out of the cycle collector's lists).
    """
    if cmd._row is _UNSET and cmd._raw is not None and cmd._loads is not None:
        return cmd._loads(cmd._raw)
    return cmd.row


class RowWindow:
    """The recent rows of one in-memory stream, per writer instance, bounded.

    Rows are kept in token order per instance; once an instance holds more
    than ``2 * capacity`` rows the oldest are forgotten down to ``capacity``
    (never splitting a token) and the last forgotten token becomes that
    instance's floor: asking for rows after a token below the floor raises
    :class:`~factstream.streams.sources.UpdatesUnavailable`, so a reader
    knows it lost facts instead of silently skipping them.
    """

    __slots__ = ("capacity", "_tokens", "_rows", "_floor")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._tokens: dict[str, list[int]] = {}
        self._rows: dict[str, list[Any]] = {}
        self._floor: dict[str, int] = {}

    def add(self, instance_name: str, token: int, row: Any) -> None:
        """Record ``row`` written by ``instance_name`` at ``token`` (before the token completes)."""
        tokens = self._tokens.setdefault(instance_name, [])
        rows = self._rows.setdefault(instance_name, [])
        if tokens and token < tokens[-1]:
            # Out-of-order reservation completing: keep the list sorted.
            i = bisect.bisect_right(tokens, token)
            tokens.insert(i, token)
            rows.insert(i, row)
        else:
            tokens.append(token)
            rows.append(row)
        if len(tokens) > self.capacity * 2:
            cut = len(tokens) - self.capacity
            while cut < len(tokens) and tokens[cut] == tokens[cut - 1]:
                cut += 1
            self._floor[instance_name] = tokens[cut - 1]
            del tokens[:cut]
            del rows[:cut]

    def get_updates_now(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        """Rows of ``instance_name`` in ``(from_token, upto_token]``, paged by ``limit`` (see ``UpdateSource``)."""
        floor = self._floor.get(instance_name)
        if floor is not None and from_token < floor:
            raise UpdatesUnavailable(
                f"facts of {instance_name} after {from_token} are no longer in memory (kept from {floor}); "
                "raise MemoryUpdateSource capacity or back the stream with a table"
            )
        tokens = self._tokens.get(instance_name)
        if not tokens:
            return [], upto_token, False
        last = tokens[-1]
        if last == upto_token and (len(tokens) == 1 or tokens[-2] <= from_token) and last > from_token:
            # The writer's hot path: exactly the row just added.
            return [(last, self._rows[instance_name][-1])], upto_token, False
        lo = bisect.bisect_right(tokens, from_token)
        hi = bisect.bisect_right(tokens, upto_token)
        rows = self._rows[instance_name]
        if hi - lo <= limit:
            return [(tokens[i], rows[i]) for i in range(lo, hi)], upto_token, False
        return page([(tokens[i], rows[i]) for i in range(lo, hi)], upto_token, limit)


class LocalWriter:
    """``write(rows)``: ``LocalStream.write``, the token counters it moves, and its listeners.

    ``next`` is the last token handed out and ``position`` the stream's
    position; ``pending`` is the stream's list of reserved, uncompleted tokens
    (shared): while it is not empty the position cannot move past them, and
    ``write`` hands ``rows`` to ``fallback`` (which reserves and completes).
    Otherwise the next token is written and completed at once: each row goes
    to ``add(instance, token, row)``, then ``listeners`` (shared) hear
    ``(name, instance, old, token)``.
    """

    __slots__ = ("name", "instance", "add", "listeners", "pending", "fallback", "next", "position")

    def __init__(
        self,
        name: str,
        instance: str,
        add: Callable[[str, int, Any], None],
        listeners: list[Callable[[str, str, int, int], None]],
        pending: list[int],
        fallback: Callable[[Any], int],
        start: int,
    ) -> None:
        self.name = name
        self.instance = instance
        self.add = add
        self.listeners = listeners
        self.pending = pending
        self.fallback = fallback
        self.next = start
        self.position = start

    def write(self, rows: Any) -> int:
        """Write ``rows`` at the next token and complete it; returns the token."""
        if self.pending:
            return self.fallback(rows)
        token = self.next = self.next + 1
        add, inst = self.add, self.instance
        for row in rows:
            add(inst, token, row)
        old, self.position = self.position, token
        for cb in self.listeners:
            cb(self.name, inst, old, token)
        return token

    def write_many(self, facts: Any) -> int:
        """Write each of ``facts`` at its own next token; the listeners hear one move, to the last.

        Only without reservations in flight (the caller checks ``pending``).
        If a fact's rows raise, the tokens up to the failing one stay used and
        the facts before it are announced all the same. Returns the position.
        """
        token = done = self.next
        add, inst = self.add, self.instance
        try:
            for rows in facts:
                token += 1
                for row in rows:
                    add(inst, token, row)
                done = token
        finally:
            self.next = token
            if done > self.position:
                old, self.position = self.position, done
                for cb in self.listeners:
                    cb(self.name, inst, old, done)
        return self.position


class StreamEmitter:
    """What one writer has published of one stream, and the commands that publish more.

    ``sent`` is the position published so far (the answer to REPLICATE),
    ``target`` the position the writer reached (``sent <= target``), ``rows``
    the number of rows published. ``sync_get`` is the source's synchronous
    ``get_updates_now`` when it has one (the in-memory source), else None and
    the publisher drains the source asynchronously, feeding pages to
    :meth:`commands`. ``sinks`` is the publisher's list of sinks (shared, so
    sinks added later are seen).
    """

    __slots__ = ("name", "instance", "source", "sent", "target", "rows", "sync_get", "sinks", "page_limit")

    def __init__(
        self,
        name: str,
        instance: str,
        source: Any,
        sent: int,
        sync_get: SyncGet | None,
        sinks: list[Sink],
        page_limit: int,
    ) -> None:
        self.name = name
        self.instance = instance
        self.source = source
        self.sent = sent
        self.target = sent
        self.rows = 0
        self.sync_get = sync_get
        self.sinks = sinks
        self.page_limit = page_limit

    def commands(self, updates: Sequence[tuple[int, Any]], upto: int) -> list[Command]:
        """The commands publishing ``updates`` (``(token, row)`` in token order), up to ``upto``.

        Rows at or below ``sent`` are skipped (already published); the rows of
        one token become ``batch`` RDATA closed by an RDATA with the token; a
        range that ends past the last row (holes, rollbacks) is closed with
        ``POSITION last upto``. Moves ``sent`` to ``upto`` and counts the rows.
        """
        name, inst = self.name, self.instance
        n = len(updates)
        if n == 1 and upto == updates[0][0] > self.sent:
            # The common case: one row completing one fact.
            self.sent = upto
            self.rows += 1
            return [RdataCommand(name, inst, upto, _wire(updates[0][1]))]
        cmds: list[Command] = []
        last = self.sent
        i = 0
        while i < n:
            token = updates[i][0]
            j = i
            while j + 1 < n and updates[j + 1][0] == token:
                j += 1
            if token > last:
                for k in range(i, j):
                    cmds.append(RdataCommand(name, inst, None, _wire(updates[k][1])))
                cmds.append(RdataCommand(name, inst, token, _wire(updates[j][1])))
                last = token
            i = j + 1
        if upto > last:
            cmds.append(PositionCommand(name, inst, last, upto))
        if upto > self.sent:
            self.sent = upto
        self.rows += n
        return cmds

    def publish_now(self) -> None:
        """Publish ``(sent, target]`` from the synchronous source into every sink, in pages."""
        sync_get = self.sync_get
        if sync_get is None:
            raise TypeError(f"stream {self.name!r} has no synchronous source; drain it asynchronously")
        while self.sent < self.target:
            updates, upto, _limited = sync_get(self.instance, self.sent, self.target, self.page_limit)
            cmds = self.commands(updates, upto)
            if cmds:
                for sink in self.sinks:
                    sink(cmds)


class Router:
    """A writer's published streams by name; :meth:`notify` publishes them as they advance.

    ``streams`` is the publisher's dict (shared, so streams added later are
    seen). A stream without a synchronous source is handed to ``on_async``
    (the publisher's background drain) instead.
    """

    __slots__ = ("instance", "streams", "on_async")

    def __init__(self, instance: str, streams: dict[str, StreamEmitter], on_async: Callable[[str], None]) -> None:
        self.instance = instance
        self.streams = streams
        self.on_async = on_async

    def notify(self, stream_name: str, instance_name: str, old: int, new: int) -> None:
        """Id-generator listener: ``instance_name``'s position in ``stream_name`` moved to ``new``.

        Only this writer's own streams count, and only forward moves.
        """
        st = self.streams.get(stream_name)
        if st is None or instance_name != self.instance or new <= st.target:
            return
        st.target = new
        if st.sync_get is not None:
            st.publish_now()
        else:
            self.on_async(stream_name)


class Broadcast:
    """``broadcast(cmds)``: a publisher's sink handing each batch to every connection in ``targets``.

    ``targets`` is the hub's list of replicating connections (shared, so
    connections added or removed later are seen); each gets
    ``send_many(cmds)``, in list order, or, while its ``send_queue`` is a
    list (see :class:`~factstream.replication.carrier.Connection`), has
    ``cmds`` appended to it, which is what its ``send_many`` would do.
    """

    __slots__ = ("targets",)

    def __init__(self, targets: list[Any]) -> None:
        self.targets = targets

    def __call__(self, cmds: list[Command]) -> None:
        for conn in self.targets:
            queue = getattr(conn, "send_queue", None)
            if type(queue) is list:
                queue.extend(cmds)
            else:
                conn.send_many(cmds)


class Fanout:
    """A reader's handlers and update queues, and the in-order delivery of facts to them.

    ``handlers`` holds ``(stream or None, handler)``; it is replaced, never
    changed in place, so a delivery in progress notices a handler added or
    removed by a handler and uses the new list from the next fact on.
    ``queues`` receive ``make_update(stream, writer, token, rows)``. A
    handler that raises is reported to ``on_error(handler, stream, writer,
    token)`` from inside the ``except`` block (so it may log the traceback)
    and delivery goes on.
    """

    __slots__ = ("handlers", "queues", "make_update", "on_error")

    def __init__(self, make_update: Callable[[str, str, int, list[Any]], Any], on_error: Callable[[Any, str, str, int], None]) -> None:
        self.handlers: list[tuple[str | None, Callable[[str, str, int, list[Any]], Any]]] = []
        self.queues: list[Any] = []
        self.make_update = make_update
        self.on_error = on_error

    def deliver(self, key: Any, facts: Sequence[Fact]) -> None:
        """Hand each fact of ``key`` (its ``stream`` and ``writer``) to the handlers and queues, in order.

        After each fact ``key.rows`` grows by its rows and ``key.position``
        becomes its token, so a handler sees the position before its fact.
        """
        stream, writer = key.stream, key.writer
        source = self.handlers
        handlers = [h for only, h in source if only is None or only == stream]
        for token, rows in facts:
            if self.handlers is not source:
                source = self.handlers
                handlers = [h for only, h in source if only is None or only == stream]
            for handler in handlers:
                try:
                    handler(stream, writer, token, rows)
                except Exception:
                    self.on_error(handler, stream, writer, token)
            if self.queues:
                update = self.make_update(stream, writer, token, rows)
                for q in self.queues:
                    q.put_nowait(update)
            key.rows += len(rows)
            key.position = token


class RowParser:
    """``parser(row)``: the typed ``row_type`` of a decoded row, as ``row_type.from_wire(row)`` gives it.

    A row of the exact shape a plain class is built from (a ``list`` or
    ``tuple`` of its field count; for an events-style class, ``[kind,
    fields]`` with a known kind whose class is plain) is built here, with
    the same values as ``from_wire`` would give; every other row goes to
    ``fallback(row)`` (default ``row_type.from_wire``, so a malformed row
    raises its ProtocolError there). A class that ``wire_fields`` and
    ``wire_kinds`` do not describe always goes to ``fallback``.

    The compiled twin allocates the row and fills its slots directly (and
    leaves a row holding only strings, numbers and None untracked by the
    cycle collector, as CPython does for such tuples).
    """

    __slots__ = ("row_type", "fallback", "_n", "_kinds", "_subs")

    def __init__(self, row_type: type[Row], fallback: Callable[[Any], Any] | None = None) -> None:
        self.row_type = row_type
        self.fallback = fallback if fallback is not None else row_type.from_wire
        self._kinds = wire_kinds(row_type)
        fields = wire_fields(row_type) if self._kinds is None else None
        self._n = len(fields) if fields is not None else -1
        #: kind class -> its field count (-1: built by its own from_wire), found on first use.
        self._subs: dict[type, int] = {}

    def __call__(self, row: Any) -> Any:
        if type(row) is list or type(row) is tuple:
            if self._kinds is not None:
                if len(row) == 2:
                    kind, data = row
                    if type(kind) is str and (type(data) is list or type(data) is tuple):
                        kind_cls = self._kinds.get(kind)
                        if kind_cls is not None and len(data) == self._sub(kind_cls):
                            return self.row_type(kind, kind_cls(*data))  # type: ignore[call-arg]
            elif len(row) == self._n:
                return self.row_type(*row)
        return self.fallback(row)

    def _sub(self, kind_cls: type) -> int:
        n = self._subs.get(kind_cls)
        if n is None:
            fields = wire_fields(kind_cls)
            n = self._subs[kind_cls] = len(fields) if fields is not None else -1
        return n


def gather(
    cmds: Sequence[Command],
    start: int,
    position: int | None,
    batch: list[Any],
    parse: Callable[[Any], Any] | None = None,
    limit: int | None = None,
) -> tuple[int, list[Fact], list[Any], int]:
    """Fold the run of RDATA for one (stream, writer) that begins at ``cmds[start]`` into facts.

    The run is every following command that is an RDATA of the same stream
    and writer as ``cmds[start]`` (which must be an RDATA). Each row is
    decoded, passed through ``parse`` when given (a :class:`RowParser` is
    called without a Python call per row in the compiled twin; the command
    then does not keep the decoded row, see ``_peek``), and appended to ``batch``
    (the rows already waiting for their token); an RDATA with a numeric
    token closes the batch into the fact ``(token, rows)``. With a
    ``position``, facts at or below it, or at or below an earlier fact of the
    run, are dropped and their rows counted as stale; with None every fact is
    kept (the caller decides).

    With a ``limit``, at most that many commands are taken (the caller goes
    on from ``end``; a reader hands facts on in such bounded runs, so fewer
    of them live long enough for the cycle collector to move them to its
    older generations).

    Returns ``(end, facts, batch, stale)``: ``end`` is the index after the
    run, ``facts`` the kept facts in order, ``batch`` the rows still waiting
    for their token (a new list whenever a fact closed rows that were waiting) and ``stale`` the
    number of dropped rows.
    """
    first = cmds[start]
    stream, writer = first.stream_name, first.instance_name  # type: ignore[attr-defined]
    facts: list[Fact] = []
    stale = 0
    n = len(cmds)
    if limit is not None:
        if limit < 1:
            raise ValueError("gather: limit must be at least 1")
        n = min(n, start + limit)
    i = start
    while i < n:
        cmd = cmds[i]
        if type(cmd) is not RdataCommand or cmd.stream_name != stream or cmd.instance_name != writer:
            break
        row = cmd.row if parse is None else parse(_peek(cmd))
        token = cmd.token
        i += 1
        if token is None:
            batch.append(row)
            continue
        if batch:
            batch.append(row)
            rows, batch = batch, []
        else:
            rows = [row]  # nothing waited: ``batch`` stays the empty list it is
        if position is None:
            facts.append((token, rows))
        elif token > position:
            facts.append((token, rows))
            position = token
        else:
            stale += len(rows)
    return i, facts, batch, stale


def same_source(cmds: Sequence[Command]) -> tuple[int, bool]:
    """How many of ``cmds``, from the first, are RDATA or POSITION of ``cmds[0]``'s stream and writer.

    Returns ``(n, has_position)``: ``cmds[n]`` is the first command that is
    not (``n == len(cmds)`` when all are), and whether a POSITION is among
    the first ``n``. A carrier checks a received page of one (stream,
    writer) with it before handing the page on. ``cmds`` must not be empty.
    """
    first = cmds[0]
    stream, writer = first.stream_name, first.instance_name  # type: ignore[attr-defined]
    has_position = False
    for i, cmd in enumerate(cmds):
        kind = type(cmd)
        if kind is not RdataCommand and kind is not PositionCommand:
            return i, has_position
        if cmd.stream_name != stream or cmd.instance_name != writer:  # type: ignore[attr-defined]
            return i, has_position
        if kind is PositionCommand:
            has_position = True
    return len(cmds), has_position


def tally(cmds: Sequence[Command]) -> dict[str, int]:
    """How many of ``cmds`` there are of each command name."""
    counts: dict[str, int] = {}
    for cmd in cmds:
        name = cmd.NAME
        counts[name] = counts.get(name, 0) + 1
    return counts
