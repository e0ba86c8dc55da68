"""A writer never breaks the Synapse deployment it joins, and runs under any instance name.

* Streams outside Synapse's registry are refused by default (a Synapse process
  fails on their POSITION and drops its connection in a loop); an application
  that owns its channel says so with ``custom_streams=True`` / ``--custom-streams``.
* Synapse's own streams still publish, over TCP and over Redis.
* ``factstream serve --produce`` runs as any writer (not only ``master``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest

from factstream.replication import ForeignStreamError, LocalStream, Publisher, ReplicationHub
from factstream.replication.publisher import SYNAPSE_STREAM_NAMES
from factstream.transport.tcp import TcpServer

from cli_run import ENV, FACTSTREAM, stop
from conftest import synapse_python

BOTH_EVENT_LOOPS = True


def test_foreign_stream_is_refused_with_the_reason() -> None:
    pub = Publisher("master")
    with pytest.raises(ForeignStreamError) as err:
        pub.add_stream("fs_custom", LocalStream("fs_custom", "master").source, 0)
    msg = str(err.value)
    assert "fs_custom" in msg and "Synapse" in msg and "KeyError" in msg and "custom_streams=True" in msg
    assert pub.streams == [] and pub.position_commands() == []  # nothing would be announced on REPLICATE


def test_custom_streams_declared_by_the_application_are_published() -> None:
    pub = Publisher("master", custom_streams=True)
    ls = LocalStream("fs_custom", "master")
    pub.add_stream("fs_custom", ls.source, 0)
    assert [c.stream_name for c in pub.position_commands()] == ["fs_custom"]


def test_allowed_streams_are_exactly_synapse_streams() -> None:
    """The allow-list is Synapse's own STREAMS_MAP (the oracle), no more, no less."""
    out = subprocess.run(
        [synapse_python(), "-c",
         "import json; from synapse.replication.tcp.streams import STREAMS_MAP; print(json.dumps(sorted(STREAMS_MAP)))"],
        capture_output=True, text=True, timeout=120, cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert sorted(SYNAPSE_STREAM_NAMES) == json.loads(out.stdout)


async def test_registry_streams_still_publish_over_tcp() -> None:
    pub = Publisher("master")
    ls = LocalStream("to_device", "master")
    pub.add_stream("to_device", ls.source, 0)
    ls.add_listener(pub.notify)
    server = await TcpServer(ReplicationHub("master", publisher=pub), "safe.hs").start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"NAME r1\nREPLICATE\n")
        await writer.drain()
        lines: list[str] = []
        while not any(x.startswith("POSITION") for x in lines):
            lines.append((await asyncio.wait_for(reader.readline(), 5)).decode().rstrip("\n"))
        ls.write([["@u:hs"]])
        while not any(x.startswith("RDATA") for x in lines):
            lines.append((await asyncio.wait_for(reader.readline(), 5)).decode().rstrip("\n"))
        writer.close()
        assert "POSITION to_device master 0 0" in lines
        assert 'RDATA to_device master 1 ["@u:hs"]' in lines
    finally:
        await server.stop()


@pytest.mark.redis
async def test_registry_streams_still_publish_over_redis(redis_url: str) -> None:
    import redis.asyncio as aioredis

    from factstream.transport.redis import RedisReplication

    channel = f"factstream-test-{uuid.uuid4().hex[:12]}"
    listener = aioredis.from_url(redis_url)
    sub = listener.pubsub()
    await sub.subscribe(channel)
    pub = Publisher("w1")
    ls = LocalStream("caches", "w1")
    pub.add_stream("caches", ls.source, 0)
    ls.add_listener(pub.notify)
    repl = await RedisReplication(ReplicationHub("w1", publisher=pub), redis_url, channel).start()
    try:
        await repl.wait_connected(10)
        ls.write([["get_user_by_id", ["@a:hs"], 1]])
        seen: list[str] = []
        async with asyncio.timeout(10):
            while not any(x.startswith("RDATA") for x in seen):
                msg = await sub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg:
                    seen.append(msg["data"].decode())
        assert "POSITION caches w1 0 0" in seen
        assert 'RDATA caches w1 1 ["get_user_by_id",["@a:hs"],1]' in seen
    finally:
        await repl.stop()
        await sub.aclose()
        await listener.aclose()


# ------------------------------------------------------------------ serve as any writer


def _produce(args: list[str], seconds: float = 1.0) -> tuple[dict[str, Any], str, int]:
    proc = subprocess.Popen(
        [FACTSTREAM, "serve", *args, "--instance-name", "fsw1", "--produce", "--duration", str(seconds),
         "--status", "--seed", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )
    produced: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["event"] == "produced":
                produced = msg
                break
    finally:
        _, err = stop(proc, timeout=20)
    return produced, err, proc.returncode


def test_serve_produce_as_any_writer_over_tcp(tmp_path: Any) -> None:
    produced, err, code = _produce(["--db", f"sqlite:///{tmp_path}/a.db", "--port", "0", "--server-name", "fsw.hs"])
    assert code == 0 and "IdGeneratorError" not in err, err
    assert produced and produced["facts"] > 0 and all(p > 1 for p in produced["positions"].values()), produced


@pytest.mark.redis
def test_serve_produce_as_any_writer_over_redis(tmp_path: Any, redis_url: str) -> None:
    channel = f"factstream-test-{uuid.uuid4().hex[:12]}"
    produced, err, code = _produce(["--db", f"sqlite:///{tmp_path}/a.db", "--redis", redis_url, "--server-name", channel])
    assert code == 0 and "IdGeneratorError" not in err, err
    assert produced and produced["facts"] > 0 and all(p > 1 for p in produced["positions"].values()), produced


@pytest.mark.postgres
def test_serve_produce_as_any_writer_on_postgres(postgres_dsn: str) -> None:
    produced, err, code = _produce(["--db", postgres_dsn, "--port", "0", "--server-name", "fsw.hs"])
    assert code == 0 and "IdGeneratorError" not in err, err
    assert produced and produced["facts"] > 0 and all(p > 1 for p in produced["positions"].values()), produced
