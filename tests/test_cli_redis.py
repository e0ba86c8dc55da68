"""``factstream tail --redis``, ``serve --redis`` and ``demo --redis`` as processes, against the real Redis.

Each test uses its own server name (the Redis channel), so tests never hear
each other or a deployment sharing the server.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from conftest import subprocess_env
from test_demo import check_demo_report
import redis

from factstream import wire
from factstream.demo.live import committed_facts
from factstream.replication import Follower, ReplicationHub
from factstream.demo.tables import DEMO_TABLES
from factstream.store.database import connect
from factstream.transport.redis import RedisCarrier, RedisReplication, command_to_json

pytestmark = pytest.mark.redis

ENV = subprocess_env()
CLI = [sys.executable, "-m", "factstream.cli"]

# What a test writer publishes; USER_IP goes to <server_name>/USER_IP.
TRAFFIC = [
    'POSITION caches w1 4 5',
    'RDATA caches w1 batch ["get_user_by_id",["@a:hs"],1]',
    'RDATA to_device w1 6 ["@c:hs"]',
    'RDATA caches w1 6 ["get_user_by_id",["@b:hs"],2]',
    'USER_IP @u:hs ["tok","10.0.0.1","curl","DEV",1700000000000]',
    'USER_SYNC worker1 @u:hs DEV start 1700000000000',
    'REMOTE_SERVER_UP other.example',
]


def _wait_subscribers(url: str, channel: str, n: int = 1, timeout: float = 15.0) -> None:
    """Block until ``n`` connections are subscribed to ``channel`` (the tail is listening)."""
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) >= n:
                return
            time.sleep(0.02)
        raise AssertionError(f"nobody subscribed to {channel} within {timeout}s")
    finally:
        client.close()


async def _publish(url: str, channel: str, lines: list[str]) -> None:
    """A test writer: publish ``lines`` as commands, in order, and wait for Redis to acknowledge them."""
    async with RedisCarrier(url, channel, instance_name="w1", listen=False) as carrier:
        for line in lines:
            assert carrier.send(wire.parse_line(line))
        await carrier.flush(timeout=10)


def _start_tail(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "tail", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def _finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return out, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ tail --redis: the traffic


async def test_tail_redis_prints_the_commands_a_writer_publishes(redis_url: str, channel_prefix: str) -> None:
    tail = _start_tail("--redis", redis_url, "--server-name", channel_prefix, "--stream", "caches", "--count", "5")
    try:
        _wait_subscribers(redis_url, channel_prefix)
        await _publish(redis_url, channel_prefix, TRAFFIC)
    finally:
        out, _ = _finish(tail)
    # Filtered: RDATA of another stream; not subscribed: the USER_IP channel. Everything else, as published.
    assert out.splitlines() == [
        'POSITION caches w1 4 5',
        'RDATA caches w1 batch ["get_user_by_id",["@a:hs"],1]',
        'RDATA caches w1 6 ["get_user_by_id",["@b:hs"],2]',
        'USER_SYNC worker1 @u:hs DEV start 1700000000000',
        'REMOTE_SERVER_UP other.example',
    ]


async def test_tail_redis_json_with_the_user_ip_channel(redis_url: str, channel_prefix: str) -> None:
    tail = _start_tail("--redis", redis_url, "--server-name", channel_prefix, "--json", "--user-ip", "--count", "7")
    try:
        _wait_subscribers(redis_url, f"{channel_prefix}/USER_IP")
        await _publish(redis_url, channel_prefix, TRAFFIC)
    finally:
        out, _ = _finish(tail)
    got = [json.loads(line) for line in out.splitlines()]
    assert got == [json.loads(json.dumps(command_to_json(wire.parse_line(line)))) for line in TRAFFIC]
    assert got[1] == {"command": "RDATA", "stream_name": "caches", "instance_name": "w1", "token": None,
                      "row": ["get_user_by_id", ["@a:hs"], 1]}
    assert got[4] == {"command": "USER_IP", "user_id": "@u:hs", "access_token": "tok", "ip": "10.0.0.1",
                      "user_agent": "curl", "device_id": "DEV", "last_seen": 1700000000000}


# ------------------------------------------------------------------ serve --redis + readers


async def _serve_status(proc: asyncio.subprocess.Process, event: str, timeout: float = 30) -> dict[str, Any]:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        while line := await proc.stdout.readline():
            msg = json.loads(line)
            if msg["event"] == event:
                return msg
    raise AssertionError(f"serve exited before {event!r}")


async def test_serve_redis_publishes_to_readers_following_over_redis(
    redis_url: str, channel_prefix: str, tmp_path: Any,
) -> None:
    db_path = f"{tmp_path}/w.db"
    db_url = f"sqlite:///{db_path}"
    serve = await asyncio.create_subprocess_exec(
        *CLI, "serve", "--redis", redis_url, "--server-name", channel_prefix, "--db", db_url, "--status",
        "--produce", "--rate", "300", "--duration", "2", "--seed", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
    )
    db = None
    reader = None
    try:
        listening = await _serve_status(serve, "listening")
        assert listening["port"] is None and listening["channel"] == channel_prefix
        status = await _serve_status(serve, "status")
        assert status["subscribed"] is True and "readers" not in status

        # A reader joining while the writer produces: live rows over Redis, the start from the database.
        db = await connect(db_url)
        fol = Follower(sources={t.stream: t.source(db) for t in DEMO_TABLES}, start_position=0)
        got: dict[str, list[tuple[int, list[Any]]]] = {}
        fol.add_handler(lambda s, w, tok, rows: got.setdefault(s, []).append((tok, [r.to_wire() for r in rows])))
        reader = await RedisReplication(ReplicationHub("test-reader", follower=fol), redis_url, channel_prefix).start()
        await reader.wait_connected(10)

        produced = await _serve_status(serve, "produced", timeout=60)
        assert produced["facts"] > 100 and produced["positions"]
        for stream, pos in produced["positions"].items():
            await fol.wait_for_position(stream, "master", pos, timeout=30)
        truth = committed_facts(db_path)
        for stream, facts in truth.items():
            want = [(tok, sorted(rows, key=json.dumps)) for tok, rows in sorted(facts.items())]
            have = [(tok, sorted(rows, key=json.dumps)) for tok, rows in got.get(stream, [])]
            assert have == want, stream  # every fact once, in order, same rows

        # tail --redis --db: the reader's view (facts), replayed from the tables then live.
        facts_tail = await asyncio.to_thread(
            subprocess.run,
            [*CLI, "tail", "--redis", redis_url, "--server-name", channel_prefix, "--db", db_url, "--from-start",
             "--json", "--stream", "caches", "--count", "5"],
            capture_output=True, text=True, timeout=30, env=ENV,
        )
        assert facts_tail.returncode == 0, facts_tail.stderr
        rows = [json.loads(line) for line in facts_tail.stdout.splitlines()]
        first_rows = [tok for tok in sorted(truth["caches"]) for _ in truth["caches"][tok]][:5]
        assert [r["token"] for r in rows] == first_rows
        assert {r["stream"] for r in rows} == {"caches"} and rows[0]["row"][0] == "get_user_by_id"

        # tail --redis --replicate: the idle writer answers REPLICATE with its position, as on the wire.
        traffic = await asyncio.to_thread(
            subprocess.run,
            [*CLI, "tail", "--redis", redis_url, "--server-name", channel_prefix, "--replicate",
             "--stream", "caches", "--count", "2"],
            capture_output=True, text=True, timeout=30, env=ENV,
        )
        assert traffic.returncode == 0, traffic.stderr
        p = produced["positions"]["caches"]
        # "REPLICATE " keeps its trailing space: Synapse writes every command as "NAME <args>".
        assert traffic.stdout.splitlines() == ["REPLICATE ", f"POSITION caches master {p} {p}"]
    finally:
        if reader is not None:
            await reader.stop()
        if db is not None:
            await db.close()
        if serve.returncode is None:
            serve.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, err = await serve.communicate()
    assert serve.returncode == 0, err.decode()[-2000:]


# ------------------------------------------------------------------ demo --redis


def test_demo_over_redis_verifies(redis_url: str, tmp_path: Any) -> None:
    proc = subprocess.run(
        [*CLI, "demo", "--redis", redis_url, "--duration", "4", "--json", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=ENV,
    )
    check_demo_report(proc)
    assert "over Redis" in proc.stderr and "channel factstream-demo-" in proc.stderr


# ------------------------------------------------------------------ errors that say what to do


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, env=ENV)


def test_tail_needs_a_target_or_redis_and_a_server_name(redis_url: str) -> None:
    out = _cli("tail")
    assert out.returncode == 2 and "HOST:PORT" in out.stderr and "--redis" in out.stderr
    out = _cli("tail", "--redis", redis_url)
    assert out.returncode == 2 and "--redis needs --server-name" in out.stderr
    out = _cli("tail", "127.0.0.1:9092", "--redis", redis_url, "--server-name", "x")
    assert out.returncode == 2 and "not both" in out.stderr
    out = _cli("tail", "127.0.0.1:9092", "--replicate")
    assert out.returncode == 2 and "need --redis" in out.stderr
    out = _cli("tail", "--redis", redis_url, "--server-name", "x", "--from-start")
    assert out.returncode == 2 and "--from-start needs --db" in out.stderr


@pytest.mark.parametrize("cmd", [["tail", "--server-name", "x"], ["serve", "--db", "sqlite:///:memory:"], ["demo"]])
@pytest.mark.parametrize("url, what", [
    ("http://127.0.0.1:6379", "bad Redis URL"),
    ("redis://127.0.0.1:notaport", "bad Redis URL"),
    ("redis://127.0.0.1:6379/0?no_such_option=1", "unsupported option in Redis URL"),
])
def test_a_bad_redis_url_is_a_usage_error(cmd: list[str], url: str, what: str) -> None:
    out = _cli(*cmd, "--redis", url)
    assert out.returncode == 2, out.stderr
    assert what in out.stderr and "expected redis://" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("cmd", [["tail", "--server-name", "x"], ["serve", "--db", "sqlite:///:memory:"], ["demo"]])
def test_unreachable_redis_fails_at_once_saying_what_to_do(cmd: list[str]) -> None:
    url = f"redis://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    out = _cli(*cmd, "--redis", url)
    assert out.returncode == 1, out.stderr
    assert f"cannot reach Redis at {url}" in out.stderr and "start Redis" in out.stderr
    assert "Traceback" not in out.stderr and time.monotonic() - started < 20


def test_wrong_password_is_reported_as_such(redis_url: str) -> None:
    url = redis_url.replace("redis://", "redis://:not-the-password@")
    out = _cli("tail", "--redis", url, "--server-name", "x")
    assert out.returncode == 1
    # the shared Redis has no password: the fix is to remove it from the URL, and the message says so
    assert "has no password set, but the URL gives one: remove it" in out.stderr and "not-the-password" not in out.stderr
