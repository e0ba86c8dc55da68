"""``factstream serve``: a writer with a replication listener.

It opens the database (embedded SQLite by default), creates the stream tables
(``factstream.demo.tables.DEMO_TABLES``), recovers positions, and publishes
every completed fact to readers over TCP (127.0.0.1 unless told otherwise),
over Redis pub/sub with ``--redis URL`` (channel: the server name, Synapse's
layout), or into a NATS JetStream log with ``--nats URL``. With ``--produce``
it also writes synthetic facts as fast as it can (or at ``--rate``), rolling
back a share of transactions to leave holes: the writer of ``factstream demo``.
As fast as it can means group commits (see :meth:`Writer.produce`), paced by
the publisher so readers get what is written.

A writer outlives its database going away (a restart, a failover, terminated
connections): the listener keeps serving readers, producing pauses and is
retried with capped, jittered backoff, one log line marks the start of each
outage and one its end, and ids reserved by a transaction the outage cut off
complete as rolled back (or committed), so positions keep advancing after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from .. import transport
from ..backoff import Outage
from ..errors import FactstreamError
from ..interpreter import settle
from ..redaction import redact_url
from ..replication import Publisher, ReplicationHub
from ..demo.tables import DEMO_TABLES
from ..replication.tables import StreamTable, create_tables, open_id_generators
from ..replication.written import WrittenRows
from ..store.database import shown_url
from ..status_lines import emit
from .link import check_nats, check_redis, cli_exit
from .signals import stop_on_signals
from .argtypes import duration, fraction, number, port, whole_number

log = logging.getLogger(__name__)

DEFAULT_DB = "sqlite:///factstream.db"
DEFAULT_PORT = 9092


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run a writer with a replication listener",
        description=(
            "Run a writer process: publish the facts of its streams to readers over TCP "
            "(Synapse's replication protocol), over Redis pub/sub with --redis URL (channel: "
            "--server-name; readers use the same URL and server name), or into NATS JetStream with --nats URL. "
            "With --produce, write synthetic facts too."
        ),
    )
    add_common(p)
    p.add_argument("--produce", action="store_true", help="write synthetic facts (with random rollbacks)")
    p.add_argument("--rate", type=number(0), default=None,
                   help="with --produce: facts per second (default 0: as fast as possible)")
    p.add_argument("--duration", type=duration("never stop"), default=None,
                   help="with --produce: stop producing after this many seconds; serve goes on serving readers "
                        "until stopped (Ctrl-C, SIGTERM) (default 0: produce until stopped)")
    p.add_argument("--rollback-rate", type=fraction, default=None,
                   help="with --produce: share of transactions rolled back (default 0.1)")
    p.add_argument("--seed", type=int, default=None, help="with --produce: random seed")
    p.add_argument("--status", action="store_true", help="print JSON status lines on stdout (for supervisors)")
    p.set_defaults(func=run)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help=f"database URL (default {DEFAULT_DB})")
    p.add_argument("--host", default=None, help="TCP: listen address (default 127.0.0.1)")
    p.add_argument(
        "--redis", metavar="URL",
        help="replicate over Redis pub/sub instead of TCP (redis://[:password@]host[:port][/db], rediss://, "
             "unix://); publishes on the channel named --server-name; --host, --port and --tls-* are refused with it",
    )
    p.add_argument(
        "--nats", metavar="URL",
        help="replicate over NATS JetStream instead of TCP (nats://host:port, several comma-separated for a "
             "cluster); the log is the JetStream stream FACTSTREAM_<server-name>; --host, --port, --tls-*, "
             "--ping-interval, --timeout and --max-buffered are refused with it",
    )
    p.add_argument("--nats-replicas", type=whole_number(1), default=None,
                   help="with --nats: copies of the log in a cluster when this process creates it (default 1; 3 in a cluster)")
    p.add_argument("--nats-max-age", type=duration(), default=None,
                   help="with --nats: seconds the log keeps facts (the replay window; default 7 days, 0: unlimited)")
    p.add_argument("--port", type=port, default=None, help=f"TCP: listen port (default {DEFAULT_PORT}; 0 picks one)")
    p.add_argument("--server-name", default="factstream",
                   help="name sent in SERVER (readers may check it; default factstream); with --redis, the channel "
                        "name; with --nats, it names the JetStream stream")
    p.add_argument("--instance-name", default="master", help="this writer's instance name (default master)")
    p.add_argument("--metrics-port", type=port, default=0,
                   help="serve Prometheus /metrics on this port of 127.0.0.1 (default 0: none)")
    p.add_argument("--tls-cert", help="TCP: PEM certificate, enables TLS on the listener")
    p.add_argument("--tls-key", help="with --tls-cert: its PEM private key (if not in the --tls-cert file)")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="with --tls-cert: PEM CA bundle; readers must present a certificate signed by it (mutual TLS)")
    p.add_argument("--tls-handshake-timeout", type=duration(), default=None, metavar="SECONDS",
                   help="with --tls-cert: drop a connection whose TLS handshake is not done in time (default 10); "
                        "it counts as a reader only once done")
    p.add_argument("--custom-streams", action="store_true",
                   help="this channel (listener or Redis channel) is the application's own: allow streams Synapse "
                        "does not know (without it they are refused, since Synapse processes on the channel "
                        "would fail on them)")
    p.add_argument("--ping-interval", type=duration(), default=None,
                   help="TCP and --redis: seconds between keepalives (default 5)")
    p.add_argument("--timeout", type=duration(), default=None,
                   help="TCP: close a peer silent this long after its PING (default 15); with --redis, the PING timeout")
    p.add_argument("--max-buffered", type=whole_number(1), default=None,
                   help="TCP: commands buffered per slow reader before it is dropped (default 10000); with --redis, the "
                        "outbound queue bound")
    p.add_argument("--no-uvloop", action="store_true", help="use the stdlib event loop")


#: Defaults of the options that only mean something with another option or carrier. They are
#: declared with ``default=None`` so that :func:`misplaced_option` sees only what the user gave;
#: :func:`with_defaults` fills them in afterwards.
DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1", "port": DEFAULT_PORT, "tls_handshake_timeout": 10.0,
    "nats_replicas": 1, "nats_max_age": 7 * 24 * 3600.0,
    "ping_interval": 5.0, "timeout": 15.0, "max_buffered": 10_000,
    "rate": 0.0, "duration": 0.0, "rollback_rate": 0.1,
}

#: (dest, option, what it configures): options only the TCP listener uses.
_TCP_ONLY = (
    ("host", "--host", "the TCP listener's address"), ("port", "--port", "the TCP listener's port"),
    ("tls_cert", "--tls-cert", "TLS on the TCP listener"), ("tls_key", "--tls-key", "TLS on the TCP listener"),
    ("tls_client_ca", "--tls-client-ca", "TLS on the TCP listener"),
    ("tls_handshake_timeout", "--tls-handshake-timeout", "TLS on the TCP listener"),
)
#: Options the TCP listener and the Redis carrier use, and the NATS carrier does not.
_NOT_NATS = (("ping_interval", "--ping-interval"), ("timeout", "--timeout"), ("max_buffered", "--max-buffered"))
_PRODUCE_ONLY = (
    ("rate", "--rate", "it paces the synthetic facts"),
    ("duration", "--duration", "it stops writing synthetic facts; serve itself runs until stopped"),
    ("rollback_rate", "--rollback-rate", "it rolls back a share of the synthetic transactions"),
    ("seed", "--seed", "it seeds the synthetic facts"),
)
_NATS_ONLY = (("nats_replicas", "--nats-replicas"), ("nats_max_age", "--nats-max-age"))
_TLS_FILES = {"--redis": "a rediss:// URL (e.g. rediss://host:6380?ssl_ca_certs=/path/ca.pem)", "--nats": "a tls:// URL"}


def _given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the user gave the option (those of :data:`DEFAULTS` are None until filled in)."""
    value = getattr(args, dest, None)
    return value is not None and value is not False


def misplaced_option(args: argparse.Namespace) -> str | None:
    """Why an option the user gave would do nothing with the others (None: all apply).

    Ignoring it silently would leave the user believing it took effect: a --rate without
    --produce, a --port on a Redis carrier, a --nats-max-age on TCP.
    """
    if args.redis and args.nats:
        return "--nats replaces the TCP listener and --redis; give only one carrier"
    carrier = "--redis" if args.redis else "--nats" if args.nats else None
    if carrier:
        for dest, flag, what in _TCP_ONLY:
            if _given(args, dest):
                hint = f"for TLS use {_TLS_FILES[carrier]}" if flag.startswith("--tls") else f"drop {flag}"
                return f"{flag} sets {what}, which {carrier} replaces; {hint}"
    if carrier == "--nats":
        for dest, flag in _NOT_NATS:
            if _given(args, dest):
                return f"{flag} applies to the TCP listener and --redis, not to --nats (JetStream keeps its own " \
                       f"keepalives and flow control); drop {flag}"
    if not carrier:
        for dest, flag in (("tls_key", "--tls-key"), ("tls_client_ca", "--tls-client-ca"),
                           ("tls_handshake_timeout", "--tls-handshake-timeout")):
            if _given(args, dest) and not args.tls_cert:
                if flag == "--tls-client-ca":
                    return "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked " \
                           "during the TLS handshake of the listener"
                return f"{flag} needs --tls-cert (TLS on the listener is off without it); add --tls-cert or drop {flag}"
    if carrier != "--nats":
        for dest, flag in _NATS_ONLY:
            if _given(args, dest):
                return f"{flag} needs --nats (it configures the JetStream log); add --nats URL or drop {flag}"
    if not args.produce:
        for dest, flag, what in _PRODUCE_ONLY:
            if _given(args, dest):
                return f"{flag} needs --produce ({what}); add --produce or drop {flag}"
    return None


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the defaults of :data:`DEFAULTS` in place of the options not given."""
    filled = argparse.Namespace(**vars(args))
    for dest, value in DEFAULTS.items():
        if getattr(filled, dest, None) is None:
            setattr(filled, dest, value)
    return filled


class ListenError(FactstreamError):
    """A port serve was told to listen on cannot be had, saying which option to change and how."""

    @classmethod
    def of(cls, err: OSError, flag: str, port: int, host: str) -> ListenError:
        """The message for ``err``, raised binding ``host:port`` as given by ``flag`` (--port or --metrics-port)."""
        # asyncio words a bind error as "error while attempting to bind on address (...): ..."; the reason alone
        why = (err.strerror if isinstance(err, socket.gaierror) else os.strerror(err.errno) if err.errno else "") or str(err)
        if isinstance(err, socket.gaierror):
            return cls(f"--host {host}: cannot resolve that name ({why}); give an address of this machine, "
                       "e.g. 127.0.0.1, or 0.0.0.0 for all of them")
        if err.errno == errno.EADDRNOTAVAIL:
            return cls(f"--host {host}: not an address of this machine ({why}); give one of its addresses, "
                       "e.g. 127.0.0.1, or 0.0.0.0 for all of them")
        if err.errno == errno.EADDRINUSE:
            free = "or 0 to pick a free one" if flag == "--port" else "or 0 for no metrics"
            return cls(f"{flag} {port}: address already in use on {host}:{port} (another process holds it); stop that "
                       f"process or choose another {flag} ({free})")
        if err.errno == errno.EACCES:
            return cls(f"{flag} {port}: not allowed to listen on {host}:{port} ({why}; ports below 1024 need "
                       f"privileges); choose another {flag}")
        return cls(f"{flag} {port}: cannot listen on {host}:{port} ({why})")


#: ``serve --produce --rate 0``: synthetic transactions per database transaction (group commit).
GROUP = 64
#: ``serve --produce``: positions written but not yet published past which producing waits.
BACKLOG = 4000
#: Seconds between the id generators' background writes of ``stream_positions`` (their default is
#: 0.01). The record is a recovery hint, the tables (and ``stream_id_blocks``) are the truth; on
#: PostgreSQL each write is a commit waiting for the WAL to reach the disk, 100 a second per
#: stream at the default, and a writer producing flat out waited on them.
POSITIONS_EVERY = 0.1


@dataclasses.dataclass
class Group:
    """One group commit of ``serve --produce``: its ids per stream, statements, and what it holds once committed."""

    ids: dict[str, list[int]]
    committed: dict[str, list[tuple[int, Any]]]  # stream -> (token, row) of the transactions not rolled back
    steps: list[Any] = dataclasses.field(default_factory=list)
    facts: int = 0
    rows: int = 0
    rolled_back: int = 0


_USERS = tuple(f"@user{i}:demo.hs" for i in range(97))
_ROOMS = tuple(f"!room{i}:demo.hs" for i in range(13))


def _row_maker(stream: str) -> Callable[[int, int, int], list[Any]]:
    """``(token, j, now_ms) -> row``: the ``j``-th row of a fact of ``stream`` in Synapse's shape."""
    if stream == "to_device":
        return lambda token, j, now_ms: [_USERS[token % 97]]
    if stream == "receipts":  # receipt data as Synapse writes it: {"ts": milliseconds}
        return lambda token, j, now_ms: [
            _ROOMS[token % 13], "m.read", _USERS[token % 31], f"$ev{token}_{j}", None, {"ts": now_ms}
        ]
    if stream == "caches":
        return lambda token, j, now_ms: ["get_user_by_id", [f"@user{token}_{j}:demo.hs"], now_ms]
    return lambda token, j, now_ms: [f"{stream}-{token}-{j}"]


def synthetic_row(stream: str, token: int, j: int, now_ms: int | None = None) -> list[Any]:
    """A row of ``stream`` in Synapse's shape, carrying its creation time in milliseconds (``now_ms``) where
    the shape allows."""
    return _row_maker(stream)(token, j, int(time.time() * 1000) if now_ms is None else now_ms)


class Writer:
    """The writer process: database, id generators, publisher, hub and carrier (TCP listener or Redis)."""

    def __init__(self, args: argparse.Namespace, tables: tuple[StreamTable, ...] = DEMO_TABLES) -> None:
        self.args = with_defaults(args)
        self.tables = tables
        self.db: Any = None
        self.claim: Any = None  # this process's claim on its instance name (store.writer_claim)
        self.gens: dict[str, Any] = {}
        self.server: Any = None
        self.hub: ReplicationHub | None = None
        self.publisher: Publisher | None = None
        self.written: dict[str, WrittenRows] = {}
        self._row_makers = {t.stream: _row_maker(t.stream) for t in tables}
        # One group's ids are all fetched before the next group's: two fetches in flight from one
        # PostgreSQL sequence interleave, and a group's range (first..last id) would then hold the
        # other's ids, which WrittenRows would answer for from this group's rows alone.
        self._reserving = asyncio.Lock()
        self.stats = {"facts": 0, "rows": 0, "rolled_back": 0, "transactions": 0, "db_failures": 0, "db_outages": 0}

    async def start(self) -> None:
        from ..store.database import connect
        from ..store.writer_claim import claim_writer

        a = self.args
        self.db = await connect(a.db)
        self.claim = await claim_writer(self.db, a.instance_name)  # a second writer of the same name is refused
        await create_tables(self.db, self.tables)
        self.gens = await open_id_generators(self.db, a.instance_name, self.tables)
        for gen in self.gens.values():
            gen.flush_interval = POSITIONS_EVERY
        self.publisher = pub = Publisher(
            a.instance_name, page_limit=1000, custom_streams=getattr(a, "custom_streams", False)
        )
        for t in self.tables:
            gen = self.gens[t.stream]
            # what this process commits is published from memory, anything else from the table
            self.written[t.stream] = source = WrittenRows(t.source(self.db), a.instance_name)
            pub.add_stream(t.stream, source, gen.current_token_for_writer(a.instance_name))
            gen.add_listener(pub.notify)
        self.hub = ReplicationHub(a.instance_name, publisher=pub)
        if getattr(a, "redis", None):
            from ..transport.redis import RedisReplication

            self.server = await RedisReplication(
                self.hub, a.redis, a.server_name,
                ping_interval=a.ping_interval, ping_timeout=a.timeout, max_pending=a.max_buffered,
            ).start()
            # Subscribed means the positions are announced: readers started now catch up from them.
            await self.server.wait_connected(30)
        elif getattr(a, "nats", None):
            from ..transport.nats import NatsReplication, Retention

            max_age = getattr(a, "nats_max_age", 604800.0)
            # JetStream refuses a duplicate window (120 s by default) longer than a non-zero max_age.
            window = min(120.0, max_age) if max_age else 120.0
            retention = Retention(replicas=getattr(a, "nats_replicas", 1), max_age=max_age, duplicate_window=window)
            self.server = await NatsReplication(self.hub, a.nats, a.server_name, retention=retention).start()
            await self.server.wait_connected(30)
        else:
            from ..transport.tcp import TcpServer, server_ssl_context

            client_ca = getattr(a, "tls_client_ca", None)
            ssl = server_ssl_context(a.tls_cert, a.tls_key, client_cafile=client_ca) if a.tls_cert else None
            server = TcpServer(
                self.hub, a.server_name, host=a.host, port=a.port, ssl=ssl,
                ping_interval=a.ping_interval, timeout=a.timeout, max_buffered=a.max_buffered,
                handshake_timeout=getattr(a, "tls_handshake_timeout", 10.0),
            )
            try:
                self.server = await server.start()
            except OSError as err:
                raise ListenError.of(err, "--port", a.port, a.host) from err
        if a.metrics_port:
            from ..metrics import start_http_server

            try:
                start_http_server(a.metrics_port)
            except OSError as err:
                raise ListenError.of(err, "--metrics-port", a.metrics_port, "127.0.0.1") from err

    def positions(self) -> dict[str, int]:
        """Stream -> this writer's completed position."""
        return {s: g.current_token_for_writer(self.args.instance_name) for s, g in self.gens.items()}

    async def produce(self, stop: asyncio.Event) -> None:
        """Write synthetic facts until ``stop`` (or --duration) with random rollbacks, riding out database outages.

        As fast as possible (``--rate 0``), up to :data:`GROUP` synthetic
        transactions share one database transaction (a group commit): those
        that commit do so together, all or nothing (their rows in one INSERT
        per table); those rolled back are written in one savepoint and rolled
        back to it. Their ids complete once the group's outcome is known,
        which is when readers may see them. A group is one trip to the
        database, not a few per synthetic transaction, and two are in flight:
        the next is made while the database runs the previous one. At a
        ``--rate`` each transaction is its own group, written one fact at a
        time.
        """
        a = self.args
        outage = Outage(log, f"database {shown_url(a.db)}", initial=0.1, maximum=5.0)
        rng = random.Random(a.seed)
        deadline = time.monotonic() + a.duration if a.duration else None
        interval = 1.0 / a.rate if a.rate else 0.0
        stopping = asyncio.ensure_future(stop.wait())
        in_flight: list[asyncio.Future[None]] = []  # oldest first; at most two

        async def finish(keep: int) -> None:
            while len(in_flight) > keep:
                await in_flight[0]  # raises: still listed, so cancelled below
                in_flight.pop(0)

        try:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                await self._pace(stopping)
                if interval or outage.ongoing:
                    await finish(0)
                    await self._produce_group(outage, rng, interval, stop)
                    await asyncio.sleep(interval)
                    continue
                # Two groups in flight: the next one is made (rows, JSON, ids) while the database
                # runs the previous one's transaction, which it waits for before its ids complete.
                after = in_flight[-1] if in_flight else None
                in_flight.append(asyncio.ensure_future(self._produce_group(outage, rng, interval, stop, after=after)))
                await finish(1)
            await finish(0)
        finally:
            stopping.cancel()
            for task in in_flight:
                task.cancel()

    async def _pace(self, stopping: asyncio.Future[Any]) -> None:
        """Wait while the publisher is more than :data:`BACKLOG` positions behind what was written.

        Writing faster than rows are published only grows the distance
        between them (the rows readers are yet to get) while taking the
        process's time from the publisher. Down to half of it, so the next
        group is written while the publisher still has rows to send.
        """
        pub = self.publisher
        if pub is None or pub.backlog() <= BACKLOG:
            return
        caught_up = asyncio.ensure_future(pub.wait_backlog(BACKLOG // 2))
        try:
            await asyncio.wait({caught_up, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            caught_up.cancel()

    async def _produce_group(
        self, outage: Outage, rng: random.Random, interval: float, stop: asyncio.Event,
        after: asyncio.Future[None] | None = None,
    ) -> None:
        """Write one group of synthetic transactions; a database outage is waited out (with backoff).

        ``after``: the group before, still in flight; this one's rows are recorded and its ids
        complete only once that one is done, so groups finish in the order of their ids.
        """
        from ..store.database import DatabaseUnavailable

        stats = self.stats
        if interval:
            plans = [(rng.choice(self.tables), 1)]
        else:
            plans = [(rng.choice(self.tables), rng.randint(1, 24)) for _ in range(GROUP)]
        try:
            async with contextlib.AsyncExitStack() as reserved:
                # Ids first, rows made, then the transaction in one trip: the database is held only
                # while it runs. Leaving the stack completes the ids (committed, rolled back, or cut
                # off by an outage).
                group = await self._make_group(reserved, plans, rng)
                await self.db.run_transaction(group.steps)
                if after is not None:
                    await asyncio.wait({after})
                # Committed: the publisher gets these rows from memory once the ids complete.
                for stream, ids in group.ids.items():
                    self.written[stream].record(ids[0], ids[-1], group.committed[stream])
        except DatabaseUnavailable as err:
            # The transaction is gone with its connection; its ids completed as rolled back
            # (or committed, if the COMMIT got through): the position is not held back.
            stats["db_failures"] += 1
            delay = outage.failed(err)
            stats["db_outages"] = outage.count
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            return
        outage.recovered()
        stats["facts"] += group.facts
        stats["rows"] += group.rows
        stats["rolled_back"] += group.rolled_back
        stats["transactions"] += len(plans)

    async def _make_group(
        self, reserved: contextlib.AsyncExitStack, plans: list[tuple[StreamTable, int]], rng: random.Random
    ) -> Group:
        """Reserve ids for ``plans`` (table, facts) in ``reserved``; the statements writing them and what they
        hold once committed."""
        inst = self.args.instance_name
        engine = self.db.engine
        wanted: dict[str, int] = {}
        for t, n in plans:
            wanted[t.stream] = wanted.get(t.stream, 0) + n
        async with self._reserving:
            ids = await _reserve_all(reserved, {s: (self.gens[s], n) for s, n in wanted.items()})
        group = Group(ids, {s: [] for s in wanted})
        used = dict.fromkeys(wanted, 0)
        rollback_rate = self.args.rollback_rate
        now_ms = int(time.time() * 1000)
        draw = rng.random
        kept: dict[StreamTable, list[tuple[Any, ...]]] = {}
        undone: dict[StreamTable, list[tuple[Any, ...]]] = {}
        for t, n in plans:
            first = used[t.stream]
            used[t.stream] = first + n
            params: list[tuple[Any, ...]] = []
            written: list[tuple[int, Any]] = []
            make = self._row_makers[t.stream]
            encode = t.row_encoder
            k_facts = 0
            for tok in ids[t.stream][first:first + n]:
                r = draw()  # rows of a fact: 1 mostly; 0 (a hole) 4%, 2 12%, 4 4% (a batch)
                k = 1 if r < 0.80 else 2 if r < 0.92 else 0 if r < 0.96 else 4
                for j in range(k):
                    row = make(tok, j, now_ms)
                    params.append(encode(tok, inst, row))
                    written.append((tok, row))
                k_facts += 1 if k else 0
            if rng.random() < rollback_rate:
                # written, then undone (below)
                group.rolled_back += n
                if params:
                    undone.setdefault(t, []).extend(params)
            else:
                # committed with the group, all or nothing: no savepoint of its own needed
                group.facts += k_facts
                group.rows += len(params)
                if params:
                    group.committed[t.stream].extend(written)
                    kept.setdefault(t, []).extend(params)
        # Few statements, whatever the group holds: the rolled-back transactions' rows in one
        # savepoint, rolled back to, then the committed rows; one statement per table each (on
        # PostgreSQL a savepoint is a subtransaction, and more than 64 in one transaction slow
        # every snapshot down; on SQLite each statement is a hand-over of the GIL between the
        # event loop and the database thread).
        if undone:
            group.steps.append(("SAVEPOINT produce", None))
            for t, params in undone.items():
                group.steps += t.insert_rows(engine, params)
            group.steps += [("ROLLBACK TO SAVEPOINT produce", None), ("RELEASE SAVEPOINT produce", None)]
        for t, params in kept.items():
            group.steps += t.insert_rows(engine, params)
        return group

    async def stop(self, flush_timeout: float = 5.0) -> None:
        """Publish what is complete (for up to ``flush_timeout`` s: the database may be down), then close."""
        if self.publisher is not None:
            try:
                await asyncio.wait_for(self.publisher.flush(), flush_timeout)
            except TimeoutError:
                log.warning("stopping with facts unpublished (the database does not answer); readers catch up later")
            self.publisher.close()
        if self.server is not None:
            await self.server.stop()
        for g in self.gens.values():
            await g.close()
        if self.claim is not None:
            await self.claim.release()
        if self.db is not None:
            await self.db.close()


async def _reserve_all(
    stack: contextlib.AsyncExitStack, wanted: dict[str, tuple[Any, int]]
) -> dict[str, list[int]]:
    """Stream -> ``n`` ids reserved from its generator, all streams at once (on PostgreSQL one round trip
    in parallel per stream); each reservation completes when ``stack`` closes, even if another failed."""
    names = list(wanted)
    got = await asyncio.gather(
        *(stack.enter_async_context(gen.get_next_mult(n)) for gen, n in wanted.values()), return_exceptions=True
    )
    for result in got:
        if isinstance(result, BaseException):
            raise result
    return dict(zip(names, got))  # type: ignore[arg-type]


async def serve(args: argparse.Namespace) -> int:
    misplaced = misplaced_option(args)
    if misplaced:
        cli_exit("factstream serve", misplaced, 2)
    args = with_defaults(args)
    if args.redis:
        await check_redis(args.redis, args.server_name, "factstream serve")
    if args.nats:
        await check_nats(args.nats, args.server_name, "factstream serve")
    if args.tls_cert:
        import ssl

        from ..transport.tcp import TlsFileError, server_ssl_context

        try:
            server_ssl_context(args.tls_cert, args.tls_key, client_cafile=args.tls_client_ca)
        except TlsFileError as err:
            cli_exit("factstream serve", f"cannot use the TLS files: {err}", 2)
        except (OSError, ssl.SSLError) as err:
            given = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tls-client-ca": args.tls_client_ca}
            cli_exit("factstream serve", f"cannot load the TLS files ({', '.join(f'{k} {v}' for k, v in given.items() if v)})"
                                          f": {err}", 2)
    from ..store.database import DatabaseError

    writer = Writer(args)
    try:
        await writer.start()
    except (DatabaseError, ListenError):  # their messages name the option or database (its password masked)
        try:
            await writer.stop()
        except Exception:  # noqa: BLE001 - the start error is the one to report
            pass
        raise  # the CLI's error boundary prints it as one line (a traceback with --debug)
    settle()  # started: what start-up made is frozen, the collector and GIL set for rows (factstream.interpreter)
    stop = asyncio.Event()
    interrupted = stop_on_signals(stop)
    stdout_closed: list[bool] = []

    def status(obj: dict[str, Any]) -> None:
        # --status lines: once whoever reads them has gone (a closed pipe), serve stops, as any command does
        if stdout_closed:
            return
        try:
            emit(obj)
        except BrokenPipeError:
            from . import silence_stdout

            silence_stdout()
            stdout_closed.append(True)
            stop.set()

    server = writer.server
    if args.redis:
        where = f"Redis {redact_url(args.redis)} channel {args.server_name}"
        listening: dict[str, Any] = {"port": None, "redis": redact_url(args.redis), "channel": args.server_name}
    elif args.nats:
        where = f"NATS JetStream {redact_url(args.nats)} stream {server.layout.stream}"
        listening = {"port": None, "nats": redact_url(args.nats), "stream": server.layout.stream}
    else:
        where = f"{args.host}:{server.port}"
        listening = {"port": server.port}
    log.info("serving %s on %s", args.server_name, where)
    if args.status:
        status({"event": "listening", **listening, "positions": writer.positions(), "loop": transport.loop_name()})
    else:
        print(f"factstream serve: {args.server_name} ({args.instance_name}) on {where}, db {shown_url(args.db)}",
              file=sys.stderr)

    def links() -> dict[str, Any]:
        # Over TCP each reader is a connection; on a Redis bus readers are invisible, the subscription is not.
        if args.redis:
            return {"subscribed": bool(server.connections), "pending": server.carrier.pending}
        if args.nats:
            return {"connected": server.connected, "unacknowledged_for": round(server.unacknowledged_for(), 3),
                    "nats": server.status()["keys"]}
        return {"readers": len(server.connections), "handshakes": server.handshakes}

    async def report() -> None:
        while True:
            await asyncio.sleep(0.2)
            if args.status:
                status({"event": "status", **writer.stats, "positions": writer.positions(), **links()})

    reporter = asyncio.create_task(report())
    started = time.monotonic()
    if args.produce:
        producer = asyncio.create_task(writer.produce(stop))
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait({producer, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if producer.done():
            producer.result()
        else:
            await producer
        elapsed = time.monotonic() - started
        assert writer.publisher is not None
        flushed = asyncio.create_task(writer.publisher.flush())
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait({flushed, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        flushed.cancel()
        if args.status:
            status({"event": "produced", **writer.stats, "seconds": elapsed, "positions": writer.positions()})
    await stop.wait()
    reporter.cancel()
    await writer.stop()
    # Ctrl-C ends with 130 as shells expect; SIGTERM (a service manager stopping it) is a clean stop
    return 130 if signal.SIGINT in interrupted else 0


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: serve(args), use_uvloop=not args.no_uvloop)
