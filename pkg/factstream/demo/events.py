"""Event store demo: a writer persists room events while reader processes serve "new events for user".

Run ``python -m factstream.demo.events [--db URL] [--readers N] [--rooms R] [--events E]``
(the default database is an embedded SQLite file in a temporary directory).

The writer process persists events (joins, leaves, invites, messages,
redactions) into rooms and publishes the events stream over TCP replication.
Each reader is a separate process: it follows the events stream, keeps a
stream token per user and repeatedly asks "new events for this user since my
token" up to the position it has been told about. At the end the writer sends
each reader the final position; the reader catches up, then checks that the
answers it gave are what the database says when asked again without caches
(an answer depends only on facts at or below its upper token), and the writer
checks every reader answer against its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..redaction import redact_url

#: How the writer hands its reader processes the database URL (not on their command line).
_READER_DB_ENV = "FACTSTREAM_EVENTS_DEMO_DB"

__all__ = ["run_writer", "run_reader", "main", "add_arguments", "run"]

SERVER_NAME = "demo.factstream"
BIG = 10**9


def _users(n: int) -> list[str]:
    return [f"@user{i}:demo" for i in range(n)]


class _RoomGen:
    def __init__(self, rng: random.Random, n_rooms: int, users: list[str]) -> None:
        self.rng = rng
        self.users = users
        self.tips: dict[str, tuple[str, int]] = {}
        self.members: dict[str, dict[str, str]] = {}
        self.messages: dict[str, list[str]] = {}
        self.n = 0
        self.rooms = [f"!room{i}:demo" for i in range(n_rooms)]

    def _ev(self, room: str, etype: str, sender: str, content: dict[str, Any], state_key: str | None = None,
            **extra: Any) -> bytes:
        self.n += 1
        eid = f"$ev{self.n}:demo"
        prev, depth = self.tips.get(room, (None, 0))
        d: dict[str, Any] = {"event_id": eid, "room_id": room, "type": etype, "sender": sender,
                             "prev_events": [prev] if prev else [], "depth": depth + 1,
                             "origin_server_ts": int(time.time() * 1000), "content": content}
        if state_key is not None:
            d["state_key"] = state_key
        d.update(extra)
        self.tips[room] = (eid, depth + 1)
        if etype == "m.room.message":
            self.messages.setdefault(room, []).append(eid)
        if etype == "m.room.member" and state_key is not None:
            self.members.setdefault(room, {})[state_key] = content["membership"]
        return json.dumps(d).encode()

    def create_all(self) -> list[bytes]:
        out = []
        for i, room in enumerate(self.rooms):
            creator = self.users[i % len(self.users)]
            out += [
                self._ev(room, "m.room.create", creator, {"creator": creator}, ""),
                self._ev(room, "m.room.member", creator, {"membership": "join"}, creator),
                self._ev(room, "m.room.history_visibility", creator, {"history_visibility": "joined"}, ""),
            ]
        return out

    def random_event(self) -> bytes:
        rng = self.rng
        room = rng.choice(self.rooms)
        members = self.members.get(room, {})
        joined = [u for u, m in members.items() if m == "join"] or [self.users[0]]
        sender = rng.choice(joined)
        roll = rng.random()
        user = rng.choice(self.users)
        if roll < 0.15:
            return self._ev(room, "m.room.member", user, {"membership": "join"}, user)
        if roll < 0.22:
            return self._ev(room, "m.room.member", user, {"membership": "leave"}, user)
        if roll < 0.30:
            return self._ev(room, "m.room.member", sender, {"membership": "invite"}, user)
        if roll < 0.33 and self.messages.get(room):
            return self._ev(room, "m.room.redaction", sender, {}, redacts=rng.choice(self.messages[room]))
        return self._ev(room, "m.room.message", sender, {"msgtype": "m.text", "body": f"hello {self.n}"})


async def run_writer(db_url: str, *, readers: int = 2, rooms: int = 10, events: int = 2000, users: int = 20,
                     seed: int = 0, quiet: bool = False) -> dict[str, Any]:
    """Persist ``events`` events while ``readers`` reader processes follow; returns the verified summary."""
    from ..replication import Publisher, ReplicationHub
    from ..transport.tcp import TcpServer
    from ..store.database import connect
    from ..events.replication import attach_writer
    from ..events.store import EventStore

    def say(msg: str) -> None:
        if not quiet:
            print(f"[writer] {msg}", file=sys.stderr, flush=True)

    db = await connect(db_url)
    store = await EventStore.open(db)
    pub = Publisher("master")
    attach_writer(store, pub)
    server = await TcpServer(ReplicationHub("master", publisher=pub), SERVER_NAME, port=0).start()
    names = _users(users)
    procs = []
    for i in range(readers):
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "factstream.demo.events", "--reader",
            "--port", str(server.port), "--name", f"reader{i}", "--users", str(users), "--seed", str(seed + i + 1),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            # The URL goes by the environment, not the command line: `ps` shows every user a process's
            # arguments, and the URL may hold a password.
            env={**os.environ, _READER_DB_ENV: db_url},
        ))
        _CHILDREN.append(procs[-1])
    say(f"{readers} reader processes following on 127.0.0.1:{server.port}; database {redact_url(db_url)}")
    gen = _RoomGen(random.Random(seed), rooms, names)
    start = time.perf_counter()
    await store.persist_events(gen.create_all())
    done = 0
    while done < events:
        n = min(gen.rng.randint(1, 20), events - done)
        await store.persist_events([gen.random_event() for _ in range(n)])
        done += n
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - start
    final = store.current_token()
    await pub.flush()
    say(f"persisted {gen.n} events in {elapsed:.2f}s ({gen.n / elapsed:,.0f}/s); final position {final}")
    reports = []
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"stop {final}\n".encode())
        await proc.stdin.drain()
    for proc in procs:
        assert proc.stdout is not None
        out, _ = await proc.communicate()
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    ok = True
    for rep in reports:
        wrong = 0
        for user, since, upto, ids in rep["log"]:
            got = await store.get_new_events_for_user(user, since, upto, limit=BIG)
            wrong += sorted(e for v in got.values() for e in v.event_ids) != ids
        rep["writer_mismatches"] = wrong
        events_seen = sum(len(q[3]) for q in rep["log"])
        ok = ok and not wrong and rep["self_check"]
        say(f"{rep['name']}: {rep['queries']} queries ({events_seen} events returned); re-asked without caches "
            f"{'OK' if rep['self_check'] else 'FAILED ' + json.dumps(rep['mismatches'])}; "
            f"writer agrees {'OK' if not wrong else f'FAILED on {wrong}'}")
    await server.stop()
    await store.close()
    await db.close()
    return {"ok": ok, "events": gen.n, "final_position": final, "events_per_s": round(gen.n / elapsed),
            "readers": [{k: v for k, v in r.items() if k != "log"} for r in reports]}



async def run_reader(db_url: str, port: int, name: str, users: int, seed: int) -> dict[str, Any] | None:
    """Follow the events stream and serve incremental queries until told the final position."""
    from ..replication import Follower, ReplicationHub
    from ..transport.tcp import TcpClient
    from ..store.database import connect
    from ..events.replication import attach_reader
    from ..events.store import EventStore

    db = await connect(db_url)
    store = await EventStore.open(db, writer=False, instance_name=name)
    fol = Follower(start_position=0)
    attach_reader(store, fol)
    client = await TcpClient(ReplicationHub(name, follower=fol), "127.0.0.1", port, client_name=name,
                             expected_server_name=SERVER_NAME).start()
    names = _users(users)
    rng = random.Random(seed)
    tokens = {u: 0 for u in names}
    log: list[tuple[str, int, int, list[str]]] = []
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def serve(user: str, upto: int) -> None:
        if upto <= tokens[user]:
            return
        got = await store.get_new_events_for_user(user, tokens[user], upto, limit=BIG)
        log.append((user, tokens[user], upto, sorted(e for v in got.values() for e in v.event_ids)))
        tokens[user] = upto

    while not stop.done():
        pos = store.current_token()
        for user in rng.sample(names, min(5, len(names))):
            await serve(user, pos)
        await asyncio.sleep(0.005)
    order = (await stop).split()
    if len(order) < 2:  # stdin closed: the writer is gone (interrupted); stop quietly
        await client.stop()
        await fol.close()
        await store.close()
        await db.close()
        return None
    final = int(order[1])
    await fol.wait_for_position("events", "master", final, timeout=60)
    for user in names:
        await serve(user, final)
    # Every answer depends only on facts at or below its upper token: asking the
    # database again, without any cache, must give the same events.
    mismatches = []
    for user, since, upto, ids in log:
        again = await store.get_new_events_for_user(user, since, upto, limit=BIG, use_caches=False)
        if sorted(e for v in again.values() for e in v.event_ids) != ids:
            mismatches.append([user, since, upto])
    await client.stop()
    await fol.close()
    await store.close()
    await db.close()
    return {"name": name, "queries": len(log), "self_check": not mismatches, "mismatches": mismatches[:5],
            "log": log}


_CHILDREN: list[asyncio.subprocess.Process] = []  # reader processes, stopped however the writer ends


async def _stopping_children(main: Any) -> Any:
    """Await ``main``; then (Ctrl-C, an error, or done) terminate and reap the readers still running."""
    try:
        return await main
    finally:
        for proc in _CHILDREN:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        _CHILDREN.clear()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (shared by ``python -m`` and ``factstream events-demo``)."""
    p.add_argument("--db", default=None, help="database URL (default: a SQLite file in a temp directory)")
    p.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    p.add_argument("--rooms", type=int, default=10, help="rooms (default 10)")
    p.add_argument("--events", type=int, default=2000, help="events to persist (default 2000)")
    p.add_argument("--users", type=int, default=20, help="users (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--name", default="reader", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run the demo (or, with ``--reader``, one reader process); exit status 1 on a mismatch."""
    if args.reader:
        # Ctrl-C reaches the whole process group: the writer decides when its readers stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        report = asyncio.run(run_reader(args.db or os.environ[_READER_DB_ENV], args.port, args.name, args.users, args.seed))
        if report is not None:
            print(json.dumps(report), flush=True)
        return 0
    from .. import transport

    with tempfile.TemporaryDirectory(prefix="factstream-events-demo-") as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'events.db'}"
        summary = transport.run(lambda: _stopping_children(run_writer(
            url, readers=args.readers, rooms=args.rooms, events=args.events, users=args.users, seed=args.seed,
        )), use_uvloop=False)
    print(json.dumps(summary) if args.json else
          f"event store demo: {summary['events']} events, {len(summary['readers'])} readers, "
          f"{'all answers verified' if summary['ok'] else 'MISMATCH'}")
    return 0 if summary["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """Command line entry (``--reader`` for the reader processes the writer starts)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
