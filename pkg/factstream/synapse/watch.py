"""``factstream synapse watch``: follow a live deployment over Redis and report, every interval.

Subscribes to the deployment's channel (``<server_name>``) like any Synapse
worker, publishes one ``REPLICATE`` so that every writer announces its
positions (what a worker does on connecting; harmless), feeds every command
to a :class:`~factstream.synapse.watchdog.Watchdog`, probes the database
(``--db``) in a worker thread, and prints a report (a table on a terminal,
one JSON object per line with ``--json``) and/or serves Prometheus metrics.

A probe that has not answered within ``--db-timeout`` (a table locked by a
migration, a server that stopped answering) is given up on, its query
cancelled or its connection cut, and reported as the database probe's failure:
the watch goes on and probes again at the next report, never stalled by its
database.
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import json
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import IO, Any

from .. import wire
from ..store import deadline
from ..errors import FactstreamError
from ..redaction import redact_text, redact_url
from ..transport.redis import RedisCarrier
from .watch_db import DbProbe
from .watch_metrics import WatchMetrics
from .watchdog import AUDITED_STREAMS, Problem, Watchdog

__all__ = ["WatchOptions", "WatchError", "run_watch", "SILENT_AFTER"]

log = logging.getLogger(__name__)

#: Seconds after subscribing (and sending REPLICATE) by which a live deployment's writers have answered.
SILENT_AFTER = 2.0


class WatchError(FactstreamError):
    """The watch could not run at all (metrics endpoint refused, Redis never reached)."""


@dataclass
class WatchOptions:
    """What ``factstream synapse watch`` was asked to do."""

    redis_url: str = field(repr=False)  # may hold a password, as db_url may
    server_name: str
    db_url: str | None = field(default=None, repr=False)
    #: Where ``db_url`` came from when it was not --db (the config's database section), for messages.
    db_origin: str | None = None
    interval: float = 5.0
    frozen_after: float = 30.0
    json_output: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    duration: float | None = None
    replicate: bool = True
    #: With ``--config``: replication stream -> the writers the config names, and which files said so.
    configured: Mapping[str, tuple[str, ...]] | None = None
    config_source: str | None = None
    #: Where ``redis_url`` came from, for the message when it never connects.
    redis_origin: str = "the --redis URL"
    #: Seconds the database gets to answer the connect at the start, then each probe (``--db-timeout``).
    db_timeout: float = deadline.DEFAULT


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _redis_state(down_for: float, lost: bool) -> str:
    """The header's word on a missing subscription: since when, that it is retried, and what is not judged."""
    since = f"lost {down_for:.0f}s ago" if lost else f"not reached in {down_for:.0f}s"
    return f"NOT SUBSCRIBED to Redis ({since}, retrying; frozen and writer_behind not judged meanwhile)"


def _text(opts: WatchOptions, writers: list[dict[str, Any]], problems: list[Problem], redis_up: bool,
          db_error: str | None, down_for: float = 0.0, lost: bool = False) -> str:
    # A failed database probe is a problem of the report (not healthy): the header counts it with the others.
    # Without Redis the count (redis_down among them) still ends the header, as ": N problem(s)" always does.
    count = len(problems) + (1 if db_error else 0)
    if not redis_up:
        state = f"{_redis_state(down_for, lost)}: {count} problem(s)"
    elif count:
        state = f"{count} problem(s)"
    else:
        state = "healthy" if writers else "waiting for the writers to answer"
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
        where = f" {p.stream}/{p.writer}" if p.stream else ""
        lines.append(f"  {p.kind.upper()}{where}: {p.summary}")
    return "\n".join(lines)


def _silent(opts: WatchOptions, seconds: float) -> Problem:
    """The problem of a channel on which no writer spoke: most likely the wrong server name or Redis."""
    why = ("although the REPLICATE sent on subscribing asks every Synapse writer to answer at once"
           if opts.replicate else "(with --no-replicate an idle deployment is quiet too: drop it to ask the writers)")
    if opts.config_source:
        where = (f"that {opts.config_source} is the config Synapse runs with (its server_name is the channel and "
                 "its redis section the Redis, unless --server-name or --redis say otherwise)")
    else:
        where = ("that --server-name is the server_name in homeserver.yaml and that --redis names the host and port "
                 "of its redis section (pub/sub ignores the /db number)")
    return Problem(
        "silent", "", "",
        f"nothing heard from any writer on the channel {opts.server_name!r} of {redact_url(opts.redis_url)} "
        f"in {seconds:.1f}s, {why}: check {where}, and that Synapse runs with redis enabled")


def _redis_down(opts: WatchOptions, seconds: float, last_error: str | None) -> Problem:
    """The problem of a lost (or never made) subscription: the wire cannot be judged meanwhile."""
    why = f" (last error: {last_error})" if last_error else ""
    return Problem(
        "redis_down", "", "",
        f"not subscribed to {redact_url(opts.redis_url)} for {seconds:.0f}s{why}, still retrying: if this is the "
        "deployment's Redis, Synapse's processes cannot replicate either; check that Redis runs there and accepts "
        "connections (frozen and writer_behind are not judged until the watch hears the channel again)")


class _Probing:
    """The database probe of each report, within ``--db-timeout``, and never two at once.

    A probe given up on is cancelled (or its connection cut) and ends within
    a second or two; one that does not (a reconnect to a host that does not
    answer, which nothing interrupts, waits for its ``connect_timeout``) is
    left to end on its own, and the reports meanwhile say so rather than pile
    up threads and connections behind it.
    """

    def __init__(self, probe: DbProbe, opts: WatchOptions) -> None:
        self.probe = probe
        self.after = opts.db_timeout
        self.url = probe.url
        self._ended = threading.Event()
        self._ended.set()
        self._given_up_at = 0.0

    def idle(self) -> bool:
        """No probe is running (its connection may be touched)."""
        return self._ended.is_set()

    async def run(self, dog: Watchdog) -> str | None:
        """Probe and feed ``dog``; what went wrong, for the report (None when the probe worked)."""
        if not self.idle():
            return (f"{redact_url(self.url)} has still not answered: the probe given up on "
                    f"{time.monotonic() - self._given_up_at:.0f} s ago has not ended yet (a connect waits for its "
                    "connect_timeout); probing again once it has")
        ended = self._ended
        ended.clear()
        tokens, audit = dog.tokens(), dog.audit_ranges(AUDITED_STREAMS)

        def read() -> Any:
            try:
                return self.probe.probe(tokens, audit)
            finally:
                ended.set()

        try:
            views = await deadline.within_thread_async(read, self.after, self.url)
            dog.on_database(views)
        except deadline.NoAnswer as exc:
            self._given_up_at = time.monotonic()
            return redact_text(str(exc))
        except Exception as exc:  # keep watching the wire; say what the database said
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if self.idle():
                self.probe.close()
            return redact_text(first)
        return None


def _serve_metrics(metrics: WatchMetrics, port: int, host: str) -> Any:
    """Start the metrics endpoint, or WatchError naming the option to change."""
    try:
        return metrics.serve(port, host)
    except socket.gaierror as err:
        raise WatchError(f"--metrics-host {host!r}: cannot listen there ({err.strerror or err}); give an address of "
                         "this machine, e.g. 127.0.0.1 or 0.0.0.0 for every interface") from None
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno == errno.EADDRINUSE:
            raise WatchError(f"--metrics-port {port}: {host}:{port} is already in use by another process; choose "
                             "another port (0 picks a free one)") from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise WatchError(f"--metrics-host {host!r}: not an address of this machine ({reason}); use 127.0.0.1, "
                             "0.0.0.0 for every interface, or one of its interface addresses") from None
        if err.errno == errno.EACCES:
            raise WatchError(f"--metrics-port {port}: permission denied ({reason}); ports below 1024 need root: "
                             "choose a port above 1023") from None
        raise WatchError(f"cannot serve metrics on {host}:{port} (--metrics-host, --metrics-port): {reason}") from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def run_watch(opts: WatchOptions, out: IO[str], err: IO[str] | None = None) -> int:
    """Watch until cancelled (or ``duration`` seconds); 0 if the last report was healthy, else 1.

    WatchError when it could not watch at all: the metrics endpoint cannot
    listen, or Redis was never reached during the whole ``duration``.
    """
    err = sys.stderr if err is None else err
    started = time.monotonic()
    ends_at = None if opts.duration is None else started + opts.duration
    dog = Watchdog(frozen_after=opts.frozen_after)
    probe = DbProbe(opts.db_url, opts.db_origin, watch=deadline.watch) if opts.db_url else None
    probing = None
    if probe is not None:
        # NoAnswer past --db-timeout, CheckError when it cannot connect: the watch does not start (exit 2).
        await deadline.within_thread_async(probe.open, opts.db_timeout, probe.url)
        probing = _Probing(probe, opts)
    metrics = WatchMetrics() if opts.metrics_port is not None else None
    server = None
    if metrics is not None and opts.metrics_port is not None:
        server = _serve_metrics(metrics, opts.metrics_port, opts.metrics_host)
        err.write(f"factstream synapse watch: Prometheus metrics on "
                  f"http://{_url_host(opts.metrics_host)}:{server[0].server_port}/metrics\n")
        err.flush()
    carrier: RedisCarrier
    subscribed_at: list[float] = []
    # Synapse's writers answer a REPLICATE within milliseconds; without one, only traffic speaks.
    grace = SILENT_AFTER if opts.replicate else max(SILENT_AFTER, opts.frozen_after)

    def subscribed() -> None:
        if not subscribed_at:
            subscribed_at.append(time.monotonic())
        if opts.replicate:
            carrier.send(wire.ReplicateCommand())

    carrier = RedisCarrier(opts.redis_url, opts.server_name, on_command=dog.on_command, on_subscribed=subscribed,
                           client_name="factstream-synapse-watch")
    healthy = False
    warned_redis = warned_silent = False
    down_since: float | None = None
    try:
        async with carrier:
            while True:
                wait = opts.interval if ends_at is None else min(opts.interval, ends_at - time.monotonic())
                await asyncio.sleep(max(wait, 0.0))
                final = ends_at is not None and time.monotonic() >= ends_at
                db_error = await probing.run(dog) if probing is not None else None
                now = time.monotonic()
                redis_up = carrier.subscribed
                problems = dog.problems(wire_seen=redis_up)
                writers = dog.snapshot()
                if redis_up:
                    down_since = None
                else:
                    down_since = started if down_since is None and not subscribed_at else (down_since or now)
                    problems.insert(0, _redis_down(opts, now - down_since, carrier.last_error))
                if not redis_up and not warned_redis and now - started > 10:
                    log.warning("not subscribed to %s yet (still retrying)", redact_url(opts.redis_url))
                    warned_redis = True
                listened = now - subscribed_at[0] if subscribed_at else 0.0
                heard = bool(dog.heard())
                if opts.configured is not None:
                    # A live writer answers the REPLICATE at once; without one (--no-replicate) an idle one is quiet.
                    answered = opts.replicate and redis_up and bool(subscribed_at) and (listened >= grace or final)
                    problems.extend(dog.config_problems(opts.configured, judge_missing=answered, listened=listened,
                                                        source=opts.config_source or "the config"))
                if subscribed_at and not heard and (listened >= grace or final):
                    problems.insert(0, _silent(opts, listened))
                    if opts.json_output and not warned_silent:  # a terminal's report already says it
                        log.warning("%s", problems[0].summary)
                        warned_silent = True
                healthy = redis_up and heard and not problems and db_error is None
                if metrics is not None:
                    metrics.update(writers, problems, redis_up=redis_up, commands_seen=dog.commands_seen,
                                   healthy=healthy)
                if opts.json_output:
                    out.write(json.dumps({
                        "ts": _now_iso(), "server_name": opts.server_name, "healthy": healthy,
                        "redis_subscribed": redis_up, "commands": dog.commands_seen, "db_error": db_error,
                        "writers": writers, "problems": [p.as_json() for p in problems],
                    }, separators=(",", ":")) + "\n")
                else:
                    out.write(_text(opts, writers, problems, redis_up, db_error,
                                    down_for=0.0 if down_since is None else now - down_since,
                                    lost=bool(subscribed_at)) + "\n\n")
                out.flush()
                if final:
                    break
    finally:
        if probe is not None and (probing is None or probing.idle()):  # a probe still running closes its own
            probe.close()
        if server is not None:
            try:
                server[0].shutdown()
                server[0].server_close()
            except (TypeError, AttributeError):
                pass
    if not subscribed_at:
        why = f"last error: {carrier.last_error}" if carrier.last_error else "see the connection errors above"
        raise WatchError(f"could not watch: never subscribed to {redact_url(opts.redis_url)} during the whole "
                         f"--duration ({opts.duration:g}s; {why}): check {opts.redis_origin} "
                         "(host, port, password) and that Redis runs there")
    return 0 if healthy else 1
