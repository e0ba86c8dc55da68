"""``serve --nats``, ``tail --nats`` and ``demo --nats`` as processes, against the shared JetStream server.

Each test uses its own server name (its own JetStream stream), deleted afterwards.
The writer-crash test SIGKILLs a producing ``factstream serve --nats`` and starts it
again on the same database: a reader in this process must end with exactly the
committed facts, and must never have needed the database.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import subprocess_env, terminate
from factstream.replication import Follower, ReplicationHub
from factstream.demo.tables import DEMO_TABLES
from factstream.store.database import connect
from factstream.transport.nats import JetStreamLayout, NatsReplication

from nats_helpers import CountingSource, deployment, nats_url, run_loop
from test_demo import check_demo_report

__all__ = ["deployment", "nats_url"]

ENV = subprocess_env()
CLI = [sys.executable, "-m", "factstream.cli"]


def start_writer(url: str, name: str, db: Path | str, *extra: str) -> subprocess.Popen[str]:
    db_url = db if isinstance(db, str) else f"sqlite:///{db}"
    return subprocess.Popen(
        [*CLI, "serve", "--nats", url, "--server-name", name, "--db", db_url, "--produce", "--status",
         "--rollback-rate", "0.1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )


def read_event(proc: subprocess.Popen[str], event: str, timeout: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"writer exited ({proc.wait()}) before {event!r}: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        msg: dict[str, Any] = json.loads(line)
        if msg.get("event") == event:
            return msg
    raise AssertionError(f"no {event!r} event within {timeout}s")


@pytest.mark.slow
@pytest.mark.parametrize(("loop", "engine"), [("asyncio", "postgres"), ("uvloop", "postgres"), ("uvloop", "sqlite")])
def test_writer_killed_mid_publish_and_restarted_leaves_no_duplicates_or_holes(
    nats_url: str, deployment: str, request: pytest.FixtureRequest, tmp_path: Path, loop: str, engine: str
) -> None:
    # PostgreSQL's sequences never hand out an id twice; a restarted SQLite writer takes up its counter past
    # the id block it had recorded (stream_id_blocks), so neither hands out again an id readers passed over.
    db = request.getfixturevalue("postgres_dsn") if engine == "postgres" else f"sqlite:///{tmp_path / 'w.db'}"
    flags = ("--no-uvloop",) if loop == "asyncio" else ()

    async def scenario() -> None:
        rdb = None
        got: dict[str, list[tuple[int, list[Any]]]] = {}
        writer = start_writer(nats_url, deployment, db, "--duration", "60", *flags)
        try:
            read_event(writer, "listening")
            rdb = await connect(db)
            sources = {t.stream: CountingSource(t.source(rdb)) for t in DEMO_TABLES}
            follower = Follower(sources=sources, start_position=0)
            follower.add_handler(lambda s, w, t, rows: got.setdefault(s, []).append((t, [r.to_wire() for r in rows])))
            hub = ReplicationHub("checker", follower=follower)
            reader = await NatsReplication(hub, nats_url, deployment, consumer_heartbeat=0.25).start()
            await reader.wait_connected(30)
            deadline = time.monotonic() + 30
            while sum(len(v) for v in got.values()) < 2000:
                assert time.monotonic() < deadline, "the reader got too little before the kill"
                await asyncio.sleep(0.05)
            writer.send_signal(signal.SIGKILL)  # mid-publish: it produces as fast as it can
            terminate(writer)
            writer = start_writer(nats_url, deployment, db, "--duration", "2", *flags)
            produced = read_event(writer, "produced")
            for stream, pos in produced["positions"].items():
                await follower.wait_for_position(stream, "master", pos, 60)
            await reader.stop()
            await follower.close()
            truth = await table_facts(rdb)
            for stream, facts in truth.items():
                tokens = [t for t, _ in got.get(stream, [])]
                assert tokens == sorted(set(tokens)), f"{stream}: duplicated or reordered facts"
                assert set(tokens) == set(facts), f"{stream}: lost {sorted(set(facts) - set(tokens))[:5]}"
                for token, rows in got.get(stream, []):
                    assert sorted(map(json.dumps, rows)) == sorted(map(json.dumps, facts[token]))
            assert sum(s.queries for s in sources.values()) == 0, "a hole in the log sent the reader to the database"
            assert reader.stats.fallbacks == 0
        finally:
            terminate(writer)
            if rdb is not None:
                await rdb.close()

    run_loop(loop, scenario(), timeout=180)


async def table_facts(db: Any) -> dict[str, dict[int, list[Any]]]:
    """Stream -> token -> rows, straight from the writer's tables (the truth)."""
    out: dict[str, dict[int, list[Any]]] = {}
    for t in DEMO_TABLES:
        facts: dict[int, list[Any]] = {}
        for token, row in (await t.source(db).get_updates("master", 0, 1 << 62, 1 << 30))[0]:
            facts.setdefault(int(token), []).append(row)
        out[t.stream] = facts
    return out


@pytest.mark.slow
def test_demo_over_nats_is_exactly_once_and_the_killed_reader_resumes_from_the_log(nats_url: str) -> None:
    proc = subprocess.run([*CLI, "demo", "--nats", nats_url, "--duration", "5", "--json"],
                          capture_output=True, text=True, timeout=180, env=ENV)
    report = check_demo_report(proc)
    killed = next(r for r in report["readers"] if r["restarts"])
    assert killed["catchup_fetches"] == 0 and killed["catchup_rows"] == 0, "the restarted reader queried the database"
    assert "JetStream" in proc.stderr


def test_tail_prints_the_log_lines(nats_url: str, deployment: str, tmp_path: Path) -> None:
    writer = start_writer(nats_url, deployment, tmp_path / "w.db", "--duration", "1", "--rate", "50")
    try:
        status = read_event(writer, "status")  # a healthy link: connected, nothing waiting long for JetStream
        assert status["connected"] is True and 0 <= status["unacknowledged_for"] < 1, status
        read_event(writer, "produced")
        out = subprocess.run([*CLI, "tail", "--nats", nats_url, "--server-name", deployment, "--from-start",
                              "--count", "5"], capture_output=True, text=True, timeout=60, env=ENV)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == 5 and all(line.split()[0] in ("RDATA", "POSITION") for line in lines), lines
        js = subprocess.run([*CLI, "tail", "--nats", nats_url, "--server-name", deployment, "--from-start",
                             "--count", "3", "--json", "--stream", "caches"], capture_output=True, text=True,
                            timeout=60, env=ENV)
        assert js.returncode == 0, js.stderr
        objs = [json.loads(line) for line in js.stdout.splitlines()]
        assert len(objs) == 3 and all(o["stream_name"] == "caches" and o["seq"] > 0 for o in objs), objs
    finally:
        terminate(writer)


def test_serve_short_max_age_and_refused_replicas(nats_url: str, deployment: str, tmp_path: Path) -> None:
    """--nats-max-age below JetStream's 120 s duplicate window works (the window shrinks to it); --nats-replicas 3
    on one server is refused by JetStream: serve says so and what to do, exit 1, instead of retrying forever."""
    writer = start_writer(nats_url, deployment, tmp_path / "w.db", "--duration", "1", "--rate", "20",
                          "--nats-max-age", "60")
    try:
        read_event(writer, "produced")
    finally:
        terminate(writer)

    async def config() -> Any:
        import nats

        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().stream_info(JetStreamLayout.for_server(deployment).stream)).config
        finally:
            await nc.close()

    cfg = asyncio.run(config())
    assert (cfg.max_age, cfg.duplicate_window) == (60, 60)

    proc = subprocess.run([*CLI, "serve", "--nats", nats_url, "--server-name", f"{deployment}-r3", "--db",
                           f"sqlite:///{tmp_path / 'r3.db'}", "--nats-replicas", "3"],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 1, proc.stderr
    assert "replicas > 1 not supported" in proc.stderr and "--nats-replicas 1" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "status", "needle"),
    [
        (["tail", "--nats", "nats://127.0.0.1:4222"], 2, "--nats needs --server-name"),
        (["tail", "--nats", "nats://127.0.0.1:4222", "127.0.0.1:9092", "--server-name", "x"], 2,
         "give either HOST:PORT (TCP) or --nats URL, not both"),
        (["tail", "--nats", "nats://127.0.0.1:4222", "--redis", "redis://127.0.0.1:6379", "--server-name", "x"], 2,
         "give either --redis URL or --nats URL, not both"),
        (["serve", "--nats", "127.0.0.1:4222"], 2, "bad NATS URL"),
        (["serve", "--nats", "nats://alice:s3cret@127.0.0.1:1"], 1, "cannot reach NATS at nats://alice:***@127.0.0.1:1"),
        (["tail", "--nats", "nats://127.0.0.1:4222", "--server-name", "nobody-here-x"], 1, "no JetStream stream"),
        (["demo", "--nats", "nats://127.0.0.1:1"], 1, "cannot reach NATS"),
    ],
)
def test_cli_mistakes_get_a_clear_error(argv: list[str], status: int, needle: str, nats_url: str) -> None:
    proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == status, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and "s3cret" not in proc.stderr + proc.stdout
    _ = JetStreamLayout
