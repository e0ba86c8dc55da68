"""``factstream positions``: stream x writer positions, from the database and from a writer.

From the database: each writer's recorded position (``stream_positions``)
and the highest stream id in each stream table. From a live writer
(``--connect HOST:PORT``): what a freshly connected reader is told in answer
to REPLICATE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from .. import transport
from .serve import DEFAULT_DB


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "positions",
        help="show stream positions per writer (database and/or live writer)",
        description="Print a stream x writer table of positions from the database and as a connected reader sees them.",
    )
    p.add_argument("--db", default=None, help=f"database URL (e.g. {DEFAULT_DB})")
    p.add_argument("--connect", metavar="HOST:PORT", help="also ask a writer's replication listener (REPLICATE)")
    p.add_argument("--wait", type=float, default=1.0, help="seconds to collect POSITION answers (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


async def db_positions(url: str) -> dict[tuple[str, str], dict[str, int]]:
    """(stream, writer) -> {"recorded": ..., "max_stream_id": ...} from the database."""
    from ..replication.tables import DEMO_TABLES
    from ..store.database import connect

    out: dict[tuple[str, str], dict[str, int]] = {}
    db = await connect(url)
    try:
        try:
            for stream, inst, sid in await db.fetchall("SELECT stream_name, instance_name, stream_id FROM stream_positions", ()):
                out.setdefault((stream, inst), {})["recorded"] = int(sid)
        except Exception:
            pass  # no id generator ever ran on this database
        for t in DEMO_TABLES:
            try:
                rows = await db.fetchall(f"SELECT instance_name, MAX(stream_id) FROM {t.table} GROUP BY instance_name", ())
            except Exception:
                continue
            for inst, mx in rows:
                out.setdefault((t.stream, inst), {})["max_stream_id"] = int(mx)
    finally:
        await db.close()
    return out


async def live_positions(target: str, wait: float) -> dict[tuple[str, str], int]:
    """(stream, writer) -> position announced by the writer at ``target``."""
    from ..replication import ReplicationHub
    from ..replication.follower import Follower
    from ..transport.tcp import TcpClient
    from .tail import parse_target

    host, port = parse_target(target)
    fol = Follower(typed=False)
    client = await TcpClient(ReplicationHub("factstream-positions", follower=fol), host, port,
                             client_name="factstream-positions").start()
    try:
        await client.wait_connected(wait + 5)
    except TimeoutError:
        raise SystemExit(f"factstream positions: cannot connect to {target}") from None
    await asyncio.sleep(wait)
    await client.stop()
    return {k: v for k, v in fol.positions().items() if v is not None}


async def positions(args: argparse.Namespace) -> int:
    if not args.db and not args.connect:
        args.db = DEFAULT_DB
    table: dict[tuple[str, str], dict[str, Any]] = {}
    if args.db:
        for k, v in (await db_positions(args.db)).items():
            table.setdefault(k, {}).update(v)
    if args.connect:
        for k, pos in (await live_positions(args.connect, args.wait)).items():
            table.setdefault(k, {})["replication"] = pos
    if args.json:
        print(json.dumps([{"stream": s, "writer": w, **v} for (s, w), v in sorted(table.items())]))
        return 0
    cols = ["recorded", "max_stream_id", "replication"]
    print(f"{'stream':<24} {'writer':<14} " + " ".join(f"{c:>14}" for c in cols))
    for (s, w), v in sorted(table.items()):
        print(f"{s:<24} {w:<14} " + " ".join(f"{str(v.get(c, '-')):>14}" for c in cols))
    return 0


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: positions(args))
