"""The watchdog's figures as Prometheus metrics, on their own registry and HTTP endpoint.

Names and the alert rules that use them are documented in docs/synapse.md.
A private registry keeps the endpoint to these figures (and lets several
watchdogs run in one process, e.g. in tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from .watchdog import Problem

__all__ = ["WatchMetrics"]

_LABELS = ("stream", "writer")


class WatchMetrics:
    """Gauges and counters per (stream, writer), updated from each report."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.token = Gauge("factstream_synapse_stream_token", "Latest token the wire announced for a stream writer",
                           _LABELS, registry=r)
        self.rows = Counter("factstream_synapse_stream_rows", "RDATA rows seen on the wire", _LABELS, registry=r)
        self.rate = Gauge("factstream_synapse_stream_rows_per_second", "RDATA rows per second over the last 10s",
                          _LABELS, registry=r)
        self.idle = Gauge("factstream_synapse_stream_seconds_since_advance",
                          "Seconds since the writer's token last moved on the wire", _LABELS, registry=r)
        self.db_lag = Gauge("factstream_synapse_stream_db_lag",
                            "How many ids the database's rows are ahead of the wire (needs --db)", _LABELS, registry=r)
        self.frozen = Gauge("factstream_synapse_stream_frozen",
                            "1 while the database has rows the wire has not announced for longer than --frozen-after",
                            _LABELS, registry=r)
        self.behind = Gauge("factstream_synapse_writer_behind",
                            "1 while a writer stays put as other writers of its stream move on", _LABELS, registry=r)
        self.unpublished = Gauge("factstream_synapse_unpublished_rows",
                                 "Committed rows the wire covered without an RDATA (readers never fetch them)",
                                 _LABELS, registry=r)
        self.missing = Gauge("factstream_synapse_writer_missing",
                             "1 while a writer the config (--config) names has not answered on the channel",
                             _LABELS, registry=r)
        self.unconfigured = Gauge("factstream_synapse_writer_unconfigured",
                                  "1 while a writer the config (--config) does not name announces the stream",
                                  _LABELS, registry=r)
        self.up = Gauge("factstream_synapse_watch_redis_up", "1 while subscribed to the deployment's Redis channel",
                        registry=r)
        self.healthy = Gauge("factstream_synapse_watch_healthy", "1 when no problem stands", registry=r)
        self.commands = Counter("factstream_synapse_watch_commands", "Replication commands received", registry=r)
        self._rows_seen: dict[tuple[str, str], int] = {}
        self._commands_seen = 0
        self._config_flagged: set[tuple[str, str, str]] = set()

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Start the HTTP endpoint (``/metrics``); returns the server."""
        return start_http_server(port, addr=host, registry=self.registry)

    def update(self, writers: Sequence[dict[str, Any]], problems: Sequence[Problem], *, redis_up: bool,
               commands_seen: int, healthy: bool | None = None) -> None:
        """Set every figure from one report (``healthy`` as the report judged it; default: no problem)."""
        flagged = {(p.kind, p.stream, p.writer) for p in problems}
        for w in writers:
            key = (w["stream"], w["writer"])
            labels = {"stream": key[0], "writer": key[1]}
            if w["token"] is not None:
                self.token.labels(**labels).set(w["token"])
            delta = w["rows_total"] - self._rows_seen.get(key, 0)
            if delta > 0:
                self.rows.labels(**labels).inc(delta)
            self._rows_seen[key] = w["rows_total"]
            self.rate.labels(**labels).set(w["rows_per_second"])
            if w["seconds_since_advance"] is not None:
                self.idle.labels(**labels).set(w["seconds_since_advance"])
            if w["db_lag"] is not None:
                self.db_lag.labels(**labels).set(w["db_lag"])
            self.frozen.labels(**labels).set(1 if ("frozen", *key) in flagged else 0)
            self.behind.labels(**labels).set(1 if ("writer_behind", *key) in flagged else 0)
            self.unpublished.labels(**labels).set(w["unpublished"])
        # Writers judged against the config may never appear among the writers heard: set (and clear) them here.
        config_flagged = {k for k in flagged if k[0] in ("writer_missing", "writer_unconfigured")}
        for kind, stream, writer in config_flagged | self._config_flagged:
            gauge = self.missing if kind == "writer_missing" else self.unconfigured
            gauge.labels(stream=stream, writer=writer).set(1 if (kind, stream, writer) in config_flagged else 0)
        self._config_flagged = config_flagged
        self.up.set(1 if redis_up else 0)
        self.healthy.set(1 if (not problems if healthy is None else healthy) else 0)
        if commands_seen > self._commands_seen:
            self.commands.inc(commands_seen - self._commands_seen)
            self._commands_seen = commands_seen
