"""``factstream status``: what ``kafka-consumer-groups --describe`` shows, for a replication deployment.

Per (stream, writer): the current token and the rows per second seen over
``--interval`` seconds, measured as a reader (TCP: NAME, PING, REPLICATE;
Redis: listening on the channel after one REPLICATE; NATS: listening on the
log subjects). For a TCP server with ``--metrics`` (its ``serve
--metrics-port``), also its connected readers: name, address, connected
since, commands buffered, last PING, read from the ``factstream_reader_*``
gauges the server exports. Over NATS JetStream the log itself says more: per
(stream, writer) the JetStream sequence of its last message, and per reader
(its consumer) the sequence delivered, the messages pending and the lag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from typing import Any

from .. import transport
from ..redaction import redact_about, redact_url, split_userinfo
from .argtypes import duration
from .link import LinkError, check_nats, check_redis, cli_exit, parse_target, refuse_tls_options, utc_stamp
from .link import connect_within
from .tail import add_link_options, link_options

PROG = "factstream status"
_METRIC = re.compile(r'^(factstream_reader_\w+)\{(.*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status",
        help="per (stream, writer) current token and rows/s, and a TCP server's or a JetStream log's readers",
        description=(
            "Connect as a reader (TCP HOST:PORT, --redis URL --server-name NAME or --nats URL --server-name NAME) "
            "for --interval seconds and print per (stream, writer) the current token and rows/s. With --metrics "
            "HOST:PORT (the server's 'serve --metrics-port'), also list its connected readers: name, address, "
            "connected since, commands buffered and last PING. With --nats, also the JetStream sequence of each "
            "(stream, writer) and, per reader, the sequence delivered, the messages pending and the lag (the age "
            "of the oldest message it has not received)."
        ),
        epilog="example: factstream status 127.0.0.1:9092 --metrics 127.0.0.1:9100",
    )
    p.add_argument("target", metavar="HOST:PORT", nargs="?", help="a TCP replication listener")
    p.add_argument("--redis", metavar="URL", help="a Redis deployment instead (needs --server-name)")
    p.add_argument("--nats", metavar="URL", help="a NATS JetStream deployment instead (needs --server-name)")
    p.add_argument("--metrics", metavar="HOST:PORT", help="the server's Prometheus endpoint, for its readers")
    p.add_argument("--interval", type=duration(), default=2.0, help="seconds to measure rows/s over (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_link_options(p)
    p.set_defaults(func=run)


class Tally:
    """Tokens and row counts per (stream, writer) from wire lines."""

    def __init__(self) -> None:
        self.token: dict[tuple[str, str], int] = {}
        self.rows: dict[tuple[str, str], int] = {}
        # The listening window (monotonic): rows/s and the reported interval are over it, not over the
        # connect (retried for up to --connect-timeout) or the JetStream inspection that surround it.
        self.started: float | None = None
        self.stopped: float | None = None

    def seconds(self, default: float) -> float:
        """How long the lines were listened to (``default`` when no window was recorded)."""
        if self.started is None or self.stopped is None:
            return default
        return max(self.stopped - self.started, 1e-9)

    def lines(self, lines: list[bytes]) -> None:
        for line in lines:
            if line.startswith(b"RDATA "):
                f = line.split(b" ", 4)
                if len(f) < 5:
                    continue
                key = (f[1].decode("utf-8", "replace"), f[2].decode("utf-8", "replace"))
                self.rows[key] = self.rows.get(key, 0) + 1
                if f[3] != b"batch" and f[3].lstrip(b"-").isdigit():
                    self.token[key] = max(int(f[3]), self.token.get(key, int(f[3])))
            elif line.startswith(b"POSITION "):
                f = line.split(b" ")
                if len(f) >= 5 and f[4].lstrip(b"-").isdigit():
                    key = (f[1].decode("utf-8", "replace"), f[2].decode("utf-8", "replace"))
                    self.token[key] = max(int(f[4]), self.token.get(key, int(f[4])))


async def watch_tcp(args: argparse.Namespace, tally: Tally) -> str:
    opts = link_options(args, "factstream-status")
    try:
        link = await connect_within(opts)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    tally.started = time.monotonic()
    deadline = tally.started + args.interval
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                tally.lines((await asyncio.wait_for(link.read(), left)).split(b"\n"))
            except TimeoutError:
                break
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        tally.stopped = time.monotonic()
        await link.close()
    return str(link.server_name)


async def watch_redis(args: argparse.Namespace, tally: Tally) -> str:
    import redis.asyncio as aioredis

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    await check_redis(args.redis, args.server_name, PROG, args.connect_timeout)
    client = aioredis.from_url(args.redis)
    try:
        pubsub = client.pubsub()
        await pubsub.subscribe(args.server_name)
        await client.publish(args.server_name, b"REPLICATE ")
        tally.started = time.monotonic()
        deadline = tally.started + args.interval
        while (left := deadline - time.monotonic()) > 0:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if msg and isinstance(msg.get("data"), bytes):
                tally.lines([msg["data"]])
        tally.stopped = time.monotonic()
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: PubSub.aclose is unannotated
    except (RedisConnectionError, RedisTimeoutError, OSError) as err:
        # redis-py says "Error 111 connecting to HOST:PORT" for a Redis that went away mid-measurement
        cli_exit(PROG, f"lost Redis at {redact_url(args.redis)} while measuring: {redact_url(str(err))}", 1)
    finally:
        await client.aclose()
    return str(args.server_name)


async def watch_nats(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    """Listen on the log subjects for --interval (rows/s), then read writers and readers from JetStream."""
    from nats.errors import Error as NatsError

    from ..transport.nats import JetStreamLayout, connect_nats
    from ..transport.nats.inspect import inspect_deployment
    await check_nats(args.nats, args.server_name, PROG, args.connect_timeout)
    layout = JetStreamLayout.for_server(args.server_name)

    async def heard(msg: Any) -> None:
        tally.lines(msg.data.split(b"\n"))

    shown = redact_url(args.nats)
    try:
        nc = await connect_nats(args.nats, name="factstream-status", timeout=args.connect_timeout,
                                allow_reconnect=False, max_reconnect_attempts=1)
        try:
            await nc.subscribe(layout.log_subjects, cb=heard)
            tally.started = time.monotonic()
            await asyncio.sleep(args.interval)
            tally.stopped = time.monotonic()
            lost = nc.is_closed  # the server went away during the measurement (no reconnect: counts would be short)
        finally:
            await nc.close()
        if lost:
            cli_exit(PROG, f"lost NATS at {shown} while measuring (the server closed the connection)", 1)
        return await inspect_deployment(args.nats, args.server_name, timeout=args.connect_timeout)
    except LookupError as err:
        cli_exit(PROG, str(err), 1)
    except (NatsError, OSError) as err:
        # a NATS server that went away between the check and the end: nats-py's NoServersError was
        # reported as "internal error ... this is a bug"
        what = str(err) or type(err).__name__
        cli_exit(PROG, f"lost NATS at {shown} while reading the deployment: {redact_url(what)}", 1)


def metrics_url(where: str) -> str:
    """The URL of ``--metrics``: ``HOST:PORT`` (its /metrics), ``HOST:PORT/PATH``, or a whole http(s) URL."""
    if "://" in where:
        return where
    return f"http://{where}" if "/" in where else f"http://{where}/metrics"


class MetricsProblem(Exception):
    """Why ``--metrics`` could not be read (one line, passwords masked)."""

    def __init__(self, url: str, said: str, hint: str = "") -> None:
        # one masking for the whole message: the URL, and whatever urllib quoted of it (redaction.redact_about)
        super().__init__(redact_about(said, url) + hint)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` and the (user, password) it held, for HTTP basic authentication.

    urllib does not take credentials from a URL: it looked ``user:pw@host``
    up as a host name ("Name or service not known"), and a password holding
    '/' was cut at it and its first part shown as a "nonnumeric port".
    ValueError (``url`` masked) for a URL that reads two ways
    (:func:`~factstream.redaction.split_userinfo`).
    """
    from urllib.parse import unquote

    bare, userinfo = split_userinfo(url)
    if userinfo is None:
        return url, None
    user, _, password = userinfo.partition(":")
    return bare, (unquote(user), unquote(password))


def fetch_metrics(where: str, timeout: float) -> str:
    """The text of a factstream writer's Prometheus endpoint; MetricsProblem saying why when ``where`` is not one.

    Any other port could answer: the replication listener (its SERVER line
    is no HTTP: "BadStatusLine", reported as a bug), or another HTTP server
    whose page, holding no factstream gauge, read as "0 connected readers".
    """
    import base64
    import http.client

    url = metrics_url(where)
    try:
        bare, credentials = split_credentials(url)
    except ValueError as err:
        raise MetricsProblem(url, str(err)) from None
    request = urllib.request.Request(bare)
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode("ascii")
        request.add_unredirected_header("Authorization", f"Basic {token}")
    text = ""
    hint = "; give the writer's 'serve --metrics-port' as --metrics HOST:PORT"
    not_one = f"{url} is not a Prometheus metrics endpoint of a factstream writer"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - a user-given local endpoint
            text = str(resp.read().decode("utf-8", "replace"))
    except http.client.RemoteDisconnected:
        raise MetricsProblem(url, f"{not_one}: it closed the connection without an HTTP answer", hint) from None
    except http.client.BadStatusLine as err:
        first = str(err.line if hasattr(err, "line") else err).strip()[:40]
        what = " (a replication listener: its greeting is SERVER)" if first.startswith("SERVER ") else ""
        raise MetricsProblem(url, f"{not_one}: it answered {first!r}, not HTTP{what}", hint) from None
    except urllib.error.HTTPError as err:
        # the form to write is outside the masking, which would show it as USER:***@
        auth = (" (the user and password in the URL were refused)" if credentials else
                " (it wants a user and password: http://USER:PASSWORD@HOST:PORT/metrics)") if err.code == 401 else ""
        raise MetricsProblem(url, f"{not_one} (HTTP {err.code} {err.reason})", f"{auth}{hint}") from None
    except (http.client.HTTPException, ValueError) as err:
        raise MetricsProblem(url, f"{not_one} ({type(err).__name__}: {err})", hint) from None
    except OSError as err:
        raise MetricsProblem(url, f"cannot read metrics from {url}: {getattr(err, 'reason', err)}") from None
    if not any(line.startswith(("factstream_", "# HELP factstream_", "# TYPE factstream_"))
               for line in text.splitlines()):
        raise MetricsProblem(url, f"{not_one} (it answered HTTP but exports no factstream_* metric)", hint)
    return text


async def fetch_metrics_async(where: str, timeout: float) -> str:
    """fetch_metrics off the event loop, in a daemon thread, so that Ctrl-C ends the command at once.

    Run on the loop, the blocking read kept the loop's SIGINT handler from
    running: a silent --metrics port held Ctrl-C for the whole timeout and
    then exited 1 ("timed out"), not 130. A daemon thread (not the default
    executor, which the loop waits for on exit) is left to its timeout.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()

    def settle(text: str | None, err: BaseException | None) -> None:
        if done.done():
            return
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(str(text))

    def work() -> None:
        text: str | None = None
        error: BaseException | None = None
        try:
            text = fetch_metrics(where, timeout)
        except Exception as err:  # noqa: BLE001 - handed to the awaiting coroutine as it is
            error = err
        try:
            loop.call_soon_threadsafe(settle, text, error)
        except RuntimeError:  # the loop is closed: the command already ended (Ctrl-C)
            pass

    threading.Thread(target=work, name="factstream-status-metrics", daemon=True).start()
    return await done


async def checking_metrics(watch: Coroutine[Any, Any, str], where: str, timeout: float) -> str:
    """``watch`` (the connect and the --interval of listening) while ``--metrics`` is read once, from the start.

    The endpoint was first read after the interval: a refused port, an
    unknown host or a page that is no factstream writer's was reported only
    once the whole interval had passed. Its failure now ends the watch at
    once (the current task is cancelled: the watch closes its link); a read
    still running when the watch ends is waited for. The readers listed are
    read again afterwards, as they are at the end of the interval.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    probe = asyncio.ensure_future(fetch_metrics_async(where, timeout))
    watching = True

    def stop_watching() -> None:
        # Again until the watch ends: Python 3.11's wait_for returns the result of an operation that completed
        # as the cancellation arrived, and the watch went on for the whole interval. (With --metrics at the
        # writer's replication port, the probe and the watch read the writer's greeting at the same moment.)
        if watching:
            task.cancel()
            loop.call_later(0.1, stop_watching)

    def failed(probe: asyncio.Future[str]) -> None:
        if not probe.cancelled() and probe.exception() is not None:
            stop_watching()

    def report(probe: asyncio.Future[str]) -> None:
        """Exit saying why the probe failed, if it did (once the watch is over: no await after a cancel)."""
        if probe.done() and not probe.cancelled() and (err := probe.exception()) is not None:
            if isinstance(err, MetricsProblem):
                cli_exit(PROG, str(err), 1)
            raise err

    probe.add_done_callback(failed)
    try:
        server = await watch
    except asyncio.CancelledError:
        watching = False
        report(probe)
        raise  # Ctrl-C
    finally:
        watching = False
        probe.remove_done_callback(failed)
        if not probe.done() and sys.exc_info()[0] is not None:
            probe.cancel()  # the watch failed, or Ctrl-C: the read is no longer wanted
    report(probe)  # failed as the watch ended (its cancellation swallowed)
    try:
        await probe  # not failed, so not cancelled by us: still reading a slow endpoint
    except MetricsProblem as err:
        cli_exit(PROG, str(err), 1)
    return server


async def readers_from_metrics(where: str, timeout: float) -> list[dict[str, Any]]:
    """Connected readers from a server's /metrics (the factstream_reader_* gauges)."""
    try:
        text = await fetch_metrics_async(where, timeout)
    except MetricsProblem as err:
        cli_exit(PROG, str(err), 1)
    readers: dict[tuple[str, str, str], dict[str, Any]] = {}
    field = {"factstream_reader_connected_since_seconds": "connected_since",
             "factstream_reader_buffered_commands": "buffered", "factstream_reader_last_ping_seconds": "last_ping"}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m or m[1] not in field:
            continue
        labels = dict(_LABEL.findall(m[2]))
        key = (labels.get("server", ""), labels.get("name", ""), labels.get("address", ""))
        r = readers.setdefault(key, {"server": key[0], "name": key[1], "address": key[2]})
        r[field[m[1]]] = float(m[3])
    out = []
    for r in readers.values():
        r["buffered"] = int(r.get("buffered", 0))
        for k in ("connected_since", "last_ping"):
            r[k] = utc_stamp(r[k]) if r.get(k) else None
        out.append(r)
    return sorted(out, key=lambda r: (r["server"], r["name"], r["address"]))


async def status(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.target, args.redis, args.nats))) != 1:
        print(f"{PROG}: give HOST:PORT (TCP), --redis URL or --nats URL, with --server-name NAME (exactly one)",
              file=sys.stderr)
        return 2
    if (args.redis or args.nats) and not args.server_name:
        which = "--redis" if args.redis else "--nats"
        print(f"{PROG}: {which} needs --server-name NAME (it names the deployment's "
              f"{'channel' if args.redis else 'JetStream stream'})", file=sys.stderr)
        return 2
    if args.target:
        parse_target(args.target, PROG)
    refuse_tls_options(args, PROG)
    if args.metrics and args.redis:
        print(f"{PROG}: --metrics lists a TCP server's readers; Redis readers are not visible to writers",
              file=sys.stderr)
        return 2
    if args.metrics and args.nats:
        print(f"{PROG}: --metrics lists a TCP server's readers; over NATS the readers are read from JetStream",
              file=sys.stderr)
        return 2
    if args.metrics:
        try:
            split_credentials(metrics_url(args.metrics))
        except ValueError as err:
            print(f"{PROG}: --metrics {err}", file=sys.stderr)
            return 2
    tally = Tally()
    started = time.monotonic()
    log: dict[str, Any] | None = None
    if args.nats:
        log = await watch_nats(args, tally)
        server = str(args.server_name)
    else:
        watch = watch_redis(args, tally) if args.redis else watch_tcp(args, tally)
        server = await (checking_metrics(watch, args.metrics, args.connect_timeout) if args.metrics else watch)
    # rows/s over the window the lines were listened to; "interval" in --json is that same window
    seconds = tally.seconds(max(time.monotonic() - started, 1e-9))
    readers = await readers_from_metrics(args.metrics, args.connect_timeout) if args.metrics else None
    streams = [
        {"stream": s, "writer": w, "token": tally.token.get((s, w)), "rows": tally.rows.get((s, w), 0),
         "rows_per_s": round(tally.rows.get((s, w), 0) / seconds, 1)}
        for s, w in sorted(set(tally.token) | set(tally.rows))
    ]
    doc: dict[str, Any] = {"server": server, "at": utc_stamp(), "interval": round(seconds, 2), "streams": streams}
    if log is not None:
        merge_nats(doc, log)
        readers = log["readers"]
    if readers is not None:
        doc["readers"] = readers
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))
        return 0
    if log is not None:
        print_nats(doc, redact_url(args.nats), args.interval)
        return 0
    where = redact_url(args.redis) if args.redis else args.target
    print(f"server {server} at {where}, measured over {args.interval:g}s, {doc['at']}")
    print(f"{'STREAM':<24} {'WRITER':<14} {'TOKEN':>12} {'ROWS/S':>10}")
    for r in streams:
        print(f"{r['stream']:<24} {r['writer']:<14} {str(r['token'] if r['token'] is not None else '-'):>12} "
              f"{r['rows_per_s']:>10}")
    if args.redis and not streams:
        # a channel nobody writes on (a mistyped --server-name) printed a bare header, as if all were quiet
        print(f"(no writer answered REPLICATE on channel {server!r} within {args.interval:g}s: check --server-name)")
    if readers is not None:
        print(f"\n{len(readers)} connected reader(s)")
        print(f"{'NAME':<22} {'ADDRESS':<22} {'CONNECTED SINCE':<28} {'BUFFERED':>8} {'LAST PING':<28}")
        for r in readers:
            print(f"{r['name']:<22} {r['address']:<22} {r['connected_since'] or '-':<28} {r['buffered']:>8} "
                  f"{r['last_ping'] or '-':<28}")
    return 0


def merge_nats(doc: dict[str, Any], log: dict[str, Any]) -> None:
    """Add the JetStream view to ``doc``: its stream, and per (stream, writer) the log's sequence and token."""
    doc["stream"] = log["stream"]
    doc["messages"] = log["messages"]
    rows = {(r["stream"], r["writer"]): r for r in doc["streams"]}
    for w in log["writers"]:
        r = rows.get((w["stream"], w["writer"]))
        if r is None:
            r = rows[(w["stream"], w["writer"])] = {"stream": w["stream"], "writer": w["writer"], "token": None,
                                                   "rows": 0, "rows_per_s": 0.0}
        if r["token"] is None or (w["token"] is not None and w["token"] > r["token"]):
            r["token"] = w["token"]
        r.update(sequence=w["sequence"], messages=w["messages"], last_at=w["last_at"])
    doc["streams"] = [rows[k] for k in sorted(rows, key=lambda k: (str(k[0]), str(k[1])))]


def print_nats(doc: dict[str, Any], where: str, interval: float) -> None:
    print(f"server {doc['server']} at NATS {where}, JetStream stream {doc['stream']} ({doc['messages']} messages), "
          f"measured over {interval:g}s, {doc['at']}")
    print(f"{'STREAM':<24} {'WRITER':<14} {'TOKEN':>12} {'ROWS/S':>10} {'SEQUENCE':>10}")
    for r in doc["streams"]:
        token = r["token"] if r["token"] is not None else "-"
        print(f"{r['stream']!s:<24} {r['writer']!s:<14} {token!s:>12} {r['rows_per_s']:>10} "
              f"{r.get('sequence', '-')!s:>10}")
    readers = doc["readers"]
    print(f"\n{len(readers)} reader(s) of the log")
    print(f"{'NAME':<22} {'ROLE':<8} {'SEQUENCE':>10} {'PENDING':>8} {'LAG S':>8} {'LAST ACTIVE'}")
    for r in readers:
        lag = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
        print(f"{r['name']:<22} {r['role']:<8} {r['sequence']:>10} {r['pending']:>8} {lag:>8} "
              f"{r['last_active'] or '-'}")
    behind = [(r, s) for r in readers for s in r.get("streams", ()) if s["pending"]]
    if behind:
        print("\nbehind, per (stream, writer)")
        print(f"{'NAME':<22} {'STREAM':<24} {'WRITER':<14} {'PENDING':>8} {'LAG S':>8}")
        for r, s in behind:
            lag = "-" if s["lag_seconds"] is None else f"{s['lag_seconds']:.1f}"
            print(f"{r['name']:<22} {s['stream']!s:<24} {s['writer']!s:<14} {s['pending']:>8} {lag:>8}")


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: status(args), use_uvloop=not args.no_uvloop)
