"""Prometheus metrics of replication, shared by the core and the transports.

All metrics live in the default ``prometheus_client`` registry under the
``factstream_`` prefix; :func:`start_http_server` exposes them (``factstream
serve --metrics-port``). Label values are bounded: command names, stream
names, writer names and a short list of disconnect reasons.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = [
    "COMMANDS_IN",
    "COMMANDS_OUT",
    "track",
    "PENDING_OUT",
    "RECONNECTS",
    "CATCHUP_FETCHES",
    "CATCHUP_ROWS",
    "DISCONNECTS",
    "DROPPED_ROWS",
    "STREAM_RESETS",
    "UNBACKED_CLAIMS",
    "SKIPPED_GAPS",
    "start_http_server",
    "LabelledCounter",
]

COMMANDS_IN = Counter("factstream_commands_in", "Replication commands received, by command", ["command"])
COMMANDS_OUT = Counter("factstream_commands_out", "Replication commands sent, by command", ["command"])

class StreamStatsSource(Protocol):
    """A publisher or follower: reports its counts when Prometheus scrapes (no cost per row)."""

    def metric_rows(self) -> Iterable[tuple[str, str, int]]:
        """(side, stream, rows so far)."""
        ...

    def metric_positions(self) -> Iterable[tuple[str, str, str, int]]:
        """(side, stream, writer, position)."""
        ...


_SOURCES: weakref.WeakSet[Any] = weakref.WeakSet()


def track(source: StreamStatsSource) -> None:
    """Report ``source``'s rows and positions (``factstream_rows``, ``factstream_position``) while it lives."""
    _SOURCES.add(source)


class _StreamCollector:
    """Rows per stream and positions per (stream, writer), read from live objects at scrape time."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        rows = CounterMetricFamily(
            "factstream_rows", "Stream rows delivered to the application (reader) or published (writer)",
            labels=["side", "stream"],
        )
        pos = GaugeMetricFamily(
            "factstream_position", "Position per stream and writer as seen by this process",
            labels=["side", "stream", "writer"],
        )
        totals: dict[tuple[str, str], int] = {}
        positions: dict[tuple[str, str, str], int] = {}
        for src in list(_SOURCES):
            for side, stream, n in src.metric_rows():
                totals[(side, stream)] = totals.get((side, stream), 0) + n
            for side, stream, writer, p in src.metric_positions():
                key = (side, stream, writer)
                positions[key] = max(p, positions.get(key, p))
        for (side, stream), n in sorted(totals.items()):
            rows.add_metric([side, stream], n)
        for (side, stream, writer), p in sorted(positions.items()):
            pos.add_metric([side, stream, writer], p)
        yield rows
        yield pos


REGISTRY.register(_StreamCollector())
PENDING_OUT = Gauge("factstream_pending_outbound", "Commands buffered for sending (all connections and the outbox)")
RECONNECTS = Counter("factstream_reconnects", "Client reconnection attempts", ["target"])
CATCHUP_FETCHES = Counter("factstream_catchup_fetches", "Out-of-band catch-up pages fetched", ["stream"])
CATCHUP_ROWS = Counter("factstream_catchup_rows", "Rows obtained by catch-up", ["stream"])
DISCONNECTS = Counter("factstream_disconnects", "Connections closed, by reason", ["reason"])
DROPPED_ROWS = Counter("factstream_dropped_rows", "Rows ignored by a reader (stale, duplicate, unknown position)", ["stream", "why"])


STREAM_RESETS = Counter(
    "factstream_stream_resets",
    "A writer's position went backwards and the reader reset to it, by stream and kind (in_memory: expected after "
    "a writer restart; table: a database restore or failover, logged as an ERROR)",
    ["stream", "kind"],
)
UNBACKED_CLAIMS = Counter(
    "factstream_unbacked_claims",
    "POSITION or RDATA tokens beyond what the reader's database holds (forged, or a database behind the writer)",
    ["stream"],
)
SKIPPED_GAPS = Counter(
    "factstream_skipped_gaps",
    "Ranges of missed facts a reader could not fetch (no update source for the stream) and skipped",
    ["stream"],
)


def start_http_server(port: int, addr: str = "127.0.0.1") -> None:
    """Serve /metrics on ``addr:port`` (loopback unless told otherwise)."""
    import prometheus_client

    prometheus_client.start_http_server(port, addr=addr)


class LabelledCounter:
    """A labelled counter whose children are looked up once per label value.

    ``Counter.labels()`` costs more than the event it counts on a hot path;
    this keeps each child in a dict. Label values are one string, or a tuple
    of strings for a counter with several labels. ``counts`` is a plain dict
    hot paths may add to; :meth:`report` moves it into the counter in one go.
    """

    __slots__ = ("_counter", "_children", "counts")

    def __init__(self, counter: Any) -> None:
        self._counter = counter
        self._children: dict[Hashable, Any] = {}
        #: Increments not yet reported (see :meth:`report`).
        self.counts: dict[Any, int] = {}

    def inc(self, labels: str | tuple[str, ...], n: float = 1) -> None:
        """Add ``n`` to the child for ``labels``."""
        child = self._children.get(labels)
        if child is None:
            values = labels if isinstance(labels, tuple) else (labels,)
            child = self._children[labels] = self._counter.labels(*values)
        child.inc(n)

    def inc_all(self, counts: Mapping[Any, int]) -> None:
        """Add each of ``counts`` (label values -> increment)."""
        for labels, n in counts.items():
            self.inc(labels, n)

    def report(self) -> None:
        """Move what hot paths added to :attr:`counts` into the counter."""
        if self.counts:
            self.inc_all(self.counts)
            self.counts.clear()

