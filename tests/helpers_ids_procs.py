"""Subprocess roles for the crash and concurrency tests of stream ids (not a test module).

Run as ``python helpers_ids_procs.py ROLE DSN INSTANCE [options]``; every event is
printed as one line (``EVENT arg ...``) and flushed, for the parent test to check.

Roles:
  crash       commit --count facts, then reserve one more inside a transaction,
              insert its row, print IN_TXN and hang until killed
  restart     print the recovered POSITION, commit one fact, print its id
  writer      --count facts from --tasks concurrent tasks with random delays and
              random failures (rollbacks), then one final committed fact
  reader      print READY once its positions are loaded, then follow positions
              from stream_positions until --stop-file exists;
              for each new position print what the table holds at or below it
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys

from factstream.ids import create_id_generator
from factstream.store.database import connect

TABLES = [("facts", "instance_name", "stream_id")]


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def make(db, instance: str, writers: list[str]):  # type: ignore[no-untyped-def]
    return await create_id_generator(
        db, stream_name="facts", instance_name=instance, writers=writers, tables=TABLES
    )


async def commit_one(db, gen, body: str) -> int:  # type: ignore[no-untyped-def]
    async with db.transaction() as txn:
        sid = await gen.get_next_txn(txn)
        await txn.execute("INSERT INTO facts (stream_id, instance_name, body) VALUES (?, ?, ?)", (sid, gen.instance_name, body))
    return int(sid)


async def crash(args: argparse.Namespace) -> None:
    db = await connect(args.dsn)
    gen = await make(db, args.instance, args.writers)
    say("POSITION", gen.current_token_for_writer(args.instance))
    for i in range(args.count):
        say("COMMITTED", await commit_one(db, gen, f"c{i}"))
    await gen.flush_positions()
    async with db.transaction() as txn:
        sid = await gen.get_next_txn(txn)
        await txn.execute("INSERT INTO facts (stream_id, instance_name, body) VALUES (?, ?, 'doomed')", (sid, args.instance))
        say("IN_TXN", sid)
        await asyncio.sleep(3600)  # SIGKILL arrives here


async def restart(args: argparse.Namespace) -> None:
    db = await connect(args.dsn)
    gen = await make(db, args.instance, args.writers)
    say("POSITION", gen.current_token_for_writer(args.instance))
    say("COMMITTED", await commit_one(db, gen, "after restart"))
    say("POSITION", gen.current_token_for_writer(args.instance))
    await gen.close()
    await db.close()


async def writer(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    db = await connect(args.dsn, max_connections=args.tasks + 1)
    gen = await make(db, args.instance, args.writers)
    gen.add_listener(lambda s, i, old, new: say("POS", old, new))
    todo = list(range(args.count))

    async def task() -> None:
        while todo:
            n = todo.pop()
            fail = rng.random() < args.fail_rate
            delay = rng.random() * args.max_delay
            try:
                async with db.transaction() as txn:
                    sid = await gen.get_next_txn(txn)
                    say("RESERVED", sid)
                    await asyncio.sleep(delay)
                    await txn.execute(
                        "INSERT INTO facts (stream_id, instance_name, body) VALUES (?, ?, ?)",
                        (sid, args.instance, f"f{n}"),
                    )
                    if fail:
                        raise RuntimeError("injected failure")
                say("COMMITTED", sid)
            except RuntimeError:
                say("FAILED", sid)

    await asyncio.gather(*(task() for _ in range(args.tasks)))
    last = await commit_one(db, gen, "final")
    say("RESERVED", last)
    say("COMMITTED", last)
    await gen.flush_positions()
    say("FINAL", gen.current_token_for_writer(args.instance))
    await gen.close()
    await db.close()


async def reader(args: argparse.Namespace) -> None:
    db = await connect(args.dsn)
    gen = await make(db, args.instance, args.writers)
    seen: dict[str, int] = {}
    linear = gen.current_token()
    say("READY", linear)  # the parent starts the writers only now: a slow start would miss every move
    stopping = False
    while True:
        if os.path.exists(args.stop_file):
            stopping = True  # one last poll after the writers finished
        rows = await db.fetchall("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'facts'")
        for name, pos in rows:
            if pos > seen.get(name, 0):
                seen[name] = pos
                gen.advance(name, pos)
                count = await db.fetchone(
                    "SELECT COUNT(*) FROM facts WHERE instance_name = ? AND stream_id <= ?", (name, pos)
                )
                say("SNAP", name, pos, count[0] if count else 0)
        if gen.current_token() > linear:
            linear = gen.current_token()
            count = await db.fetchone("SELECT COUNT(*) FROM facts WHERE stream_id <= ?", (linear,))
            say("LINEAR", linear, count[0] if count else 0)
        if stopping:
            break
        await asyncio.sleep(0.003)
    say("DONE", linear)
    await gen.close()
    await db.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["crash", "restart", "writer", "reader"])
    p.add_argument("dsn")
    p.add_argument("instance")
    p.add_argument("--writers", default="w1,w2,w3")
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--fail-rate", type=float, default=0.2)
    p.add_argument("--max-delay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-file", default="")
    args = p.parse_args()
    args.writers = args.writers.split(",")
    asyncio.run({"crash": crash, "restart": restart, "writer": writer, "reader": reader}[args.role](args))


if __name__ == "__main__":
    sys.exit(main())
