"""``factstream tail HOST:PORT`` / ``tail --redis|--nats URL --server-name NAME``: print what arrives.

Over TCP it connects like any reader (NAME, PING, REPLICATE) and prints each
row as it arrives, from the wire bytes it received (no decoding unless
``--format`` asks for row fields). It finishes (``--count``), fails (one line
and a non-zero exit when the peer is unreachable after ``--connect-timeout``,
is not a replication listener, or has another server name), or, with
``--retry``, keeps going and says so (a WARNING per failed attempt). With
``--db`` (the writer's database) it follows as a full reader instead: gaps
are repaired from the stream tables, ``--from-start`` / ``--from TOKEN``
replay stored facts first, and a connection lost and made again at once (a
writer drops a reader that falls behind) is only a warning.

Over Redis (``--redis``) it shows a deployment's traffic as it is, by
default: every command heard on the channel, as its wire line, in arrival
order, without publishing anything (a Synapse deployment's too). With
``--db`` it follows as a reader, exactly like the TCP tail with ``--db``.

Over NATS JetStream (``--nats``) it prints the deployment's stored log as it
grows (``--from-start``: from the oldest message kept); with ``--db`` it
follows as a reader.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable
from typing import IO, Any, TypeVar

from .. import _json, transport
from ..streams.rows import Row
from . import dbtimeout, missing_sqlite
from .argtypes import duration, whole_number
from .link import LinkError, LinkOptions, connect_within, open_link, parse_target, utc_stamp
from .signals import stop_on_signals
from .tailformat import DEFAULT_FORMAT, FormatError, RowFormat, template

__all__ = ["register", "run", "add_link_options", "link_options", "parse_target"]

log = logging.getLogger("factstream.tail")
T = TypeVar("T")
PROG = "factstream tail"


def retry_count(text: str) -> float:
    """argparse type for --retry: a number of reconnects, or 'forever'."""
    if text in ("forever", "inf", "always"):
        return float("inf")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of attempts or 'forever', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return float(value)


def add_link_options(p: argparse.ArgumentParser) -> None:
    """How to reach a TCP listener (shared by tail, record, status, pub)."""
    p.add_argument("--server-name", help="TCP: refuse a server announcing another name; --redis: the channel")
    p.add_argument("--tls", action="store_true", help="connect with TLS (verifying the server)")
    p.add_argument("--cafile", help="CA certificate to verify the server with (implies --tls)")
    p.add_argument("--insecure", action="store_true", help="with --tls: do not verify the certificate (not recommended)")
    p.add_argument("--connect-timeout", type=duration(), default=10.0, metavar="SECONDS",
                   help="give up connecting after this long (default 10; a refused connection is retried until then)")
    p.add_argument("--ping-interval", type=duration(), default=5.0, help="seconds between keepalive PINGs (default 5)")
    p.add_argument("--timeout", type=duration(), default=15.0, help="a server silent this long after its PING is lost (default 15)")
    p.add_argument("--no-uvloop", action="store_true", help="use the stdlib event loop")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tail",
        help="follow a writer over TCP, or watch a deployment's Redis traffic or JetStream log, and print what arrives",
        description=(
            "TCP (HOST:PORT): connect to a replication listener as a reader and print every row delivered, "
            "as 'stream writer token row-json' (or --json, or your --format). Fails with one line when nothing "
            "answers within --connect-timeout, when the peer does not speak the protocol, or when it has another "
            "--server-name; --retry keeps a long-running tail going, warning on every failed attempt. "
            "Redis (--redis URL --server-name NAME): print every command heard on the deployment's channel as its "
            "wire line (e.g. 'RDATA caches master 42 [...]', 'POSITION ...', 'USER_SYNC ...'), in arrival order; "
            "tail only listens (it publishes nothing unless --replicate), so it is safe on a live Synapse "
            "deployment. NATS (--nats URL --server-name NAME): print the deployment's JetStream log as it grows. "
            "With --db (any carrier): follow as a reader, missed facts fetched from the stream "
            "tables: complete and in order, but the reader's view, not the traffic."
        ),
        epilog="example: factstream tail 127.0.0.1:9092 --stream caches --count 10 --format '%T %s %t %r'",
    )
    p.add_argument("target", metavar="HOST:PORT", nargs="?", help="the writer's replication listener (TCP; not with --redis)")
    p.add_argument("--redis", metavar="URL", help="watch replication over Redis pub/sub at URL (needs --server-name)")
    p.add_argument("--nats", metavar="URL",
                   help="read the deployment's JetStream log at URL (needs --server-name): every stored line as it "
                        "grows (--from-start: from the oldest retained), or with --db follow as a reader")
    p.add_argument("--stream", action="append", dest="streams", metavar="S",
                   help="only this stream (repeatable; with --redis and no --db, other commands still show)")
    p.add_argument("--writer", action="append", dest="writers", metavar="NAME", help="only rows of this writer (repeatable)")
    p.add_argument("--json", action="store_true",
                   help='one compact JSON object per row: {"stream","writer","token","row"} (per command with --redis)')
    p.add_argument("--format", metavar="TEMPLATE", type=template,
                   help=r"print each row with this template: %%s stream, %%w writer, %%t token, %%r row JSON, "
                        r"%%l wire line, %%T arrival time, %%{field} a typed row field, \n \t "
                        f"(default {DEFAULT_FORMAT.replace('%', '%%')!r})")
    p.add_argument("--timestamps", action="store_true", help="prefix each row with its arrival time (ISO-8601 UTC)")
    p.add_argument("--db", help="database URL: follow as a full reader, catching up from the stream tables")
    dbtimeout.add_option(p, "with --db: ", "; it bounds connecting and each query, not the tail: at the start tail "
                         "then exits 1, later the query is retried with a warning")
    p.add_argument("--from-start", action="store_true", help="with --db: replay every stored fact first")
    p.add_argument("--from", dest="from_token", type=whole_number(0), metavar="TOKEN",
                   help="with --db: replay the stored facts after TOKEN first, then follow")
    p.add_argument("--count", type=whole_number(1, " (leave it out to run until stopped)"), default=None, metavar="N",
                   help="exit after N rows (N commands with --redis and no --db); default: run until stopped")
    p.add_argument("--retry", type=retry_count, default=0.0, metavar="N|forever",
                   help="after a lost or failed connection, try again up to N times (or forever), warning each time "
                        "(default 0: fail)")
    p.add_argument("--user-ip", action="store_true", help="with --redis: also show the <server-name>/USER_IP channel")
    p.add_argument("--replicate", action="store_true",
                   help="with --redis: publish one REPLICATE so that writers announce their positions")
    p.add_argument("--name", default="factstream-tail", help="client name sent in NAME (instance name with --redis --db)")
    add_link_options(p)
    p.set_defaults(func=run)


def usage(message: str) -> None:
    from .link import cli_exit as cli_error

    cli_error(PROG, message, 2)


def check_target(args: argparse.Namespace) -> None:
    """Exactly one of HOST:PORT, --redis and --nats, and what each needs (usage errors exit 2)."""
    if args.json and args.format:
        usage("give --json or --format, not both")
    if args.db_timeout is not None and not args.db:
        usage("--db-timeout applies to --db URL (reading the writer's database)")
    if args.nats:
        if args.target or args.redis:
            other = "HOST:PORT (TCP)" if args.target else "--redis URL"
            usage(f"give either {other} or --nats URL, not both")
        if not args.server_name:
            usage("--nats needs --server-name NAME: the deployment's server name names its JetStream stream")
        if args.tls or args.cafile or args.insecure or args.user_ip or args.replicate:
            usage("--tls/--cafile/--insecure/--user-ip/--replicate do not apply to --nats (for TLS use a tls:// URL)")
        if args.from_token is not None and not args.db:
            usage("--from needs --db: the facts are replayed from the stream tables")
        if args.from_start and args.from_token is not None:
            usage("give --from-start or --from TOKEN, not both")
        if not args.db and (args.format or args.writers):
            usage("--format and --writer apply to rows; without --db, --nats shows every stored line")
        return
    if args.redis and args.target:
        usage("give either HOST:PORT (TCP) or --redis URL, not both")
    if not args.redis and not args.target:
        usage("say where to listen: HOST:PORT of a TCP replication listener, "
              "or --redis redis://HOST:PORT --server-name NAME")
    if (args.from_start or args.from_token is not None) and not args.db:
        usage(f"{'--from-start' if args.from_start else '--from'} needs --db: the facts are replayed from the stream tables")
    if args.from_start and args.from_token is not None:
        usage("give --from-start or --from TOKEN, not both")
    if args.redis:
        if not args.server_name:
            usage("--redis needs --server-name NAME: the deployment's server name is the channel to watch")
        if args.tls or args.cafile or args.insecure:
            usage("--tls/--cafile/--insecure apply to TCP; for Redis over TLS use a rediss:// URL "
                  "(e.g. rediss://host:6380?ssl_ca_certs=/path/ca.pem)")
        if args.db and (args.user_ip or args.replicate):
            usage("--user-ip and --replicate show raw traffic; they do not combine with --db "
                  "(which follows as a reader and already publishes REPLICATE)")
        if not args.db and (args.format or args.writers):
            usage("--format and --writer apply to rows; without --db, --redis shows every command as its wire line")
    else:
        parse_target(args.target, PROG)
        if args.user_ip or args.replicate:
            usage("--user-ip and --replicate need --redis")


def link_options(args: argparse.Namespace, client_name: str, *, replicate: bool = True) -> LinkOptions:
    """The LinkOptions of a TCP target given on the command line."""
    from ..transport.tcp import client_ssl_context

    host, port = parse_target(args.target, f"factstream {args.command}")
    ssl = None
    if args.tls or args.cafile or args.insecure:
        ssl = client_ssl_context(args.cafile, verify=not args.insecure)
    return LinkOptions(host, port, client_name=client_name, expected_server_name=args.server_name, ssl=ssl,
                       connect_timeout=args.connect_timeout, ping_interval=args.ping_interval,
                       timeout=args.timeout, replicate=replicate)


class Output:
    """Rows to stdout's bytes: counts them, stops at --count, notices a closed pipe."""

    def __init__(self, fmt: RowFormat, count: int | None, out: IO[bytes] | None = None) -> None:
        self.fmt = fmt
        self.count = count
        self.seen = 0
        self.out = out or sys.stdout.buffer
        self.done = asyncio.Event()
        self.broken = False

    @property
    def full(self) -> bool:
        return self.count is not None and self.seen >= self.count

    def write(self, data: bytes, rows: int) -> None:
        if not data:
            return
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:
            self.broken = True
            self.done.set()
            return
        self.seen += rows
        if self.full:
            self.done.set()


#: What to do when a writer drops a tail without --db: said once, with the writer's reason or at the end.
_DROPPED_HINT = ("rows the writer sends meanwhile are not shown. With --db DATABASE_URL a tail catches up from "
                 "the database after a drop and misses nothing; --retry N reconnects.")


class FilterWatch:
    """Warns once when --stream/--writer names something no writer announced (a typo, say).

    Without it a mistyped filter prints nothing, forever. Every carrier feeds
    it the same way: :meth:`saw` for each POSITION (``announced=True``) or
    RDATA it meets, :meth:`complete` when it learnt every (stream, writer) at
    once (the JetStream log's subjects). Writers answer a REPLICATE with a
    POSITION per stream at once, so the check runs ``grace`` seconds after the
    first POSITION; when only rows arrive (a Redis tail that publishes
    nothing), ``window`` seconds after the first row.
    """

    def __init__(self, streams: list[str] | None, writers: list[str] | None, who: str = "announced",
                 *, grace: float = 1.0, window: float = 10.0, hint: str = "") -> None:
        self.streams = set(streams or ())
        self.writers = set(writers or ())
        self.who = who
        self.grace = grace
        self.window = window
        self.hint = hint
        self.seen_streams: set[str] = set()
        self.seen_writers: set[str] = set()
        self.done = not self.streams and not self.writers  # nothing to check
        self._timer: asyncio.TimerHandle | None = None
        self._announced = False

    def saw(self, stream: str, writer: str, announced: bool) -> None:
        """A POSITION (``announced``) or a row of ``stream`` by ``writer`` arrived."""
        if self.done:
            return
        self.seen_streams.add(stream)
        self.seen_writers.add(writer)
        if announced and not self._announced:
            self._announced = True
            self._schedule(self.grace)
        elif self._timer is None:
            self._schedule(self.window)

    def complete(self) -> None:
        """Every (stream, writer) there is has been passed to :meth:`saw`: check now."""
        if self._timer is not None:
            self._timer.cancel()
        self.check()

    def _schedule(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self.check)

    def check(self) -> None:
        """Warn about the filters naming nothing seen, listing what was seen (once)."""
        if self.done:
            return
        self.done = True
        for option, wanted, seen, kind in (("--stream", self.streams, self.seen_streams, "streams"),
                                           ("--writer", self.writers, self.seen_writers, "writers")):
            missing = sorted(wanted - seen)
            hint = "" if self._announced else self.hint  # rows only so far: the list may be incomplete
            if missing and seen:
                log.warning("the %s %s are %s; %s %s is not among them (nothing is shown for it)%s",
                            kind, self.who, ", ".join(sorted(seen)), option, ", ".join(missing), hint)
            elif missing:
                log.warning("no %s %s yet; %s %s shows nothing until there is one%s",
                            kind, self.who, option, ", ".join(missing), hint)


class RawTail:
    """The TCP tail without --db: rows printed from the bytes that arrived."""

    def __init__(self, args: argparse.Namespace, output: Output) -> None:
        self.output = output
        self.fmt = output.fmt
        self.streams = {s.encode() for s in args.streams} if args.streams else None
        self.writers = {w.encode() for w in args.writers} if args.writers else None
        self.fast = self.fmt.default and not self.streams and not self.writers
        self.batches: dict[tuple[bytes, bytes], list[bytes]] = {}
        self.errors = 0
        self.hinted = False  # the drop hint was printed, or the writer said why it closed (it was stopping)
        self.retrying = bool(args.retry)  # a long-running tail: its notices are log lines with a time
        self.watch = FilterWatch(args.streams, args.writers, "the server announced")

    def server_error(self, text: bytes) -> None:
        """Print the writer's ERROR line, with what to do when it dropped this tail for reading too slowly."""
        said = text.decode("utf-8", "replace")
        if self.retrying:  # among the reconnect WARNINGs, with their time, not a bare line between them
            log.warning("the server reported: %s", said)
        else:
            print(f"{PROG}: the server reported: {said}", file=sys.stderr)
        if "fell behind" in said and not self.hinted:
            self.hinted = True
            print(f"{PROG}: this tail read more slowly than the writer wrote (a slow pipe, say), so the writer "
                  f"dropped it; {_DROPPED_HINT}", file=sys.stderr)
        elif said == _stopping():
            self.hinted = True  # the close that follows is the writer stopping, not a drop: no hint about one

    def chunk(self, data: bytes) -> None:
        """Print the rows in ``data`` (complete lines)."""
        out = self.output
        if out.full:  # the reader may hand over one more read before it is cancelled: --count is exact
            return
        if self.fast and data.startswith(b"RDATA ") and b" batch " not in data:
            body = b"\n" + data
            n = data.count(b"\n")
            if body.count(b"\nRDATA ") == n and (out.count is None or out.seen + n <= out.count):
                out.write(body.replace(b"\nRDATA ", b"\n")[1:], n)
                return
        stamp = utc_stamp().encode() if self.fmt.needs_time else b""
        parts: list[bytes] = []
        rows = 0
        room = None if out.count is None else out.count - out.seen
        if self.fast:
            self._default_lines(data, room)
            return
        for line in data.split(b"\n"):
            if not line.startswith(b"RDATA "):
                if line.startswith(b"POSITION "):
                    p = line.split(b" ", 3)
                    if len(p) > 2:
                        self.watch.saw(p[1].decode("utf-8", "replace"), p[2].decode("utf-8", "replace"), True)
                elif line.startswith(b"ERROR "):
                    self.server_error(line[6:])
                continue
            f = line.split(b" ", 4)
            if len(f) < 5:
                self.errors += 1
                continue
            _, stream, writer, token, row = f
            if not self.watch.done:
                self.watch.saw(stream.decode("utf-8", "replace"), writer.decode("utf-8", "replace"), False)
            if (self.streams is not None and stream not in self.streams) or (
                    self.writers is not None and writer not in self.writers):
                continue
            if token == b"batch":
                self.batches.setdefault((stream, writer), []).append(row)
                continue
            held = self.batches.pop((stream, writer), None)
            for r in (*held, row) if held else (row,):
                parts.append(self.fmt.render(stream, writer, token, r, stamp))
                rows += 1
                if room is not None and rows >= room:
                    out.write(b"".join(parts), rows)
                    return
        out.write(b"".join(parts), rows)


    def _default_lines(self, data: bytes, room: int | None) -> None:
        """The default format without filters: each line minus 'RDATA ', batches given their token."""
        parts: list[bytes] = []
        append = parts.append
        batches = self.batches
        for line in data.split(b"\n"):
            if not line.startswith(b"RDATA "):
                if line.startswith(b"ERROR "):
                    self.server_error(line[6:])
                continue
            f = line.split(b" ", 4)
            if len(f) < 5:
                self.errors += 1
                continue
            if f[3] == b"batch":
                batches.setdefault((f[1], f[2]), []).append(f[4])
                continue
            if batches:
                held = batches.pop((f[1], f[2]), None)
                if held:
                    head = f[1] + b" " + f[2] + b" " + f[3] + b" "
                    parts.extend(head + r + b"\n" for r in held)
            append(line[6:] + b"\n")
        if room is not None and len(parts) > room:
            del parts[room:]
        self.output.write(b"".join(parts), len(parts))


def _stopping() -> str:
    """The ERROR a stopping factstream writer closes with (imported here: the TCP module is not needed before)."""
    from ..transport.tcp import STOPPING

    return STOPPING


async def tail_raw(args: argparse.Namespace, output: Output, signals: list[int]) -> int:
    """TCP without --db: connect (or fail), print rows, reconnect only with --retry."""
    opts = link_options(args, args.name)
    tail = RawTail(args, output)
    failures = 0
    ever = False
    while True:
        try:
            link = await connect_within(opts)
        except LinkError as err:
            failures += 1
            if err.permanent or failures > args.retry:
                print(f"{PROG}: {err}", file=sys.stderr)
                return 1
            log.warning("attempt %d failed: %s; trying again", failures, err)
            await asyncio.sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
            continue
        if ever:
            log.warning("reconnected to %s; rows sent while disconnected are not shown (use --db to catch up)",
                        opts.target)
        ever = True
        failures = 0
        reader = asyncio.ensure_future(_pump(link, tail))
        stopper = asyncio.ensure_future(output.done.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not reader.done():
                reader.cancel()
            await link.close()
            await asyncio.wait({reader})  # collected here, whatever it ended with
        lost = reader.exception() if not reader.cancelled() else None
        if output.done.is_set():
            return 130 if signal.SIGINT in signals else 0
        if not isinstance(lost, LinkError):
            if lost is not None:
                raise lost
            return 0
        failures += 1
        if failures > args.retry:
            print(f"{PROG}: {lost}", file=sys.stderr)
            if not tail.hinted:
                # A writer drops a reader that cannot keep up, and may say so too late to be read
                # (its ERROR waits behind the rows the reader did not take in time).
                print(f"{PROG}: if the writer is still running, it dropped this tail for reading more slowly "
                      f"than it wrote; {_DROPPED_HINT}", file=sys.stderr)
            return 1
        log.warning("%s; reconnecting (attempt %d)", lost, failures)


async def _pump(link: Any, tail: RawTail) -> None:
    while True:
        tail.chunk(await link.read())


class _Lines:
    """A text sink that feeds ``output`` one command line at a time (for the carriers' own printers)."""

    def __init__(self, output: Output) -> None:
        self.output = output

    def write(self, text: str) -> None:
        if not self.output.full and not self.output.done.is_set():
            self.output.write(text.encode(), 1)

    def flush(self) -> None:
        pass


async def tail_log(args: argparse.Namespace, output: Output) -> int:
    """``--nats`` without ``--db``: print the JetStream log's lines until --count or a signal."""
    from ..transport.nats import tail_nats

    watch = FilterWatch(args.streams, None, "in the deployment's log")

    def announced(pairs: list[tuple[str, str]]) -> None:
        for stream, writer in pairs:
            watch.saw(stream, writer, True)
        watch.complete()

    try:
        stats = await tail_nats(args.nats, args.server_name, args.streams or (), args.json,
                                from_start=args.from_start, out=_Lines(output), stop=output.done,  # type: ignore[arg-type]
                                announced=announced)
    except LookupError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    if stats.invalid:
        print(f"{PROG}: skipped {stats.invalid} messages that are not replication commands", file=sys.stderr)
    return 0


async def tail_traffic(args: argparse.Namespace, output: Output) -> int:
    """``--redis`` without ``--db``: print every command heard on the channel until --count or a signal."""
    from ..commands import PositionCommand
    from .tail_redis import tail_redis

    hint = "" if args.replicate else "; --replicate asks every writer to announce its streams"
    watch = FilterWatch(args.streams, None, "heard on the channel", hint=hint)

    def seen(cmd: Any) -> None:
        stream = getattr(cmd, "stream_name", None)
        if stream is not None and not watch.done:
            watch.saw(stream, getattr(cmd, "instance_name", ""), isinstance(cmd, PositionCommand))

    stats = await tail_redis(
        args.redis, args.server_name, args.streams or (), args.json,
        user_ip=args.user_ip, replicate=args.replicate, out=_Lines(output), stop=output.done,  # type: ignore[arg-type]
        seen=seen,
    )
    if stats.invalid:
        print(f"{PROG}: skipped {stats.invalid} messages that are not replication commands", file=sys.stderr)
    return 0


def _row_bytes(row: Any) -> bytes:
    return _json.dumps(row.to_wire() if isinstance(row, Row) else row).encode()


async def tail_follow(args: argparse.Namespace, output: Output) -> int:
    """With --db: a full reader (Follower) over TCP or Redis, catching up from the stream tables."""
    from ..replication import Follower, ReplicationHub
    from ..demo.tables import DEMO_TABLES

    from ..store.database import connect

    problem = missing_sqlite(args.db, "tail")
    if problem:  # the local mistake first: a wrong --db is named even when the writer is down
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2  # a missing file named by an option: a usage error
    known = sorted(t.stream for t in DEMO_TABLES)
    unknown = sorted(set(args.streams or ()) - set(known))
    if unknown:
        print(f"{PROG}: no stream {', '.join(unknown)} in the writer's tables (its streams: {', '.join(known)})",
              file=sys.stderr)
        return 2
    timeout = dbtimeout.seconds(args.db_timeout)
    try:
        held = await _unless_stopped(dbtimeout.within(_db_positions(args.db, timeout), timeout, args.db), output)
        if held is None:
            return 0  # stopped (Ctrl-C, SIGTERM) while the database was asked: tail() gives the status
        if held:
            _check_writers(args, held)
            _check_from(args, held)
        bounded = connect(dbtimeout.bounded_url(args.db, timeout))  # SQLite: its lock wait ends by the deadline too
        db = await _unless_stopped(dbtimeout.within(bounded, timeout, args.db), output)
    except dbtimeout.NoAnswer as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    if db is None:
        return 0
    if not args.redis and not args.nats:
        opts = link_options(args, args.name, replicate=False)
        try:
            probe = await connect_within(opts)  # fail fast and clearly before the forever-retrying reader starts
        except LinkError as err:
            await db.close()
            print(f"{PROG}: {err}", file=sys.stderr)
            return 1
        await probe.close()
    # Each query the follower makes has --db-timeout: one that does not answer fails, and the follower warns
    # and asks again (as for a database that went away), rather than the stream stopping without a word.
    reads = dbtimeout.QueriesWithin(db, timeout, args.db)
    sources = {t.stream: t.source(reads) for t in DEMO_TABLES}
    start = 0 if args.from_start else args.from_token
    fol = Follower(sources=sources, start_position=start, streams=set(args.streams) if args.streams else None,
                   typed=output.fmt.typed)
    writers = set(args.writers) if args.writers else None
    fmt = output.fmt

    def show(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        if output.done.is_set() or (writers is not None and writer not in writers):
            return
        s, w, t = stream.encode(), writer.encode(), str(token).encode()
        stamp = utc_stamp().encode() if fmt.needs_time else b""
        room = len(rows) if output.count is None else min(len(rows), output.count - output.seen)
        output.write(b"".join(fmt.render(s, w, t, _row_bytes(r), stamp) for r in rows[:room]), room)

    fol.add_handler(show)
    hub = ReplicationHub(args.name, follower=fol)
    client: Any
    if args.nats:
        from ..transport.nats import NatsReplication

        client = await NatsReplication(hub, args.nats, args.server_name, instance_name=args.name).start()
    elif args.redis:
        from ..transport.redis import RedisReplication

        client = await RedisReplication(
            hub, args.redis, args.server_name, instance_name=args.name,
            ping_interval=args.ping_interval, ping_timeout=args.timeout,
        ).start()
    else:
        from ..transport.tcp import TcpClient

        client = await TcpClient(
            hub, opts.host, opts.port, client_name=args.name, expected_server_name=args.server_name, ssl=opts.ssl,
            server_hostname=opts.host if opts.ssl else None, ping_interval=args.ping_interval, timeout=args.timeout,
            connect_timeout=args.connect_timeout,
        ).start()
    status = 0
    try:
        if args.redis or args.nats:
            await output.done.wait()
        else:
            status = await _watch_tcp(client, args, output)
    finally:
        await client.stop()
        await fol.close()
        await db.close()
    return status


async def _unless_stopped(aw: Awaitable[T], output: Output) -> T | None:
    """``aw``'s result, or None when tail is stopped first (its signal handlers only set ``output.done``):
    a database connect in progress is cancelled instead of holding Ctrl-C up until it times out."""
    task = asyncio.ensure_future(aw)
    stop = asyncio.ensure_future(output.done.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _db_positions(url: str, timeout: float) -> dict[tuple[str, str], int]:
    """(stream, writer) -> the position the writer's database holds; empty when it cannot tell.

    A database that cannot be reached is reported here, once (connecting again would wait as long again).
    """
    from ..store.database import DatabaseError
    from .positions import db_positions

    try:
        _, cells, _ = await db_positions(url, timeout)
    except DatabaseError:
        raise
    except Exception as err:  # noqa: BLE001 - the checks this feeds are a courtesy (a foreign database...)
        log.debug("could not read the writers' positions from the database: %s", err)
        return {}
    return {key: max(cell.values()) for key, cell in cells.items() if cell}


def _check_writers(args: argparse.Namespace, held: dict[tuple[str, str], int]) -> None:
    """--writer naming no writer the database knows is a usage error (it would show nothing, silently)."""
    known = sorted({w for _, w in held})
    unknown = sorted(set(args.writers or ()) - set(known))
    if unknown:
        usage(f"no writer {', '.join(unknown)} in the writer's database (its writers: {', '.join(known)})")


def _check_from(args: argparse.Namespace, held: dict[tuple[str, str], int]) -> None:
    """--from past every writer's position is a usage error (nothing would ever be shown).

    Past only some streams, the reader follows those from the writer's
    position and says so (a warning of the follower's, per stream).
    """
    start = args.from_token
    if start is None:
        return
    mine = {k: v for k, v in held.items() if (not args.streams or k[0] in args.streams)
            and (not args.writers or k[1] in args.writers)}
    if not mine:
        return
    shown = ", ".join(f"{s}/{w} {v}" for (s, w), v in sorted(mine.items()))
    if start > max(mine.values()):
        usage(f"--from {start} is past the writer's current position ({shown}): nothing is stored after it; "
              f"give a TOKEN up to {max(mine.values())}, or leave --from out to follow from now")


async def _watch_tcp(client: Any, args: argparse.Namespace, output: Output) -> int:
    """Until done: notice a lost connection and failed reconnects; fail, or with --retry warn on each.

    A connection that is lost and made again at once is not a failure: this reader (--db) catches up
    from the stream tables, nothing is missed. (A writer drops a reader that falls behind, say when
    stdout is read slowly, and a writer may restart.) Only a reconnect that fails counts.
    """
    target = f"{client.host}:{client.port}"
    failed_seen = client.failed_attempts
    ends_seen = client.disconnects
    failures = 0
    started = time.monotonic()
    while not output.done.is_set():
        try:
            await asyncio.wait_for(output.done.wait(), 0.1)
            break
        except TimeoutError:
            pass
        why = None
        if client.disconnects > ends_seen:  # counted, not polled: a reconnect within 0.1 s is seen too
            ends_seen = client.disconnects
            log.warning("connection to %s lost (%s); reconnecting, and catching up from the database",
                        target, client.close_reasons[-1])
        elif client.connects and client.failed_attempts > failed_seen:
            failed_seen = client.failed_attempts
            why = f"reconnecting to {target} failed"
        elif not client.connected and not client.connects and time.monotonic() - started > args.connect_timeout + 1:
            why = f"cannot connect to {target} within {args.connect_timeout:g}s (--connect-timeout)"
            started = time.monotonic()
        if why is not None:
            failures += 1
            if failures > args.retry:
                print(f"{PROG}: {why}", file=sys.stderr)
                return 1
            log.warning("%s; trying again (attempt %d)", why, failures)
    return 0


async def tail(args: argparse.Namespace) -> int:
    check_target(args)
    try:
        fmt = RowFormat(DEFAULT_FORMAT if args.format is None else args.format, json_output=args.json,
                        timestamps=args.timestamps)
    except FormatError as err:
        usage(f"--format: {err}")
    output = Output(fmt, args.count)
    signals = stop_on_signals(output.done)
    if args.nats:
        from .link import check_nats

        await check_nats(args.nats, args.server_name, PROG, args.connect_timeout)
        status = await (tail_follow(args, output) if args.db else tail_log(args, output))
    elif args.redis:
        from .link import check_redis

        await check_redis(args.redis, args.server_name, PROG, args.connect_timeout)
        status = await (tail_follow(args, output) if args.db else tail_traffic(args, output))
    elif args.db:
        status = await tail_follow(args, output)
    else:
        status = await tail_raw(args, output, signals)
    if output.broken:
        return 0
    return 130 if signal.SIGINT in signals else status


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: tail(args), use_uvloop=not args.no_uvloop)
