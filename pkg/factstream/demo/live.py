"""The live demo's parts: the reader process, the child processes it watches, and the verdict.

``factstream demo`` (cli/demo.py) runs a writer and readers as child processes
and checks every reader's log against the writer's database: each committed
fact exactly once, in order. This module holds those parts so the command
module keeps only its arguments and its output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import time
from typing import Any

from ..status_lines import emit

#: The demo's single writer instance.
WRITER = "master"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ====================================================================== reader process


def recover_log(path: str) -> tuple[dict[tuple[str, str], int], int]:
    """Positions and row count from a reader log, dropping a torn last line (after SIGKILL)."""
    positions: dict[tuple[str, str], int] = {}
    rows = 0
    if not os.path.exists(path):
        return positions, rows
    with open(path, "rb") as fh:
        data = fh.read()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    for line in data[:end].splitlines():
        stream, token, got = json.loads(line)
        positions[(stream, WRITER)] = token
        rows += len(got)
    return positions, rows


async def reader_main(args: argparse.Namespace) -> int:
    from ..replication import Follower, ReplicationHub
    from .tables import DEMO_TABLES
    from ..store.database import connect
    positions, rows = recover_log(args.log)
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    db = await connect(args.db)
    fol = Follower(
        sources={t.stream: t.source(db) for t in DEMO_TABLES},
        positions=positions,
        start_position=0,
        page_limit=500,
    )
    lags: list[float] = []
    state = {"rows": rows, "here": 0, "first": 0.0, "last": 0.0, "live_rows": 0}

    def on_rows(stream: str, writer: str, token: int, got: list[Any]) -> None:
        # One write per fact: a SIGKILL leaves whole facts (or one torn line we drop).
        os.write(fd, (json.dumps([stream, token, [r.to_wire() for r in got]]) + "\n").encode())
        now = time.time()
        state["rows"] += len(got)
        state["here"] += len(got)
        state["first"] = state["first"] or now
        state["last"] = now
        if not fol.is_catching_up(stream, writer):
            state["live_rows"] += len(got)
            if stream == "receipts":
                lags.extend(now - r.data["ts"] / 1000 for r in got)

    fol.add_handler(on_rows)
    hub = ReplicationHub(args.name, follower=fol)
    client: Any
    if args.nats:
        from ..transport.nats import NatsReplication

        client = await NatsReplication(hub, args.nats, args.server_name).start()
    elif args.redis:
        from ..transport.redis import RedisReplication

        client = await RedisReplication(hub, args.redis, args.server_name, backoff_initial=0.05, backoff_max=0.5).start()
    else:
        from ..transport.tcp import TcpClient

        client = await TcpClient(
            hub, "127.0.0.1", args.port, client_name=args.name, expected_server_name=args.server_name or "demo.hs",
            backoff_initial=0.05, backoff_max=0.5,
        ).start()

    def connected() -> bool:
        return client.connection is not None if args.redis else bool(client.connected)

    emit({"event": "started", "recovered_rows": rows, "positions": {s: p for (s, _), p in positions.items()}})
    while True:
        await asyncio.sleep(0.2)
        emit({"event": "status", "rows": state["rows"], "connected": connected()})
        if args.final and os.path.exists(args.final):
            with open(args.final) as fh:
                final = json.load(fh)
            for stream, pos in final.items():
                await fol.wait_for_position(stream, WRITER, pos, timeout=60)
            break
    await client.stop()
    await fol.close()
    await db.close()
    os.close(fd)
    span = state["last"] - state["first"]
    server_errors = list(getattr(client, "server_errors", ()))  # TCP only
    emit({
        "event": "done",
        "rows": state["rows"],
        "live_rows": state["live_rows"],
        "rows_this_process": state["here"],
        "rows_per_s": state["here"] / span if span > 0 else None,
        "lag_p50_ms": None if not lags else 1000 * percentile(lags, 0.5),  # type: ignore[operator]
        "lag_p99_ms": None if not lags else 1000 * percentile(lags, 0.99),  # type: ignore[operator]
        "connects": client.stats.subscriber_connects if args.redis else (
            client.stats.connects if args.nats else client.connects),
        "catchup_rows": fol.stats["catchup_rows"],
        "catchup_fetches": fol.stats["catchup_fetches"],
        "stale_rows": fol.stats["stale_rows"],
        # connections that ended while it ran, and (TCP) why the writer closed them where it said so (its
        # ERROR before it closes; an ERROR queued behind what a lagging reader has not read may never arrive)
        "carrier": "redis" if args.redis else "nats" if args.nats else "tcp",
        "connection_ends": client.stats.subscriber_losses if args.redis else (
            client.stats.disconnects if args.nats else client.disconnects),
        "writer_errors": sorted(set(server_errors)),
        "writer_closes": len(server_errors),
    })
    return 0


# ====================================================================== orchestrator


class Child:
    """One child process whose JSON status lines update a progress bar."""

    def __init__(self, name: str, argv: list[str], workdir: str, bar: Any) -> None:
        self.name = name
        self.argv = argv
        self.workdir = workdir
        self.bar = bar
        self.proc: asyncio.subprocess.Process | None = None
        self.last: dict[str, Any] = {}
        self.events: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.reader_task: asyncio.Task[None] | None = None
        self.restarts = 0

    async def start(self) -> None:
        err = open(os.path.join(self.workdir, f"{self.name}.stderr"), "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        err.close()
        self.events = {}
        self.reader_task = asyncio.create_task(self._read(self.proc))

    def event(self, name: str) -> asyncio.Future[dict[str, Any]]:
        if name not in self.events:
            self.events[name] = asyncio.get_running_loop().create_future()
        return self.events[name]

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self.last = msg
            fut = self.event(msg.get("event", ""))
            if not fut.done():
                fut.set_result(msg)
            n = msg.get("rows")
            if self.bar is not None and isinstance(n, int):
                self.bar.n = n
                self.bar.refresh()

    async def wait(self, event: str, timeout: float) -> dict[str, Any]:
        """Wait for a status event, failing early if the process dies."""
        fut = self.event(event)
        assert self.proc is not None
        died: asyncio.Task[Any] = asyncio.create_task(self.proc.wait())
        done, _ = await asyncio.wait({fut, died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        died.cancel()
        if fut.done():
            return fut.result()
        tail = self.stderr_tail()
        raise RuntimeError(f"{self.name} did not report {event!r} in {timeout:.0f}s (exit {self.proc.returncode}).\n{tail}")

    def stderr_tail(self, n: int = 15) -> str:
        try:
            with open(os.path.join(self.workdir, f"{self.name}.stderr"), errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        if self.reader_task:
            await self.reader_task

    async def terminate(self, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        return self.proc.returncode


def committed_facts(db_path: str) -> dict[str, dict[int, list[Any]]]:
    """Stream -> token -> rows, straight from the SQLite file (the truth)."""
    from .tables import DEMO_TABLES

    out: dict[str, dict[int, list[Any]]] = {}
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        for t in DEMO_TABLES:
            facts: dict[int, list[Any]] = {}
            cols = ", ".join(t.columns)
            for rec in conn.execute(f"SELECT stream_id, {cols} FROM {t.table} ORDER BY stream_id"):
                facts.setdefault(int(rec[0]), []).append(t.to_row(tuple(rec[1:])))
            out[t.stream] = facts
    finally:
        conn.close()
    return out


def verify_log(path: str, truth: dict[str, dict[int, list[Any]]]) -> dict[str, Any]:
    """Compare a reader log with the database: lost, duplicated, reordered, altered facts."""
    seen: dict[str, list[int]] = {s: [] for s in truth}
    rows: dict[str, dict[int, list[Any]]] = {s: {} for s in truth}
    with open(path) as fh:
        for line in fh:
            stream, token, got = json.loads(line)
            seen.setdefault(stream, []).append(token)
            rows.setdefault(stream, {})[token] = got
    report: dict[str, Any] = {"ok": True, "streams": {}}
    for stream, facts in truth.items():
        tokens = seen.get(stream, [])
        dup = len(tokens) - len(set(tokens))
        reordered = sum(1 for a, b in zip(tokens, tokens[1:]) if b <= a)
        lost = len(set(facts) - set(tokens))
        extra = len(set(tokens) - set(facts))
        altered = sum(
            1 for t in set(facts) & set(tokens)
            if sorted(map(json.dumps, facts[t])) != sorted(map(json.dumps, rows[stream][t]))
        )
        ok = not (dup or reordered or lost or extra or altered)
        report["streams"][stream] = {
            "facts": len(facts), "received": len(tokens), "lost": lost, "duplicated": dup,
            "reordered": reordered, "unknown": extra, "altered": altered, "ok": ok,
        }
        report["ok"] = report["ok"] and ok
    return report

