"""Prometheus metrics of replication, shared by the core and the transports.

All metrics live in the default ``prometheus_client`` registry under the
``factstream_`` prefix; :func:`start_http_server` exposes them (``factstream
serve --metrics-port``). Label values are bounded: command names, stream
names, writer names and a short list of disconnect reasons.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = [
    "COMMANDS_IN",
    "COMMANDS_OUT",
    "ROWS",
    "POSITION",
    "PENDING_OUT",
    "RECONNECTS",
    "CATCHUP_FETCHES",
    "CATCHUP_ROWS",
    "DISCONNECTS",
    "DROPPED_ROWS",
    "start_http_server",
]

COMMANDS_IN = Counter("factstream_commands_in", "Replication commands received, by command", ["command"])
COMMANDS_OUT = Counter("factstream_commands_out", "Replication commands sent, by command", ["command"])
ROWS = Counter("factstream_rows", "Stream rows delivered to the application (reader) or published (writer)", ["side", "stream"])
POSITION = Gauge("factstream_position", "Position per stream and writer as seen by this process", ["side", "stream", "writer"])
PENDING_OUT = Gauge("factstream_pending_outbound", "Commands buffered for sending (all connections and the outbox)")
RECONNECTS = Counter("factstream_reconnects", "Client reconnection attempts", ["target"])
CATCHUP_FETCHES = Counter("factstream_catchup_fetches", "Out-of-band catch-up pages fetched", ["stream"])
CATCHUP_ROWS = Counter("factstream_catchup_rows", "Rows obtained by catch-up", ["stream"])
DISCONNECTS = Counter("factstream_disconnects", "Connections closed, by reason", ["reason"])
DROPPED_ROWS = Counter("factstream_dropped_rows", "Rows ignored by a reader (stale, duplicate, unknown position)", ["stream", "why"])


def start_http_server(port: int, addr: str = "127.0.0.1") -> None:
    """Serve /metrics on ``addr:port`` (loopback unless told otherwise)."""
    import prometheus_client

    prometheus_client.start_http_server(port, addr=addr)
