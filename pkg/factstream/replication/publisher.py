"""Writer side: turn "position moved old -> new" into RDATA and POSITION commands.

Register each stream this process writes with :meth:`Publisher.add_stream`
(its current position and an update source), then hook
:attr:`Publisher.notify` to the id generator's listener
(``id_gen.add_listener(publisher.notify)``). For every advance the publisher
asks the update source for the rows in ``(sent, new]`` and emits, in token
order, one RDATA per row; several rows at one token go out as ``batch`` rows
ending with the numeric token; a range with no rows (rollback holes, an idle
writer) or rows ending below ``new`` is closed by ``POSITION sent new``.

Sources with a synchronous ``get_updates_now`` (the in-memory source) are
published inside ``notify`` itself; others (database tables) are drained by
one background task in pages of ``page_limit`` rows. The per-row work (rows
to commands, the synchronous drain) is the relay's
(:class:`factstream.replication._relay.StreamEmitter`, compiled in a compiled build).

By default a publisher only publishes Synapse's streams: a Synapse process
that hears a POSITION of a stream it does not know fails on it (a KeyError in
its command handler) and drops its replication connection, then reconnects,
asks REPLICATE, hears the same POSITION and drops again, in a loop. A stream
of your own is refused (:class:`ForeignStreamError`) unless the application
declares the channel its own with ``custom_streams=True`` (CLI:
``--custom-streams``). See docs/replication.md, "Sharing a channel with Synapse".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import ModuleType

from .. import _checks, metrics
from . import _relay
from ._relay import StreamEmitter
from ..backoff import Outage
from ..commands import Command, PositionCommand
from ..errors import FactstreamError
from ..store.database import DatabaseUnavailable
from ..streams.registry import SYNAPSE_STREAMS
from ..streams.sources import UpdateSource

__all__ = ["Publisher", "ForeignStreamError", "SYNAPSE_STREAM_NAMES"]

#: The streams every Synapse process knows: the only ones safe on a channel shared with Synapse.
SYNAPSE_STREAM_NAMES: frozenset[str] = frozenset(d.name for d in SYNAPSE_STREAMS)


class ForeignStreamError(FactstreamError, ValueError):
    """A stream Synapse does not know, published without declaring the channel the application's own."""

log = logging.getLogger(__name__)


def _checked_page_limit(value: int) -> int:
    # a page of 0 rows would ask a source for the same nothing forever
    return _checks.whole("page_limit", value)


class Publisher:
    """Publishes the facts of the streams one writer instance writes (see module doc)."""

    #: The id-generator listener ``notify(stream_name, instance_name, old, new)``: this
    #: writer's position in ``stream_name`` moved to ``new``; publish up to it (other
    #: writers' streams and backward moves are ignored). It is the relay's
    #: :meth:`factstream.replication._relay.Router.notify`, so a compiled build publishes without a
    #: Python call of its own.
    notify: Callable[[str, str, int, int], None]

    def __init__(
        self,
        instance_name: str,
        *,
        page_limit: int = 1000,
        relay: ModuleType | None = None,
        custom_streams: bool = False,
    ) -> None:
        self.instance_name = instance_name
        #: True when the channel belongs to the application (no Synapse process on it), so
        #: streams outside Synapse's registry may be published; see the module doc.
        self.custom_streams = custom_streams
        self._page_limit = _checked_page_limit(page_limit)
        #: The relay twin running the per-row loops (default: the active implementation).
        self.relay = relay or _relay
        self._streams: dict[str, StreamEmitter] = {}
        self._sinks: list[Callable[[list[Command]], None]] = []
        self._dirty: set[str] = set()
        self._progress: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        #: Reading rows failing (the database gone): one log line when it starts, one when it ends.
        self._outage = Outage(log, f"publisher {instance_name}: the update source", initial=0.1, maximum=5.0)
        self._router = self.relay.Router(instance_name, self._streams, self._schedule)
        self.notify = self._router.notify
        metrics.track(self)

    # ------------------------------------------------------------ setup

    @property
    def page_limit(self) -> int:
        """Rows asked of a source at a time."""
        return self._page_limit

    @page_limit.setter
    def page_limit(self, value: int) -> None:
        self._page_limit = _checked_page_limit(value)
        for st in self._streams.values():
            st.page_limit = value

    def add_stream(self, name: str, source: UpdateSource, current_token: int) -> None:
        """Publish stream ``name`` from ``current_token`` on, reading rows from ``source``.

        Raises :class:`ForeignStreamError` for a stream outside Synapse's
        registry unless the publisher was made with ``custom_streams=True``.
        """
        if name not in SYNAPSE_STREAM_NAMES and not self.custom_streams:
            raise ForeignStreamError(
                f"refusing to publish stream {name!r}: it is not one of Synapse's streams, and a Synapse process "
                f"on the same channel fails on its POSITION (KeyError in its replication handler) and drops its "
                f"connection in a loop, so rows it writes meanwhile never reach Redis. If no Synapse process "
                f"shares this channel (TCP listener or Redis channel), declare it yours: Publisher(..., "
                f"custom_streams=True), or 'factstream serve --custom-streams'. Synapse's streams: "
                f"{', '.join(sorted(SYNAPSE_STREAM_NAMES))}"
            )
        if name in self._streams:
            raise ValueError(f"stream {name!r} is already published by {self.instance_name}")
        self._streams[name] = self.relay.StreamEmitter(
            name, self.instance_name, source, current_token, getattr(source, "get_updates_now", None),
            self._sinks, self.page_limit,
        )

    def add_sink(self, sink: Callable[[list[Command]], None]) -> None:
        """``sink(commands)`` receives every batch of outgoing commands (the hub's broadcast)."""
        self._sinks.append(sink)

    @property
    def streams(self) -> list[str]:
        """Names of the published streams."""
        return list(self._streams)

    def positions(self) -> dict[str, int]:
        """Stream -> the position up to which facts were published."""
        return {name: st.sent for name, st in self._streams.items()}

    def backlog(self) -> int:
        """Positions notified but not yet published, summed over streams (a writer may pace itself by it)."""
        return sum(st.target - st.sent for st in self._streams.values())

    async def wait_backlog(self, limit: int) -> None:
        """Return once :meth:`backlog` is at most ``limit`` (each published page wakes the check)."""
        while self.backlog() > limit:
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._drain(), name="factstream-publisher")
            fut = asyncio.get_running_loop().create_future()
            self._progress.append(fut)
            try:
                await fut
            finally:
                if fut in self._progress:
                    self._progress.remove(fut)

    def _wake(self) -> None:
        waiting, self._progress = self._progress, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    def position_commands(self) -> list[PositionCommand]:
        """What to answer to REPLICATE: ``POSITION s w p p`` per stream, at the published position."""
        return [PositionCommand(s.name, self.instance_name, s.sent, s.sent) for s in self._streams.values()]

    # ------------------------------------------------------------ listener

    def _schedule(self, stream_name: str) -> None:
        """``stream_name`` (a source without ``get_updates_now``) has rows to fetch: drain in the background."""
        self._dirty.add(stream_name)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="factstream-publisher")

    async def _drain(self) -> None:
        outage = self._outage
        while self._dirty:
            name = min(self._dirty)  # any order across streams; within a stream, strict
            st = self._streams[name]
            try:
                while st.sent < st.target:
                    updates, upto, _limited = await st.source.get_updates(
                        self.instance_name, st.sent, st.target, self.page_limit
                    )
                    cmds = st.commands(updates, upto)
                    if cmds:
                        for sink in self._sinks:
                            sink(cmds)
                    if self._progress:
                        self._wake()
                outage.recovered()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if not outage.ongoing and not isinstance(err, DatabaseUnavailable):
                    log.exception("publisher: fetching %s rows after %d failed", name, st.sent)
                await asyncio.sleep(outage.failed(err))
                continue
            if st.sent >= st.target:
                self._dirty.discard(name)
        if self._progress:
            self._wake()

    def metric_rows(self) -> list[tuple[str, str, int]]:
        """For Prometheus: rows published per stream."""
        return [("writer", s.name, s.rows) for s in self._streams.values()]

    def metric_positions(self) -> list[tuple[str, str, str, int]]:
        """For Prometheus: published position per stream."""
        return [("writer", s.name, self.instance_name, s.sent) for s in self._streams.values()]

    async def flush(self) -> None:
        """Wait until every notified position has been published."""
        while self._dirty:
            task = self._task
            if task is None or task.done():
                self._task = task = asyncio.get_running_loop().create_task(self._drain())
            await asyncio.shield(task)

    def close(self) -> None:
        """Stop the background task (pending publications are dropped; readers catch up later)."""
        if self._task is not None:
            self._task.cancel()
