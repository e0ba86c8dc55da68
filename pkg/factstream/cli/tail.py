"""``factstream tail HOST:PORT``: a reader that prints what arrives.

It connects like any reader (NAME, PING, REPLICATE), keeps the connection
alive and reconnects with backoff, and prints each fact as it is delivered.
Without ``--db`` it starts live from the writer's current positions; with
``--db`` (the writer's database) it repairs gaps from the stream tables, and
``--from-start`` replays everything first.
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
        help="follow a writer over TCP and print the facts that arrive",
        description="Connect to a replication listener as a reader and print every fact delivered.",
    )
    p.add_argument("target", metavar="HOST:PORT", help="the writer's replication listener")
    p.add_argument("--stream", action="append", dest="streams", metavar="S", help="only this stream (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--db", help="database URL for catch-up from the stream tables")
    p.add_argument("--from-start", action="store_true", help="with --db: replay every stored fact first")
    p.add_argument("--count", type=int, default=0, help="exit after this many rows")
    p.add_argument("--name", default="factstream-tail", help="client name sent in NAME")
    p.add_argument("--server-name", help="refuse a server announcing another name")
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


def row_json(row: Any) -> Any:
    return row.to_wire() if isinstance(row, Row) else row


async def tail(args: argparse.Namespace) -> int:
    import asyncio

    from ..replication import Follower, ReplicationHub
    from ..replication.tables import DEMO_TABLES
    from ..transport.tcp import TcpClient, client_ssl_context

    host, port = parse_target(args.target)
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
    ssl = None
    if args.tls or args.cafile:
        ssl = client_ssl_context(args.cafile, verify=not args.insecure)
    hub = ReplicationHub(args.name, follower=fol)
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
