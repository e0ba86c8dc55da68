"""Reader side: positions per (stream, writer), batches, catch-up, in-order delivery.

The follower consumes RDATA and POSITION (handed over by the hub, from any
transport) and delivers rows to the application strictly in token order per
(stream, writer), each fact exactly once:

* ``batch`` rows are held per (stream, writer) until the row with the numeric
  token arrives, then delivered together at that token;
* rows at or below the known position are dropped (stale or duplicate),
  counted in ``factstream_dropped_rows`` and logged (rate-limited, see
  :mod:`factstream.replication.droplog`), like every other drop;
* ``POSITION s w prev new`` with ``prev`` ahead of the known position means
  facts were missed: they are fetched from the stream's update source in
  pages of ``page_limit`` (the database, or the writer for in-memory
  streams) while later commands for that (stream, writer) wait in order;
* a (stream, writer) seen for the first time starts at ``start_position``
  (e.g. 0 to replay everything the source holds) or, when that is None, at
  the first POSITION's ``new`` token (live only);
* ``POSITION s w prev new`` with ``new`` *below* the known position is a
  reset: for a stream whose rows live in the writer's memory (typing, ...)
  the writer restarted (WARNING), for a table-backed stream the database
  went back (ERROR). Either way the position becomes ``new``, reset
  handlers (:meth:`Follower.add_reset_handler`) are told ``(stream, writer,
  old, new)`` before any later row, and every row after ``new`` is
  delivered;
* when the stream's source can say how far the stream can have got
  (:class:`~factstream.streams.sources.HeadSource`, e.g. a table), a claim
  beyond that head (a POSITION, or an RDATA more than ``trust_window``
  past it) is checked against the database first: the follower moves only
  as far as the database backs, logs an ERROR naming the writer, the
  claimed and the verified position, and keeps waiting for the rest.

A transport may hand over a whole run of RDATA at once
(:meth:`Follower.on_rdata_many`, e.g. everything one socket read decoded);
the result is the same as one :meth:`Follower.on_rdata` per command, and the
per-row loop (decode, batches, stale check) is the relay's
(:func:`factstream.replication._relay.gather`, compiled in a compiled build).

Delivery: ``add_handler(fn, stream=None)`` with ``fn(stream, writer, token,
rows)`` (synchronous, called in order), or ``async for update in
follower.updates()``; ``add_reset_handler(fn, stream=None)`` with ``fn(stream,
writer, old, new)`` for resets. ``await wait_for_position(stream, writer, token,
timeout)`` raises :class:`PositionTimeout` on timeout.

Over 600 lines on purpose: the follower is one state machine per (stream,
writer) whose parts (live rows, batches, catch-up, resets, claims checked
against the database) all read and move the same position; split, each part
would reach into the others' state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from functools import partial
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

from .. import _checks, metrics
from . import _relay
from ..commands import PositionCommand, RdataCommand
from ..errors import FactstreamError, ProtocolError
from ..redaction import redact_text
from ..streams.registry import StreamDefinition, StreamRegistry, default_registry
from ..streams.sources import UpdateSource
from .droplog import DropLog

__all__ = ["Follower", "Update", "PositionTimeout", "RowsHandler", "ResetHandler"]

log = logging.getLogger(__name__)

#: How many times ``verify_grace`` a claim is re-checked for while the database's head keeps moving.
_MOVING_GRACE = 5

#: ``handler(stream_name, writer, token, rows)``.
RowsHandler = Callable[[str, str, int, list[Any]], Any]
#: ``handler(stream_name, writer, old_position, new_position)``: the writer's stream went back.
ResetHandler = Callable[[str, str, int, int], Any]


class PositionTimeout(FactstreamError, TimeoutError):
    """A stream did not reach the awaited position in time."""


class Update(NamedTuple):
    """Rows of one fact (all rows at one token) as yielded by ``Follower.updates()``."""

    stream: str
    writer: str
    token: int
    rows: list[Any]


@dataclass(slots=True)  # slots: the relay reads and moves position and rows once per fact
class _Key:
    stream: str
    writer: str
    position: int | None
    batch: list[Any] = field(default_factory=list)
    batch_conn: object = None
    queue: deque[tuple[Any, ...]] = field(default_factory=deque)
    fetching: bool = False
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    rows: int = 0
    #: While draining after a check of queued rows: the head the database showed (rows above it are unbacked).
    checked_head: int | None = None
    #: How many items at the front of ``queue`` that head judges: those queued before it was asked for. Rows
    #: that arrived while it was read may have been committed after the query ran; they get their own check.
    checked_items: int = 0
    #: RDATA above this token is checked against the database first (see Follower._suspect).
    bound: int = 0
    #: The follower's start_position, when the position was taken from it before the writer said anything:
    #: a writer then found below it is not a position gone backwards (see Follower._went_backwards).
    assumed: int | None = None


class Follower:
    """Follows the streams of every writer it hears about (see module doc)."""

    #: RDATA folded and delivered at a time by :meth:`on_rdata_many`: a long run (a page of a thousand rows)
    #: is handed on in pieces, so its facts are gone before the cycle collector's young passes promote them
    #: (promoted objects are what sets off its full passes). 64: a piece's facts, lists and typed rows (some
    #: 250 allocations) stay under the young generation's threshold of 700 with a socket read's commands
    #: alive beside them, so delivering a read rarely sets off a pass at all (256 set off about two per read).
    run_limit = 64

    def __init__(
        self,
        registry: StreamRegistry | None = None,
        *,
        sources: Mapping[str, UpdateSource] | None = None,
        positions: Mapping[tuple[str, str], int] | None = None,
        start_position: int | None = None,
        page_limit: int = 1000,
        typed: bool = True,
        streams: set[str] | None = None,
        relay: ModuleType | None = None,
        trust_window: int = 1000,
        verify_grace: float = 1.0,
    ) -> None:
        _checks.whole("page_limit", page_limit)  # a page of 0 rows would ask the source for the same nothing forever
        _checks.whole("trust_window", trust_window, 0)
        _checks.seconds("verify_grace", verify_grace, zero=True)
        if start_position is not None:
            _checks.whole("start_position", start_position, 0)
        self.registry = registry if registry is not None else default_registry()
        self.sources: dict[str, UpdateSource] = dict(sources or {})
        self.start_position = start_position
        self.page_limit = page_limit
        self.typed = typed
        #: Only these streams are followed (None: all).
        self.streams = streams
        #: The relay twin running the per-row loop (default: the active implementation).
        self.relay = relay or _relay
        #: RDATA up to this far past the database's last seen head is delivered without asking it again.
        self.trust_window = trust_window
        #: Seconds an unbacked claim is re-checked before it is reported (a rollback at the head shows late).
        self.verify_grace = verify_grace
        #: stream -> the highest head its source showed (only grows, until a table-backed reset).
        self._heads: dict[str, int] = {}
        #: stream -> monotonic time until which its head is not read again (it could not be read).
        self._unverifiable: dict[str, float] = {}
        #: Seconds claims go unchecked after the database's head could not be read.
        self.unverifiable_for = 30.0
        self._reset_handlers: list[tuple[str | None, ResetHandler]] = []
        #: Counts every dropped row (factstream_dropped_rows) and logs it, rate-limited.
        self.drops = DropLog(log)
        self._keys: dict[tuple[str, str], _Key] = {}
        for (s, w), pos in (positions or {}).items():
            self._key(s, w).position = pos
        #: The handlers, the updates() queues and the per-fact delivery loop.
        self._fanout = self.relay.Fanout(Update, self._handler_failed)
        self._unknown_reported: set[str] = set()
        #: stream -> (its definition, the row parser made for it).
        self._parsers: dict[str, tuple[StreamDefinition, Callable[[Any], Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        metrics.track(self)
        #: Counters kept for tests and the demo.
        self.stats: dict[str, int] = {
            "stale_rows": 0, "catchup_rows": 0, "catchup_fetches": 0, "resets": 0, "unbacked_claims": 0,
        }

    # ------------------------------------------------------------ application API

    def add_handler(self, handler: RowsHandler, stream: str | None = None) -> None:
        """Call ``handler(stream, writer, token, rows)`` for each fact (of ``stream``, or all)."""
        # A new list, never an append: a delivery in progress notices the change by identity.
        self._fanout.handlers = [*self._fanout.handlers, (stream, handler)]

    def remove_handler(self, handler: RowsHandler) -> None:
        """Stop calling ``handler``."""
        self._fanout.handlers = [(s, h) for s, h in self._fanout.handlers if h is not handler]

    def add_reset_handler(self, handler: ResetHandler, stream: str | None = None) -> None:
        """Call ``handler(stream, writer, old, new)`` when a writer's stream goes back from ``old`` to ``new``.

        It runs before any row after the reset is delivered: state built
        from that writer's rows above ``new`` (typing notifications, cached
        values) is stale, and rows from ``new + 1`` on follow. Consumers of
        :meth:`updates` learn of resets only through this hook.
        """
        self._reset_handlers = [*self._reset_handlers, (stream, handler)]

    def remove_reset_handler(self, handler: ResetHandler) -> None:
        """Stop calling ``handler`` on resets."""
        self._reset_handlers = [(s, h) for s, h in self._reset_handlers if h is not handler]

    async def updates(self) -> AsyncIterator[Update]:
        """Iterate facts as they are delivered (from now on), in order per (stream, writer).

        The queue behind each iterator is unbounded (nothing is ever dropped):
        consume promptly, or use a handler.
        """
        queue: asyncio.Queue[Update] = asyncio.Queue()
        self._fanout.queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._fanout.queues.remove(queue)

    def position(self, stream: str, writer: str) -> int | None:
        """The last delivered position of ``writer`` in ``stream`` (None if never heard of)."""
        key = self._keys.get((stream, writer))
        return None if key is None else key.position

    def positions(self) -> dict[tuple[str, str], int | None]:
        """(stream, writer) -> position, for every pair heard of."""
        return {k: v.position for k, v in self._keys.items()}

    def is_catching_up(self, stream: str | None = None, writer: str | None = None) -> bool:
        """True while an out-of-band fetch runs (for that stream and writer, or any).

        Inside a handler this tells a fact delivered by catch-up from a live one.
        """
        if stream is not None and writer is not None:
            key = self._keys.get((stream, writer))
            return key is not None and key.fetching
        return any(k.fetching for k in self._keys.values())

    async def wait_for_position(self, stream: str, writer: str, token: int, timeout: float = 30.0) -> None:
        """Return once ``writer``'s ``stream`` was delivered up to ``token``; PositionTimeout after ``timeout``."""
        key = self._key(stream, writer)
        if key.position is not None and key.position >= token:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (token, fut)
        key.waiters.append(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise PositionTimeout(
                f"stream {stream} of writer {writer} is at {key.position}, not {token}, after {timeout}s; "
                "is the writer running and the reader connected?"
            ) from None
        finally:
            if entry in key.waiters:
                key.waiters.remove(entry)

    # ------------------------------------------------------------ hub-facing

    def on_rdata(self, cmd: RdataCommand, conn: object = None) -> None:
        """Consume one RDATA (batched rows wait for their numeric token)."""
        stream = cmd.stream_name
        if self.streams is not None and stream not in self.streams:
            return
        key = self._keys.get((stream, cmd.instance_name)) or self._key(stream, cmd.instance_name)
        row = self._parse(stream, cmd.row) if self.typed else cmd.row
        if cmd.token is None:
            key.batch.append(row)
            key.batch_conn = conn
            return
        if key.batch:
            rows = key.batch
            rows.append(row)
            key.batch = []
        else:
            rows = [row]
        self._consume(key, cmd.token, rows)

    def on_rdata_many(self, cmds: Sequence[RdataCommand], conn: object = None) -> None:
        """Consume consecutive RDATA commands: the same as :meth:`on_rdata` for each, in order."""
        gather = self.relay.gather
        streams = self.streams
        limit = self.run_limit
        i, n = 0, len(cmds)
        while i < n:
            first = cmds[i]
            stream = first.stream_name
            if streams is not None and stream not in streams:
                i += 1
                continue
            key = self._keys.get((stream, first.instance_name)) or self._key(stream, first.instance_name)
            parse = self._parser(stream) if self.typed else None
            start = i
            if key.fetching or key.position is None:
                i, facts, key.batch, _ = gather(cmds, i, None, key.batch, parse, limit)
                for token, rows in facts:
                    self._consume(key, token, rows)
            else:
                pos = key.position
                i, facts, key.batch, stale = gather(cmds, i, pos, key.batch, parse, limit)
                if stale:
                    self._stale(key, stale, pos)
                if facts:
                    top = facts[-1][0]
                    if top > key.bound and self._suspect(key, top):
                        key.queue.extend(("rows", token, rows) for token, rows in facts)
                        self._check_rows(key)
                    else:
                        self._deliver(key, facts)
            facts = rows = None  # this run's facts go now, not when the next run replaces them
            if i == start:
                raise TypeError(f"on_rdata_many takes RDATA commands only, not {type(first).__name__}")
            if key.batch:
                key.batch_conn = conn

    def on_position(self, cmd: PositionCommand, conn: object = None) -> None:
        """Consume one POSITION: advance, or fetch what was missed."""
        if self.streams is not None and cmd.stream_name not in self.streams:
            return
        key = self._key(cmd.stream_name, cmd.instance_name)
        if key.fetching:
            key.queue.append(("pos", cmd.prev_token, cmd.new_token))
        else:
            self._apply_position(key, cmd.prev_token, cmd.new_token)

    def connection_lost(self, conn: object) -> None:
        """Forget batches begun on ``conn``: their closing row will never come (catch-up repairs)."""
        for key in self._keys.values():
            if key.batch and (conn is None or key.batch_conn is conn):
                self.drops.dropped(
                    "broken_batch", len(key.batch), key.stream,
                    "%s/%s: %d batch rows dropped: their connection closed before the row with their token",
                    key.stream, key.writer, len(key.batch),
                )
                key.batch = []

    async def close(self) -> None:
        """Cancel running catch-up fetches (a fetch that had failed is logged, not swallowed)."""
        tasks = list(self._tasks)
        self._closing = True
        for task in tasks:
            task.cancel()
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._closing = False
        for task, result in zip(tasks, results):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("catch-up task %s had failed", task.get_name(), exc_info=result)
        self.drops.flush()

    # ------------------------------------------------------------ internals

    def _key(self, stream: str, writer: str) -> _Key:
        key = self._keys.get((stream, writer))
        if key is None:
            key = self._keys[(stream, writer)] = _Key(stream, writer, None)
            key.bound = self._heads.get(stream, 0) + self.trust_window
        return key

    def metric_rows(self) -> list[tuple[str, str, int]]:
        """For Prometheus: rows delivered per stream (summed over writers)."""
        return [("reader", k.stream, k.rows) for k in self._keys.values()]

    def metric_positions(self) -> list[tuple[str, str, str, int]]:
        """For Prometheus: position per (stream, writer)."""
        return [("reader", k.stream, k.writer, k.position) for k in self._keys.values() if k.position is not None]

    def _parse(self, stream: str, row: Any) -> Any:
        if not self.typed:
            return row
        try:
            return self.registry.parse_row(stream, row)
        except KeyError:
            if stream not in self._unknown_reported:
                self._unknown_reported.add(stream)
                log.warning("rows of unknown stream %r are delivered untyped; register it in the StreamRegistry", stream)
            return row
        except ProtocolError as err:
            log.warning("malformed %s row delivered untyped: %s", stream, err)
            return row

    def _parser(self, stream: str) -> Callable[[Any], Any]:
        """:meth:`_parse` for one stream, its definition looked up once (per run of rows, not per row).

        For a definition that parses with its row type's ``from_wire``, a
        relay :class:`~factstream.replication._relay.RowParser`: plain rows
        are built without a Python call each (compiled build), any other row
        goes through ``from_wire`` as before. Made once per definition.
        """
        try:
            definition = self.registry.get(stream)
        except KeyError:
            return partial(self._parse, stream)  # unknown: reported once, rows untyped
        made = self._parsers.get(stream)
        if made is not None and made[0] is definition:
            return made[1]
        parse_row = definition.parse_row
        direct = type(definition).parse_row is StreamDefinition.parse_row
        if direct:
            parse_row = definition.row_type.from_wire  # what it calls, one call less per row

        def parse(row: Any) -> Any:
            try:
                return parse_row(row)
            except ProtocolError as err:
                log.warning("malformed %s row delivered untyped: %s", stream, err)
                return row

        parser = self.relay.RowParser(definition.row_type, parse) if direct else parse
        self._parsers[stream] = (definition, parser)
        return parser

    def _stale(self, key: _Key, n: int, pos: int | None) -> None:
        self.stats["stale_rows"] += n
        self.drops.dropped(
            "stale", n, key.stream,
            "%s/%s: %d rows at or below position %s dropped as stale (a replay, or a writer that went back "
            "without announcing it with POSITION)",
            key.stream, key.writer, n, pos,
        )

    def _consume(self, key: _Key, token: int, rows: list[Any]) -> None:
        """The rows of one fact arrived live: wait behind a fetch, deliver, or check them."""
        if key.fetching:
            key.queue.append(("rows", token, rows))
        elif key.position is not None and token > key.position and not (token > key.bound and self._suspect(key, token)):
            self._deliver(key, [(token, rows)])
        else:
            self._apply_rows(key, token, rows)

    def _apply_rows(self, key: _Key, token: int, rows: list[Any], queued: bool = False) -> None:
        pos = key.position
        if pos is None:
            if self.start_position is None:
                self.drops.dropped(
                    "unknown_position", len(rows), key.stream,
                    "%s/%s: %d rows dropped: no position known yet for this writer (following live only, "
                    "waiting for its POSITION)",
                    key.stream, key.writer, len(rows),
                )
                return
            pos = key.position = key.assumed = self.start_position
            if token > pos + 1 and key.stream in self.sources:
                # We do not know what lies between our start and this row: fetch it first.
                key.queue.append(("rows", token, rows))
                self._start_fetch(key, token - 1)
                return
        if token <= pos:
            if queued:
                # Arrived live while a catch-up fetched the same fact: the expected overlap, not a fault.
                self.drops.dropped(
                    "duplicate", len(rows), key.stream,
                    "%s/%s: %d rows at token %d already delivered by catch-up, dropped",
                    key.stream, key.writer, len(rows), token, level=logging.INFO,
                )
            else:
                self._stale(key, len(rows), pos)
            return
        checked = key.checked_head
        if checked is not None:
            # Just asked: anything above the freshest head the database showed is not backed.
            head = max(checked, self._heads.get(key.stream, 0))
            if token > head:
                self._unbacked_rows(key, token, rows, head)
                return
        elif token > key.bound and self._suspect(key, token):
            key.queue.appendleft(("rows", token, rows))
            self._check_rows(key)
            return
        self._deliver(key, [(token, rows)])

    def _apply_position(self, key: _Key, prev: int, new: int) -> None:
        pos = key.position
        if pos is None:
            if self.start_position is None:
                self._claim(key, new)
                return
            pos = key.position = key.assumed = self.start_position
        elif new < pos:
            if self._head_source(key.stream) is not None and not self._in_memory(key.stream):
                self._spawn(key, self._check_backwards(key, new))
            else:
                self._went_backwards(key, new)
            return
        if prev > pos:
            self._start_fetch(key, new)
        elif new > pos:
            self._claim(key, new)

    # ------------------------------------------------------------ resets

    def _went_backwards(self, key: _Key, new: int) -> None:
        """The writer says its position is ``new``, below ours: reset to it (see docs/replication.md)."""
        old = key.position
        assert old is not None
        in_memory = self._in_memory(key.stream)
        if key.assumed is not None and old == key.assumed:
            log.warning(
                "%s/%s: the start position %d is past the writer's position %d (a start position from another "
                "deployment, or a writer that started again from scratch); following from %d",
                key.stream, key.writer, old, new, new,
            )
        elif in_memory:
            log.warning(
                "%s/%s: stream went backwards from %d to %d (its rows live in the writer's memory: the writer "
                "restarted); reset to %d, rows after it will be delivered",
                key.stream, key.writer, old, new, new,
            )
        else:
            log.error(
                "%s/%s: position went backwards from %d to %d on a table-backed stream (database restored or "
                "failed over, or a wrong POSITION); reset to %d: rows after it are delivered again from the "
                "writer and the database, and reset handlers are told",
                key.stream, key.writer, old, new, new,
            )
        metrics.STREAM_RESETS.labels(key.stream, "in_memory" if in_memory else "table").inc()
        self.stats["resets"] += 1
        if key.batch:
            # Rows of a batch begun before the reset belong to the old stream.
            self.drops.dropped(
                "stale", len(key.batch), key.stream,
                "%s/%s: %d batch rows from before the reset dropped", key.stream, key.writer, len(key.batch),
            )
            key.batch = []
        key.position = new
        if not in_memory:
            # The database went back too: the head seen before is no longer a bound.
            self._set_head(key.stream, None)
        for only, handler in self._reset_handlers:
            if only is None or only == key.stream:
                try:
                    handler(key.stream, key.writer, old, new)
                except Exception:
                    log.exception("reset handler %r failed on %s/%s (%d -> %d)", handler, key.stream, key.writer, old, new)

    def _in_memory(self, stream: str) -> bool:
        """Whether the registry says the stream's rows live in the writer's memory (unknown streams: no)."""
        try:
            return self.registry.get(stream).in_memory
        except KeyError:
            return False

    async def _check_backwards(self, key: _Key, new: int) -> None:
        """A table-backed stream claims to have gone back: a reset only if the database went back too."""
        old = key.position
        assert old is not None
        head = await self._read_head(key, old, grace=0.0)
        if head is not None and head >= old:
            # The database still holds what we delivered: the writer's ids cannot be handed out again,
            # so the claim is wrong (forged, or a confused writer). Resetting would re-deliver history.
            self.stats["unbacked_claims"] += 1
            metrics.UNBACKED_CLAIMS.labels(key.stream).inc()
            log.error(
                "%s/%s: POSITION going back from %d to %d ignored: the database still holds up to %d, so the "
                "writer cannot be back at %d (forged message, or a confused writer?); held at %d",
                key.stream, key.writer, old, new, head, new, old,
            )
        else:
            self._went_backwards(key, new)
        key.fetching = False
        self._drain_queue(key)

    # ------------------------------------------------------------ checking claims against the database

    def _head_source(self, stream: str) -> Any:
        """The stream's source if it can tell the database's head (a HeadSource, readable lately), else None."""
        source = self.sources.get(stream)
        if source is None or not hasattr(source, "stream_head"):
            return None
        if stream in self._unverifiable:
            if time.monotonic() < self._unverifiable[stream]:
                return None
            del self._unverifiable[stream]
        return source

    def _suspect(self, key: _Key, token: int) -> bool:
        """Whether an RDATA at ``token``, past ``key.bound``, must be checked against the database.

        ``key.bound`` is the last head seen plus ``trust_window``, so the hot
        paths pay one comparison per run; a stream without a head source
        moves its bound a window on (a source added later is noticed).
        """
        if self._head_source(key.stream) is None:
            key.bound = token + self.trust_window
            return False
        return True

    def _set_head(self, stream: str, head: int | None) -> None:
        """Record the database's head of ``stream`` (None: forget it) and move its keys' bounds."""
        if head is None:
            self._heads.pop(stream, None)
        else:
            self._heads[stream] = head
        bound = (head or 0) + self.trust_window
        for key in self._keys.values():
            if key.stream == stream:
                key.bound = bound

    def _claim(self, key: _Key, new: int) -> None:
        """Move to ``new`` on the writer's word, if the database backs it (else check first)."""
        if new <= self._heads.get(key.stream, 0) or self._head_source(key.stream) is None:
            self._advance(key, new)
            return
        self._spawn(key, self._check_claim(key, new))

    def _check_rows(self, key: _Key) -> None:
        """Hold ``key``'s queue while the database is asked about the rows queued in it."""
        self._spawn(key, self._check_queued_rows(key))

    def _spawn(self, key: _Key, coro: Any) -> None:
        key.fetching = True
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(partial(self._task_done, key))

    def _task_done(self, key: _Key, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._closing:
            return  # close() reports what it cancelled
        err = task.exception()
        if err is not None:
            # A bug, not a database error (those are retried): say so loudly, and do not stall the stream.
            log.error(
                "%s/%s: catch-up failed; %d queued commands are applied without it",
                key.stream, key.writer, len(key.queue), exc_info=err,
            )
            key.fetching = False
            self._drain_queue(key)

    async def _read_head(self, key: _Key, target: int, grace: float | None = None) -> int | None:
        """The database's head, re-read for up to ``grace`` seconds (default ``verify_grace``) while below ``target``.

        None when it cannot be read (reported; the caller follows the writer's word).
        """
        source = self._head_source(key.stream)
        loop = asyncio.get_running_loop()
        grace = self.verify_grace if grace is None else grace
        deadline = loop.time() + grace
        # While the head keeps moving towards the claim (a busy writer records its position behind its
        # transactions: on SQLite, seconds behind on a loaded machine), the wait goes on, up to this: a
        # claim a live writer really reached shows up; a forged one is still reported, later.
        longest = loop.time() + _MOVING_GRACE * grace
        seen = -1
        delay = 0.02
        failures = 0
        while True:
            try:
                head = int(await source.stream_head())
            except asyncio.CancelledError:
                raise
            except Exception as err:
                failures += 1
                if failures < 4:
                    await asyncio.sleep(0.05 * failures)
                    continue
                # Unreadable (a database down, a table missing): stalling the stream would be worse than
                # following the writer's word, as factstream did before it could check. Say so, loudly.
                self._unverifiable[key.stream] = time.monotonic() + self.unverifiable_for
                log.error(
                    "%s/%s: cannot check the claim %d against the database (%s: %s); following the writer's word "
                    "and not checking %s claims for %gs",
                    key.stream, key.writer, target, type(err).__name__, redact_text(str(err)), key.stream,
                    self.unverifiable_for,
                )
                return None
            if head > self._heads.get(key.stream, 0):
                self._set_head(key.stream, head)
            if head >= target:
                return head
            now = loop.time()
            if seen >= 0 and head > seen:
                deadline = max(deadline, min(now + grace, longest))
            seen = head
            if now >= deadline:
                return head
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    def _report_unbacked(self, key: _Key, what: str, claimed: int, verified: int) -> None:
        self.stats["unbacked_claims"] += 1
        metrics.UNBACKED_CLAIMS.labels(key.stream).inc()
        log.error(
            "%s/%s: %s claims position %d but the database backs only %d; not moving past rows not seen "
            "(forged message, or a database behind the writer?). Writer %r, claimed %d, verified %d",
            key.stream, key.writer, what, claimed, verified, key.writer, claimed, verified,
        )

    async def _check_claim(self, key: _Key, new: int) -> None:
        head = await self._read_head(key, new)
        if head is None or head >= new:
            self._advance(key, new)
            key.fetching = False
            self._drain_queue(key)
            return
        self._report_unbacked(key, "POSITION", new, head)
        if key.position is None:
            # Following live only: start at what the database holds.
            key.position = head
            key.fetching = False
            self._drain_queue(key)
            return
        await self._catch_up(key, self.sources[key.stream], head, settle=False)

    async def _check_queued_rows(self, key: _Key) -> None:
        judged = len(key.queue)
        top = max((item[1] for item in key.queue if item[0] == "rows"), default=0)
        # No grace: a real RDATA's rows were committed before it was sent, so the database shows them now.
        head = await self._read_head(key, top, grace=0.0)
        key.checked_head = top if head is None else head
        key.checked_items = judged
        key.fetching = False
        self._drain_queue(key)

    def _unbacked_rows(self, key: _Key, token: int, rows: list[Any], head: int) -> None:
        self._report_unbacked(key, "RDATA", token, head)
        self.drops.dropped(
            "unbacked", len(rows), key.stream,
            "%s/%s: %d rows at token %d dropped: the database backs only %d",
            key.stream, key.writer, len(rows), token, head, level=logging.ERROR,
        )

    # ------------------------------------------------------------ catch-up

    def _start_fetch(self, key: _Key, target: int) -> None:
        source = self.sources.get(key.stream)
        if source is None:
            log.warning(
                "%s/%s: missed facts (%s, %d] but no update source is configured for this stream; skipping them",
                key.stream, key.writer, key.position, target,
            )
            metrics.SKIPPED_GAPS.labels(key.stream).inc()
            self._advance(key, target)
            return
        self._spawn(key, self._catch_up(key, source, target))

    async def _catch_up(self, key: _Key, source: UpdateSource, target: int, settle: bool = True) -> None:
        """Fetch ``(position, target]`` and deliver it; ``settle``: then stand at ``target`` even past the last row.

        With a source that knows the database's head, a target beyond it is
        reported and cut to it, and the position then moves only as far as
        the rows the database holds (``settle`` off).
        """
        if settle and target > self._heads.get(key.stream, 0) and self._head_source(key.stream) is not None:
            head = await self._read_head(key, target)
            if head is not None and head < target:
                self._report_unbacked(key, "POSITION", target, head)
                target, settle = head, False
        delay = 0.05
        fetches = metrics.CATCHUP_FETCHES.labels(key.stream)
        fetched = metrics.CATCHUP_ROWS.labels(key.stream)
        while True:
            assert key.position is not None
            pos = key.position
            if pos >= target:
                break
            try:
                updates, upto, limited = await source.get_updates(key.writer, pos, target, self.page_limit)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("%s/%s: catch-up after %d failed (%s); retrying in %.2fs", key.stream, key.writer, pos, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if limited and upto <= pos and not any(t > pos for t, _ in updates):
                log.error(
                    "%s/%s: update source returned a limited page without progress after %d; retrying in %.2fs",
                    key.stream, key.writer, pos, delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.05
            fetches.inc()
            fetched.inc(len(updates))
            self.stats["catchup_fetches"] += 1
            self.stats["catchup_rows"] += len(updates)
            i, n = 0, len(updates)
            parse = self._parser(key.stream) if self.typed else None
            while i < n:
                token = updates[i][0]
                rows = []
                while i < n and updates[i][0] == token:
                    rows.append(parse(updates[i][1]) if parse is not None else updates[i][1])
                    i += 1
                if token > key.position:
                    self._deliver(key, [(token, rows)])
            if limited:
                if upto > key.position:
                    self._advance(key, min(upto, target))
            else:
                if settle and key.position < target:
                    self._advance(key, target)
                break
        key.fetching = False
        self._drain_queue(key)

    def _drain_queue(self, key: _Key) -> None:
        queue = key.queue
        while queue and not key.fetching:
            if key.checked_items:
                key.checked_items -= 1
            else:
                key.checked_head = None  # past what the last check judged
            item = queue.popleft()
            if item[0] == "rows":
                self._apply_rows(key, item[1], item[2], queued=True)
            else:
                self._apply_position(key, item[1], item[2])
        if not queue:
            key.checked_head = None
            key.checked_items = 0

    def _deliver(self, key: _Key, facts: list[tuple[int, list[Any]]]) -> None:
        """Deliver facts above the position, in order, moving the position past each."""
        self._fanout.deliver(key, facts)
        if key.waiters:
            self._wake(key)

    def _handler_failed(self, handler: RowsHandler, stream: str, writer: str, token: int) -> None:
        log.exception("handler %r failed on %s/%s token %d", handler, stream, writer, token)

    def _advance(self, key: _Key, token: int) -> None:
        if key.position is not None and token <= key.position:
            return
        key.position = token
        if key.waiters:
            self._wake(key)

    def _wake(self, key: _Key) -> None:
        token = key.position
        assert token is not None
        for entry in list(key.waiters):
            if entry[0] <= token and not entry[1].done():
                entry[1].set_result(None)
