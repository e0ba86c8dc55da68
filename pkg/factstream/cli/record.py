"""``factstream record``: a flight recorder for replication traffic.

It follows a TCP replication listener (as a reader: NAME, PING, REPLICATE),
a Redis deployment's channels (only listening) or a NATS JetStream
deployment's log from its end (every line of every page, in order, through a
reconnect) and its control subject, and writes every line it
sends or receives, with its time and direction, into rotating gzip capture
files that ``factstream logs parse`` reads (see :mod:`.capture`). It rides
out disconnects: each one becomes a ``# disconnected`` marker line (and a
WARNING), and the reconnect a ``# connected`` line, so a report shows the
hole instead of an unexplained gap.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from typing import Any

from .. import transport
from ..redaction import redact_url
from .argtypes import duration, size_bytes
from .capture import CaptureError, CaptureWriter, check_capture_name, prefix_lines
from .link import LinkError, open_link, utc_stamp
from .link import connect_within
from .signals import stop_on_signals
from .tail import add_link_options, link_options, parse_target

log = logging.getLogger("factstream.record")
PROG = "factstream record"

#: Most seconds between two reconnect attempts. A recorder waiting longer misses what the source says
#: once it is back (Redis pub/sub keeps nothing for a subscriber that is not there): at 30 s, one that
#: lost Redis for 12 s was deaf for seconds after Redis returned.
RETRY_MAX = 2.0


def retry_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failed attempt in a row: 0.5, 1, 2, then every 2."""
    return min(RETRY_MAX, 0.25 * (1 << min(failures, 7)))


def worth_saying(failures: int) -> bool:
    """Whether the ``failures``-th failed attempt in a row gets its WARNING: the first four, then the 8th,
    16th, 32nd... (a long outage at one attempt per 2 s would otherwise be a line every 2 s)."""
    return failures <= 4 or failures & (failures - 1) == 0
#: The smallest --rotate-size: below it a busy deployment rotates many files a second.
MIN_ROTATE = 64 << 10


def rotate_size(text: str) -> int:
    """argparse type for --rotate-size: a size of at least 64k."""
    value = size_bytes(text)
    if value < MIN_ROTATE:
        raise argparse.ArgumentTypeError(f"must be at least 64k (smaller files would rotate many times a second), "
                                         f"got {text!r} ({value} bytes; a number without a unit is bytes)")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "record",
        help="record a writer's (TCP) or a deployment's (Redis, NATS) traffic into rotating gzip files for 'logs parse'",
        description=(
            "A flight recorder: follow a TCP replication listener (HOST:PORT, as a reader), a Redis deployment "
            "(--redis URL --server-name NAME, listening only) or a NATS JetStream deployment (--nats URL "
            "--server-name NAME: its log from now on, and its control subject) and write every line with its UTC "
            "time and direction "
            "('>' received, '<' sent, '#' a recorder note) into DIR/<capture>.<start>.<seq>.log.gz. Files rotate by "
            "size and by time; the gzip member in progress is finished --flush-interval after its first line, on "
            "rotation and on SIGTERM, so a crash loses at most the last --flush-interval. Disconnects are written "
            "as '# disconnected' lines (one per hole) and the recorder reconnects, trying at least every 2 s (a "
            "WARNING for each of the first four failed attempts, then for the 8th, 16th, ...). A capture file that "
            "cannot be written "
            "(disk full, --dir removed) stops it with exit 1, its files complete to their last member. "
            "Read the files with "
            "'factstream logs parse DIR --out PARQUET'."
        ),
        epilog="example: factstream record 127.0.0.1:9092 --dir /var/log/factstream --rotate-size 64M --rotate-time 1h",
    )
    p.add_argument("target", metavar="HOST:PORT", nargs="?", help="the writer's replication listener (TCP)")
    p.add_argument("--redis", metavar="URL", help="record a Redis deployment's channels instead (needs --server-name)")
    p.add_argument("--nats", metavar="URL",
                   help="record a NATS JetStream deployment's log and control subject instead (needs --server-name)")
    p.add_argument("--dir", default=".", help="directory of the capture files (default: the current one; created if "
                                              "missing, and removed again when nothing could be recorded)")
    p.add_argument("--name", dest="capture", help="capture name, the files' first part (default HOST-PORT, "
                                                  "redis-SERVER_NAME or nats-SERVER_NAME)")
    p.add_argument("--rotate-size", type=rotate_size, default=64 << 20, metavar="SIZE",
                   help="start a new file when the current one reaches SIZE on disk (default 64M, at least 64k; "
                        "a number without a unit is bytes)")
    p.add_argument("--rotate-time", type=duration(), default=3600.0, metavar="DURATION",
                   help="start a new file after DURATION (default 1h)")
    p.add_argument("--flush-interval", type=duration(), default=1.0, metavar="DURATION",
                   help="finish the gzip member in progress this long after its first line (default 1s): the "
                        "most a crash can lose")
    p.add_argument("--duration", type=duration(), default=None, metavar="DURATION", help="stop after DURATION")
    p.add_argument("--user-ip", action="store_true", help="with --redis: also record the <server-name>/USER_IP channel")
    p.add_argument("--client-name", default="factstream-record", help="name sent in NAME (TCP)")
    add_link_options(p)
    p.set_defaults(func=run)


class Recorder:
    """Lines in, prefixed lines out to the capture files; counts for the summary.

    A capture file that cannot be written (disk full, --dir removed) stops the recording: the error is
    kept in ``writer.failed`` and ``stop`` is set, whichever transport callback hit it. The gzip member in
    progress is finished by a timer at ``writer.due`` (--flush-interval after its first line), not by the
    next periodic tick, so a crash loses at most --flush-interval of a quiet capture."""

    def __init__(self, writer: CaptureWriter, stop: asyncio.Event) -> None:
        self.writer = writer
        self.stop = stop
        self.disconnects = 0
        #: Connected now: a lost connection or the stop is a hole to mark, once (not again at the stop).
        self.linked = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timed = 0  # the member (writer.members) the timer is armed for

    def _write(self, data: bytes, lines: int) -> None:
        if self.writer.failed is not None:
            return
        try:
            self.writer.write(data, lines)
        except CaptureError:
            self.stop.set()
            return
        if self._timer is None and self.writer.due is not None:
            self._arm()

    def _arm(self) -> None:
        due = self.writer.due
        assert due is not None
        # at most flush_interval away, so a wall clock stepped back does not hold the member for long
        left = min(max(due - time.time(), 0.0), self.writer.flush_interval)
        self._timed = self.writer.members
        self._timer = self._loop.call_later(left, self._flush)

    def _flush(self) -> None:
        """The timer: finish the member it was armed for, or wait for the newer one opened since."""
        self._timer = None
        if self.writer.failed is not None or self.writer.due is None:
            return
        if self.writer.members != self._timed:
            self._arm()
            return
        try:
            self.writer.flush()
        except CaptureError:
            self.stop.set()

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def tick(self) -> None:
        if self.writer.failed is not None:
            return
        try:
            self.writer.tick()
        except CaptureError:
            self.stop.set()

    def received(self, chunk: bytes) -> None:
        self._write(prefix_lines(utc_stamp().encode(), b">", chunk), chunk.count(b"\n"))

    def sent(self, lines: list[bytes]) -> None:
        chunk = b"".join(line + b"\n" for line in lines)
        self._write(prefix_lines(utc_stamp().encode(), b"<", chunk), len(lines))

    def note(self, text: str) -> None:
        self._write(f"{utc_stamp()} # {text}\n".encode(), 1)

    def connected(self, what: str) -> None:
        self.linked = True
        self.note(f"connected {what}")

    def disconnected(self, why: str) -> bool:
        """Write the ``# disconnected`` note unless it is written already (False): one per hole, so a stop
        while the carrier is gone adds none."""
        if not self.linked:
            return False
        self.linked = False
        self.note(f"disconnected {why}")
        return True


async def record_tcp(args: argparse.Namespace, rec: Recorder, stop: asyncio.Event) -> int:
    opts = link_options(args, args.client_name)
    try:
        link = await connect_within(opts)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    failures = 0
    while True:
        rec.connected(f"tcp {opts.target} server {link.server_name}")
        rec.sent(link.sent[:2])
        rec.received(f"SERVER {link.server_name}\n".encode())
        if len(link.sent) > 2:
            rec.sent(link.sent[2:])
        link.on_sent.append(rec.sent)
        why = await _pump(link, rec, stop)
        await link.close()
        if why is None:
            return 0
        if rec.disconnected(why):
            rec.disconnects += 1
        log.warning("%s; reconnecting", why)
        while True:
            if stop.is_set():
                return 0
            try:
                link = await open_link(opts)
                failures = 0
                break
            except LinkError as err:
                failures += 1
                if err.permanent:
                    print(f"{PROG}: {err}", file=sys.stderr)
                    return 1
                if worth_saying(failures):
                    log.warning("reconnect attempt %d to %s failed: %s", failures, opts.target, err)
                try:
                    await asyncio.wait_for(stop.wait(), retry_delay(failures))
                except TimeoutError:
                    pass


async def _pump(link: Any, rec: Recorder, stop: asyncio.Event) -> str | None:
    """Record until stopped (None) or the link ends (the reason)."""
    stopper = asyncio.ensure_future(stop.wait())
    try:
        while True:
            reader = asyncio.ensure_future(link.read())
            done, _ = await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                reader.cancel()
                return None
            try:
                rec.received(reader.result())
            except LinkError as err:
                return str(err)
    finally:
        stopper.cancel()


async def record_redis(args: argparse.Namespace, rec: Recorder, stop: asyncio.Event) -> int:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    from ..transport.redis import RedisChannels
    from .link import check_redis

    await check_redis(args.redis, args.server_name, PROG, args.connect_timeout)
    channels = RedisChannels.for_server(args.server_name)
    names = [channels.main] + ([channels.user_ip] if args.user_ip else [])
    shown = redact_url(args.redis)
    failures = 0
    while not stop.is_set():
        client = aioredis.from_url(args.redis, socket_connect_timeout=args.connect_timeout)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(*names)
            rec.connected(f"redis {shown} channels {' '.join(names)}")
            failures = 0
            while not stop.is_set():
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if msg is None:
                    rec.tick()
                    continue
                data = msg.get("data")
                if isinstance(data, bytes):
                    rec.received(data.replace(b"\n", b" ") + b"\n")
        except (RedisError, OSError) as err:
            failures += 1
            why = f"Redis {shown}: {err}"
            if rec.disconnected(why):
                rec.disconnects += 1
            if worth_saying(failures):
                log.warning("%s; reconnecting (attempt %d)", why, failures)
            try:
                await asyncio.wait_for(stop.wait(), retry_delay(failures))
            except TimeoutError:
                pass
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: PubSub.aclose is unannotated
                await client.aclose()
            except (RedisError, OSError):
                pass
    return 0


async def record_nats(args: argparse.Namespace, rec: Recorder, stop: asyncio.Event) -> int:
    """The deployment's log from its end (a JetStream consumer: nothing lost across a reconnect) and its
    control subject (plain NATS, at most once), each page's lines as received lines."""
    from ..transport.nats import JetStreamLayout, NatsStats, connect_nats
    from ..transport.nats.client import _Api
    from ..transport.nats.consumer import _LogConsumer
    from ..transport.nats.tail import require_stream
    from .link import check_nats

    await check_nats(args.nats, args.server_name, PROG, args.connect_timeout)
    layout = JetStreamLayout.for_server(args.server_name)
    shown = redact_url(args.nats)

    closing: list[bool] = []

    async def disconnected() -> None:
        if stop.is_set() or closing:
            return  # our own close
        if rec.disconnected(f"NATS {shown}"):
            rec.disconnects += 1
            log.warning("NATS %s: connection lost; reconnecting", shown)

    async def reconnected() -> None:
        rec.connected(f"nats {shown} stream {layout.stream}")

    def page(subject: str, data: bytes, headers: bytes | None, seq: int, ts: int, pending: int) -> None:
        if data:
            rec.received(data if data.endswith(b"\n") else data + b"\n")

    async def control(msg: Any) -> None:
        rec.received(msg.data.replace(b"\n", b" ") + b"\n")

    nc = await connect_nats(args.nats, name="factstream-record", timeout=args.connect_timeout,
                            disconnected_cb=disconnected, reconnected_cb=reconnected)
    try:
        api = _Api(nc, layout)
        try:
            await require_stream(api, args.nats, args.server_name)  # a mistyped --server-name: say so, exit 1
        except LookupError as err:
            print(f"{PROG}: {err}", file=sys.stderr)
            return 1
        await nc.subscribe(layout.control_subject, cb=control)
        consumer = _LogConsumer(api, page, NatsStats(), deliver_new=True, description="factstream record")
        rec.connected(f"nats {shown} stream {layout.stream}")
        consumer.start()
        await stop.wait()
        await consumer.close()
    finally:
        closing.append(True)
        await nc.close()
    return 0


def check_args(args: argparse.Namespace) -> str:
    """The capture name, once the options are known to fit together (usage errors exit 2)."""
    from .link import cli_exit as cli_error
    from .link import refuse_tls_options

    if sum(map(bool, (args.target, args.redis, args.nats))) != 1:
        cli_error(PROG, "give HOST:PORT (TCP), --redis URL or --nats URL (exactly one)", 2)
    refuse_tls_options(args, PROG)  # TCP's TLS options would leave a Redis/NATS link in plaintext
    if (args.redis or args.nats) and not args.server_name:
        which = "--redis" if args.redis else "--nats"
        cli_error(PROG, f"{which} needs --server-name NAME (it names the deployment's "
                        f"{'channel' if args.redis else 'JetStream stream'})", 2)
    if args.nats and args.user_ip:
        cli_error(PROG, "--user-ip applies to --redis (over NATS, USER_IP travels on the control subject, "
                        "which is recorded)", 2)
    if args.target and args.user_ip:
        cli_error(PROG, "--user-ip applies to --redis (it adds the <server-name>/USER_IP channel); a TCP "
                        "listener sends USER_IP on the connection, which is recorded", 2)
    if os.path.exists(args.dir) and not os.path.isdir(args.dir):
        cli_error(PROG, f"--dir {args.dir} is a file, not a directory: give a directory for the capture files "
                        "(it is created if missing)", 2)
    if args.capture is not None:
        try:
            check_capture_name(args.capture)
        except ValueError as err:
            cli_error(PROG, f"--name: {err}", 2)
        return str(args.capture)
    if args.target:
        host, port = parse_target(args.target, PROG)
        return f"{host.replace('.', '_').replace(':', '_').replace('/', '_')}-{port}"
    kind = "redis" if args.redis else "nats"
    return f"{kind}-{args.server_name.replace('.', '_').replace('/', '_')}"


def missing_dirs(path: str) -> list[str]:
    """The directories ``os.makedirs(path)`` would create, deepest first."""
    out = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return out


def remove_if_empty(created: list[str]) -> None:
    """Remove the directories this run created when nothing was written in them (a failed connection)."""
    for path in created:
        try:
            os.rmdir(path)  # only succeeds when empty
        except OSError:
            return


async def record(args: argparse.Namespace) -> int:
    capture = check_args(args)
    created = missing_dirs(args.dir)
    try:
        writer = CaptureWriter(args.dir, capture, rotate_bytes=args.rotate_size, rotate_seconds=args.rotate_time,
                               flush_interval=args.flush_interval)
    except OSError as err:
        remove_if_empty(created)
        print(f"{PROG}: cannot write capture files in --dir {args.dir}: {err.strerror or err}", file=sys.stderr)
        return 1
    try:
        return await _record(args, writer)
    finally:
        if not writer.files and not writer.lines:
            remove_if_empty(created)


async def _record(args: argparse.Namespace, writer: CaptureWriter) -> int:
    """Record until stopped, then print the summary."""
    for path in writer.recovered:
        log.warning("finished %s left behind by an earlier recorder (complete gzip members kept)", path)
    stop = asyncio.Event()
    rec = Recorder(writer, stop)
    interrupted = stop_on_signals(stop)
    loop = asyncio.get_running_loop()
    if args.duration:
        loop.call_later(args.duration, stop.set)

    async def ticker() -> None:
        """Rotates an idle file by --rotate-time (members are finished by the recorder's timer)."""
        while True:
            await asyncio.sleep(0.5)
            rec.tick()

    tick = asyncio.ensure_future(ticker())
    started = time.monotonic()
    try:
        if args.redis:
            status = await record_redis(args, rec, stop)
        elif args.nats:
            status = await record_nats(args, rec, stop)
        else:
            status = await record_tcp(args, rec, stop)
    finally:
        tick.cancel()
        rec.cancel_timer()
        if writer.lines and stop.is_set():
            rec.disconnected("recorder stopped")  # not when the carrier was lost: that hole is marked
        try:
            writer.close()
        except CaptureError:
            pass
    failed = writer.failed
    if failed is not None:
        print(f"{PROG}: cannot write the capture files in --dir {args.dir}: {failed.reason} ({failed.path}); "
              f"recording stopped after {writer.lines} lines: {len(writer.files)} file(s) finished, each complete "
              f"to its last gzip member; the {failed.lost} lines of the unfinished member are lost", file=sys.stderr)
        return 1
    if writer.lines or status == 0:
        print(f"{PROG}: {writer.lines} lines in {len(writer.files)} file(s) under {args.dir} "
              f"({rec.disconnects} disconnects, {time.monotonic() - started:.1f}s)", file=sys.stderr)
    if interrupted and interrupted[0] == signal.SIGINT:
        return 130
    return status


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: record(args), use_uvloop=not args.no_uvloop)
