"""A writer survives its database going away (real ``pg_terminate_backend`` on a throw-away database).

* the database layer turns a connection killed under a statement into
  :class:`DatabaseUnavailable` (URL password masked), drops the pool's other
  dead connections, and the next call works;
* ids reserved in a transaction the outage cut off complete (as rolled back),
  so the position keeps advancing afterwards;
* ``factstream serve --produce`` keeps its listener and its readers, logs one
  line per outage (no traceback) and resumes producing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from factstream.ids import create_id_generator
from factstream.replication.tables import create_tables
from factstream.demo.tables import DEMO_TABLES
from factstream.store.database import DatabaseUnavailable, connect

from conftest import pg_dsn, subprocess_env

pytestmark = pytest.mark.postgres

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
PASSWORD = "outage-s3cret-pw"


def with_password(dsn: str) -> str:
    """``dsn`` with a password in it (the trust-auth test server ignores it; the output must not show it)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"))


def terminate_backends(dsn: str, refuse_for: float = 0.0) -> int:
    """Kill every connection to ``dsn``'s database, as a failover or an operator would; with
    ``refuse_for``, new connections are refused for that long too (a server restarting)."""
    import psycopg

    name = urlsplit(dsn).path.lstrip("/")
    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
        if refuse_for:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchall()
            time.sleep(refuse_for)
        finally:
            if refuse_for:
                conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    return len(rows)


async def test_killed_connection_is_a_clear_error_and_the_pool_recovers(postgres_dsn: str) -> None:
    db = await connect(with_password(postgres_dsn))
    try:
        await db.execute("CREATE TABLE t (x INT)")
        import asyncio

        await asyncio.gather(*(db.fetchall("SELECT pg_sleep(0.05)") for _ in range(3)))  # three pooled connections
        assert terminate_backends(postgres_dsn) >= 3
        await asyncio.sleep(0.1)  # the server's goodbye reaches the idle sockets
        # Idle pooled connections the server ended are found at hand-out and replaced: no failure.
        assert await db.fetchall("SELECT 1") == [(1,)]
        rolled_back: list[bool] = []
        with pytest.raises(DatabaseUnavailable) as err:
            async with db.transaction() as txn:
                txn.call_after_rollback(rolled_back.append, True)
                await txn.execute("INSERT INTO t VALUES (1)")
                terminate_backends(postgres_dsn)
                await txn.execute("INSERT INTO t VALUES (2)")
        assert "lost the connection to PostgreSQL" in str(err.value) and PASSWORD not in str(err.value)
        assert err.value.__cause__ is None and err.value.__suppress_context__
        assert rolled_back == [True]
        # Killed and refused for a while (a restart): a clear error, then the pool recovers.
        await asyncio.to_thread(terminate_backends, postgres_dsn, 0.3)
        assert await db.fetchall("SELECT 1") == [(1,)]
        refusing = asyncio.create_task(asyncio.to_thread(terminate_backends, postgres_dsn, 1.0))
        await asyncio.sleep(0.3)
        with pytest.raises(DatabaseUnavailable) as err:
            await db.fetchall("SELECT 1")
        assert "PostgreSQL" in str(err.value) and PASSWORD not in str(err.value)
        await refusing
        assert await db.fetchall("SELECT count(*) FROM t") == [(0,)]
    finally:
        await db.close()


async def test_ids_reserved_when_the_connection_died_complete(postgres_dsn: str) -> None:
    """A transaction cut off after reserving ids rolls them back: the position is not held at them."""
    db = await connect(postgres_dsn)
    table = DEMO_TABLES[0]
    try:
        await create_tables(db, [table])
        gen = await create_id_generator(db, stream_name=table.stream, instance_name="w1", writers=["w1"],
                                        tables=table.id_tables())
        async with db.transaction() as txn:
            ok = await gen.get_next_txn(txn)
            await txn.execute(table.insert_sql(), table.insert_params(ok, "w1", ["@a:hs"]))
        with pytest.raises(DatabaseUnavailable):
            async with db.transaction() as txn:
                cut = await gen.get_next_mult_txn(txn, 3)
                terminate_backends(postgres_dsn)
                await txn.execute(table.insert_sql(), table.insert_params(cut[0], "w1", ["@b:hs"]))
        assert gen.current_token_for_writer("w1") == cut[-1]  # completed, as rolled back
        async with db.transaction() as txn:
            after = await gen.get_next_txn(txn)
            await txn.execute(table.insert_sql(), table.insert_params(after, "w1", ["@c:hs"]))
        assert after > cut[-1] and gen.current_token_for_writer("w1") == after
        await gen.close()
    finally:
        await db.close()


class _Lines(threading.Thread):
    """Reads a text stream in the background, keeping every line."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[str] = []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)


class _Reader(threading.Thread):
    """A raw replication reader: counts RDATA lines and notices when the writer closes on it."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(b"NAME outage-reader\nREPLICATE\n")
        self.rdata = 0
        self.closed = False

    def run(self) -> None:
        buf = b""
        last_ping = time.monotonic()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                self.rdata += sum(1 for x in lines if x.startswith(b"RDATA "))
                if time.monotonic() - last_ping > 1:
                    self.sock.sendall(b"PING 1\n")
                    last_ping = time.monotonic()
        except OSError:
            pass
        self.closed = True


def _status(out: _Lines) -> dict[str, Any]:
    for line in reversed(out.lines):
        msg = json.loads(line)
        if msg["event"] == "status":
            return msg
    return {}


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_serve_produce_survives_terminated_connections(postgres_dsn: str) -> None:
    proc = subprocess.Popen(
        [FACTSTREAM, "serve", "--db", with_password(postgres_dsn), "--port", "0", "--status", "--produce",
         "--rate", "200", "--instance-name", "w1", "--server-name", "outage.hs", "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "listening"
        out, err = _Lines(proc.stdout), _Lines(proc.stderr)
        out.start()
        err.start()
        reader = _Reader(first["port"])
        reader.start()
        _wait(lambda: _status(out).get("readers") == 1 and reader.rdata > 20, 30, "the reader to get facts")
        kills = 3
        for _ in range(kills):
            before = _status(out)
            rdata_before = reader.rdata
            assert terminate_backends(postgres_dsn, refuse_for=0.5) >= 1  # killed, and refused a while
            # Producing resumes: new facts are written, published and reach the connected reader.
            _wait(lambda: _status(out).get("facts", 0) > before["facts"] + 20, 30, "producing to resume")
            _wait(lambda: reader.rdata > rdata_before + 20, 30, "the reader to get new facts")
            assert proc.poll() is None, "".join(err.lines)
        final = _status(out)
        assert final["readers"] == 1 and not reader.closed
        assert 1 <= final["db_outages"] <= kills, final
        # Every position moved past what it was when the first outage hit: no id is stuck.
        for stream, pos in final["positions"].items():
            assert pos > first["positions"][stream], (stream, pos)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
    out.join(5)
    err.join(5)
    reader.sock.close()
    reader.join(5)
    proc.stdout.close()
    proc.stderr.close()
    stderr = "".join(err.lines)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and PASSWORD not in stderr and PASSWORD not in "".join(out.lines)
    started = [x for x in stderr.splitlines() if "unavailable (" in x]
    # one line per outage and part (the writer, the publisher, each stream's position), not per attempt
    assert len(started) <= kills * (2 + len(first["positions"])), stderr
    assert any("database postgresql://postgres:***@" in x for x in started), stderr


def _event(n: int, prevs: list[str], **fields: Any) -> bytes:
    body = {"event_id": f"${n}-outage", "room_id": "!outage:hs", "sender": "@a:hs", "prev_events": prevs,
            "depth": n, "content": {"msgtype": "m.text", "body": f"m{n}"}, "type": "m.room.message", **fields}
    return json.dumps(body).encode()


async def test_event_store_writer_survives_terminated_connections(postgres_dsn: str) -> None:
    """Connections killed again and again under persist_events: each call succeeds or raises
    DatabaseUnavailable; retried, every event is stored exactly once and the position covers every id."""
    import asyncio

    from factstream.events import EventStore

    db = await connect(postgres_dsn)
    store = await EventStore.open(db)
    try:
        await store.persist_events([
            _event(1, [], type="m.room.create", state_key="", content={"creator": "@a:hs"}),
            _event(2, ["$1-outage"], type="m.room.member", state_key="@a:hs", content={"membership": "join"}),
        ])
        stop = asyncio.Event()

        async def killer() -> None:
            for _ in range(15):  # fifteen outages, 0.1 s apart, while events are being persisted
                if stop.is_set():
                    return
                await asyncio.to_thread(terminate_backends, postgres_dsn, 0.05)  # and refused for 50 ms
                await asyncio.sleep(0.1)

        chaos = asyncio.create_task(killer())
        failures = 0
        try:
            for n in range(3, 63):
                for _attempt in range(50):
                    try:
                        await store.persist_events([_event(n, [f"${n - 1}-outage"])])
                        break
                    except DatabaseUnavailable as err:
                        assert "lost the connection" in str(err) or "cannot connect" in str(err)
                        failures += 1
                        await asyncio.sleep(0.01)
                else:
                    raise AssertionError(f"event {n} never persisted")
        finally:
            stop.set()
            await chaos
        assert failures > 0  # the outages did hit
        last = await store.persist_events([_event(63, ["$62-outage"])])
        rows = await db.fetchall("SELECT count(*), count(DISTINCT event_id), MAX(stream_ordering) FROM events")
        assert rows[0][0] == rows[0][1] == 63  # every event once, none lost, none duplicated
        # No id stuck: the position is at (or past) every id handed out, including those cut off.
        assert store.current_token() >= rows[0][2] and last[0].stream_ordering == store.current_token()
    finally:
        await store.close()
        await db.close()
