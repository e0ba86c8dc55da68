"""``factstream tail HOST:PORT`` / ``tail --redis URL --server-name NAME``: print what arrives.

Over TCP it connects like any reader (NAME, PING, REPLICATE), keeps the
connection alive and reconnects with backoff, and prints each fact as it is
delivered. Without ``--db`` it starts live from the writer's current
positions; with ``--db`` (the writer's database) it repairs gaps from the
stream tables, and ``--from-start`` replays everything first.

Over Redis (``--redis``) it shows a deployment's traffic as it is, by
default: every command heard on the channel, decoded, in arrival order,
without publishing anything (a Synapse deployment's too). Nothing is
hidden, reordered or repaired, which is what one wants when looking at a
live system. With ``--db`` it instead follows as a reader, exactly like the
TCP tail: it publishes REPLICATE, prints facts, and catches up from the
stream tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import transport
from ..streams.rows import Row


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tail",
        help="follow a writer over TCP, or watch a deployment's Redis traffic, and print what arrives",
        description=(
            "TCP (HOST:PORT): connect to a replication listener as a reader and print every fact delivered, "
            "as 'stream writer token row-json'. "
            "Redis (--redis URL --server-name NAME): print every command heard on the deployment's channel, "
            "decoded, as its wire line (e.g. 'RDATA caches master 42 [...]', 'POSITION ...', 'USER_SYNC ...'), in "
            "arrival order; tail only listens (it publishes nothing unless --replicate), so it is safe on a live "
            "Synapse deployment and shows exactly what travels, gaps included. "
            "Redis with --db: follow as a reader instead (publishes REPLICATE), printing facts like the TCP tail, "
            "with missed facts fetched from the stream tables: complete and in order, but what you see is the "
            "reader's view, not the traffic."
        ),
    )
    p.add_argument("target", metavar="HOST:PORT", nargs="?", help="the writer's replication listener (TCP; not with --redis)")
    p.add_argument("--redis", metavar="URL", help="watch replication over Redis pub/sub at URL (needs --server-name)")
    p.add_argument("--nats", metavar="URL",
                   help="read the deployment's JetStream log at URL (needs --server-name): every stored line as it "
                        "grows (--from-start: from the oldest retained), or with --db follow as a reader")
    p.add_argument("--stream", action="append", dest="streams", metavar="S",
                   help="only this stream (repeatable; with --redis and no --db, other commands still show)")
    p.add_argument("--json", action="store_true", help="one JSON object per row (per command with --redis)")
    p.add_argument("--db", help="database URL for catch-up from the stream tables (with --redis: print facts, see above)")
    p.add_argument("--from-start", action="store_true", help="with --db: replay every stored fact first")
    p.add_argument("--count", type=int, default=0, help="exit after this many rows (commands with --redis)")
    p.add_argument("--user-ip", action="store_true", help="with --redis: also show the <server-name>/USER_IP channel")
    p.add_argument("--replicate", action="store_true",
                   help="with --redis: publish one REPLICATE so that writers announce their positions")
    p.add_argument("--name", default="factstream-tail", help="client name sent in NAME (instance name with --redis --db)")
    p.add_argument("--server-name", help="TCP: refuse a server announcing another name; --redis: the channel to watch")
    p.add_argument("--tls", action="store_true", help="connect with TLS (verifying the server)")
    p.add_argument("--cafile", help="CA certificate to verify the server with (implies --tls)")
    p.add_argument("--insecure", action="store_true", help="with --tls: do not verify the certificate (not recommended)")
    p.add_argument("--ping-interval", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=15.0)
    p.add_argument("--no-uvloop", action="store_true", help="use the stdlib event loop")
    p.set_defaults(func=run)


def parse_target(target: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), with a clear error."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"factstream tail: expected HOST:PORT, got {target!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def check_target(args: argparse.Namespace) -> None:
    """Exactly one of HOST:PORT and --redis, and what each needs (usage errors exit 2)."""
    from .serve import cli_error

    prog = "factstream tail"
    if args.nats:
        if args.target or args.redis:
            cli_error(prog, "give one of HOST:PORT (TCP), --redis URL or --nats URL", 2)
        if not args.server_name:
            cli_error(prog, "--nats needs --server-name NAME: the deployment's server name names its JetStream stream", 2)
        if args.tls or args.cafile or args.insecure or args.user_ip or args.replicate:
            cli_error(prog, "--tls/--cafile/--insecure/--user-ip/--replicate do not apply to --nats "
                            "(for TLS use a tls:// URL)", 2)
        return
    if args.redis and args.target:
        cli_error(prog, "give either HOST:PORT (TCP) or --redis URL, not both", 2)
    if not args.redis and not args.target:
        cli_error(prog, "say where to listen: HOST:PORT of a TCP replication listener, "
                        "or --redis redis://HOST:PORT --server-name NAME", 2)
    if args.redis:
        if not args.server_name:
            cli_error(prog, "--redis needs --server-name NAME: the deployment's server name is the channel to watch", 2)
        if args.tls or args.cafile or args.insecure:
            cli_error(prog, "--tls/--cafile/--insecure apply to TCP; for Redis over TLS use a rediss:// URL "
                            "(e.g. rediss://host:6380?ssl_ca_certs=/path/ca.pem)", 2)
        if args.from_start and not args.db:
            cli_error(prog, "--from-start needs --db: the facts are replayed from the stream tables", 2)
        if args.db and (args.user_ip or args.replicate):
            cli_error(prog, "--user-ip and --replicate show raw traffic; they do not combine with --db "
                            "(which follows as a reader and already publishes REPLICATE)", 2)
    else:
        parse_target(args.target)
        if args.user_ip or args.replicate:
            cli_error(prog, "--user-ip and --replicate need --redis", 2)


async def tail_traffic(args: argparse.Namespace) -> int:
    """``--redis`` without ``--db``: print every command heard on the channel until --count or a signal."""
    import asyncio
    import signal

    from ..transport.redis import tail_redis

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    stats = await tail_redis(
        args.redis, args.server_name, args.streams or (), args.json,
        user_ip=args.user_ip, replicate=args.replicate, limit=args.count or None, stop=done,
    )
    if stats.invalid:
        print(f"factstream tail: skipped {stats.invalid} messages that are not replication commands", file=sys.stderr)
    return 0


async def tail_log(args: argparse.Namespace) -> int:
    """``--nats`` without ``--db``: print the JetStream log's lines until --count or a signal."""
    import asyncio
    import signal

    from ..transport.nats import tail_nats

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    try:
        stats = await tail_nats(args.nats, args.server_name, args.streams or (), args.json,
                                from_start=args.from_start, limit=args.count or None, stop=done)
    except LookupError as err:
        from .serve import cli_error

        cli_error("factstream tail", str(err), 1)
    if stats.invalid:
        print(f"factstream tail: skipped {stats.invalid} messages that are not replication commands", file=sys.stderr)
    return 0


def row_json(row: Any) -> Any:
    return row.to_wire() if isinstance(row, Row) else row


async def tail(args: argparse.Namespace) -> int:
    import asyncio

    from ..replication import Follower, ReplicationHub
    from ..replication.tables import DEMO_TABLES
    from .serve import check_redis

    check_target(args)
    if args.nats:
        from .serve import check_nats

        await check_nats(args.nats, args.server_name, "factstream tail")
        if not args.db:
            return await tail_log(args)
    if args.redis:
        await check_redis(args.redis, args.server_name, "factstream tail")
        if not args.db:
            return await tail_traffic(args)
    sources: dict[str, Any] = {}
    db = None
    if args.db:
        from ..store.database import connect

        db = await connect(args.db)
        sources = {t.stream: t.source(db) for t in DEMO_TABLES}
    fol = Follower(
        sources=sources,
        start_position=0 if args.from_start else None,
        streams=set(args.streams) if args.streams else None,
    )
    done = asyncio.Event()
    seen = 0
    out = sys.stdout

    def show(stream: str, writer: str, token: int, rows: list[Any]) -> None:
        nonlocal seen
        if done.is_set():
            return
        for row in rows:
            if args.json:
                out.write(json.dumps({"stream": stream, "writer": writer, "token": token, "row": row_json(row)}) + "\n")
            else:
                out.write(f"{stream} {writer} {token} {json.dumps(row_json(row))}\n")
            seen += 1
            if args.count and seen >= args.count:
                done.set()
                break
        out.flush()

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
        from ..transport.tcp import TcpClient, client_ssl_context

        host, port = parse_target(args.target)
        ssl = None
        if args.tls or args.cafile:
            ssl = client_ssl_context(args.cafile, verify=not args.insecure)
        client = await TcpClient(
            hub, host, port, client_name=args.name, expected_server_name=args.server_name, ssl=ssl,
            server_hostname=host if ssl else None, ping_interval=args.ping_interval, timeout=args.timeout,
        ).start()
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    await client.stop()
    await fol.close()
    if db is not None:
        await db.close()
    return 0


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: tail(args), use_uvloop=not args.no_uvloop)
