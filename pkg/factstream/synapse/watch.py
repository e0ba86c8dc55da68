"""``factstream synapse watch``: follow a live deployment over Redis and report, every interval.

Subscribes to the deployment's channel (``<server_name>``) like any Synapse
worker, publishes one ``REPLICATE`` so that every writer announces its
positions (what a worker does on connecting; harmless), feeds every command
to a :class:`~factstream.synapse.watchdog.Watchdog`, probes the database
(``--db``) in a worker thread, and prints a report (a table on a terminal,
one JSON object per line with ``--json``) and/or serves Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from dataclasses import dataclass
from typing import IO, Any

from .. import wire
from ..redaction import redact_text, redact_url
from ..transport.redis import RedisCarrier
from .watch_db import DbProbe
from .watch_metrics import WatchMetrics
from .watchdog import AUDITED_STREAMS, Problem, Watchdog

__all__ = ["WatchOptions", "run_watch"]

log = logging.getLogger(__name__)


@dataclass
class WatchOptions:
    """What ``factstream synapse watch`` was asked to do."""

    redis_url: str
    server_name: str
    db_url: str | None = None
    interval: float = 5.0
    frozen_after: float = 30.0
    json_output: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    duration: float | None = None
    replicate: bool = True


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _text(opts: WatchOptions, writers: list[dict[str, Any]], problems: list[Problem], redis_up: bool,
          db_error: str | None) -> str:
    state = "healthy" if not problems and redis_up else ("NOT SUBSCRIBED to Redis" if not redis_up else
                                                          f"{len(problems)} problem(s)")
    lines = [f"{_now_iso()}  {opts.server_name} via {redact_url(opts.redis_url)}: {state}"]
    if db_error:
        lines.append(f"  database probe failed: {db_error}")
    db = opts.db_url is not None
    head = f"  {'stream':<24} {'writer':<20} {'token':>10} {'rows/s':>8} {'idle s':>8}"
    lines.append(head + (f" {'db lag':>7}" if db else ""))
    for w in writers:
        tok = "-" if w["token"] is None else str(w["token"])
        idle = "-" if w["seconds_since_advance"] is None else f"{w['seconds_since_advance']:.0f}"
        row = f"  {w['stream']:<24} {w['writer']:<20} {tok:>10} {w['rows_per_second']:>8.1f} {idle:>8}"
        if db:
            row += f" {'-' if w['db_lag'] is None else str(w['db_lag']):>7}"
        lines.append(row)
    for p in problems:
        lines.append(f"  {p.kind.upper()} {p.stream}/{p.writer}: {p.summary}")
    return "\n".join(lines)


async def run_watch(opts: WatchOptions, out: IO[str]) -> int:
    """Watch until cancelled (or ``duration`` seconds); 0 if the last report was healthy, else 1."""
    dog = Watchdog(frozen_after=opts.frozen_after)
    probe = DbProbe(opts.db_url) if opts.db_url else None
    if probe is not None:
        await asyncio.to_thread(probe.open)
    metrics = WatchMetrics() if opts.metrics_port is not None else None
    server = metrics.serve(opts.metrics_port, opts.metrics_host) if metrics and opts.metrics_port is not None else None
    carrier: RedisCarrier

    def subscribed() -> None:
        if opts.replicate:
            carrier.send(wire.ReplicateCommand())

    carrier = RedisCarrier(opts.redis_url, opts.server_name, on_command=dog.on_command, on_subscribed=subscribed,
                           client_name="factstream-synapse-watch")
    started = time.monotonic()
    healthy = False
    warned_redis = False
    try:
        async with carrier:
            while True:
                await asyncio.sleep(opts.interval)
                db_error = None
                if probe is not None:
                    try:
                        views = await asyncio.to_thread(probe.probe, dog.tokens(), dog.audit_ranges(AUDITED_STREAMS))
                        dog.on_database(views)
                    except Exception as err:  # keep watching the wire; say what the database said
                        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        db_error = redact_text(first)
                        probe.close()
                problems = dog.problems()
                writers = dog.snapshot()
                redis_up = carrier.subscribed
                if not redis_up and not warned_redis and time.monotonic() - started > 10:
                    log.warning("not subscribed to %s yet (still retrying)", redact_url(opts.redis_url))
                    warned_redis = True
                healthy = redis_up and not problems and db_error is None
                if metrics is not None:
                    metrics.update(writers, problems, redis_up=redis_up, commands_seen=dog.commands_seen)
                if opts.json_output:
                    out.write(json.dumps({
                        "ts": _now_iso(), "server_name": opts.server_name, "healthy": healthy,
                        "redis_subscribed": redis_up, "commands": dog.commands_seen, "db_error": db_error,
                        "writers": writers, "problems": [p.as_json() for p in problems],
                    }, separators=(",", ":")) + "\n")
                else:
                    out.write(_text(opts, writers, problems, redis_up, db_error) + "\n\n")
                out.flush()
                if opts.duration is not None and time.monotonic() - started >= opts.duration:
                    break
    finally:
        if probe is not None:
            probe.close()
        if server is not None:
            try:
                server[0].shutdown()
            except (TypeError, AttributeError):
                pass
    return 0 if healthy else 1
