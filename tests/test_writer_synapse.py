"""A factstream writer on a real Synapse 1.163 deployment's Redis channel (the oracle venv).

A Synapse main process (SQLite, Redis enabled) runs against a private
redis-server. A factstream writer publishing Synapse's own streams on the
deployment's channel leaves Synapse's subscription alone; the same writer
publishing a stream Synapse does not know (only possible with
``custom_streams=True``) makes Synapse fail with ``KeyError`` and drop its
Redis connection: the reason the publisher refuses such streams by default.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factstream.replication import ForeignStreamError, LocalStream, Publisher, ReplicationHub
from factstream.streams import CachesRow
from factstream.transport.redis import RedisReplication

from conftest import require, synapse_python, terminate

pytestmark = pytest.mark.slow

SERVER_NAME = "fsoracle.test"

HS_YAML = """\
server_name: "{server_name}"
pid_file: {d}/homeserver.pid
listeners:
  - port: {http_port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {d}/homeserver.db
log_config: {d}/log.yaml
media_store_path: {d}/media_store
registration_shared_secret: "{secret}"
report_stats: false
macaroon_secret_key: "{secret}"
form_secret: "{secret}"
signing_key_path: {d}/signing.key
trusted_key_servers: []
redis:
  enabled: true
  host: 127.0.0.1
  port: {redis_port}
"""

LOG_YAML = """\
version: 1
formatters:
  precise:
    format: '%(asctime)s - %(name)s - %(levelname)s - %(message)s'
handlers:
  file:
    class: logging.FileHandler
    formatter: precise
    filename: {d}/homeserver.log
root:
  level: INFO
  handlers: [file]
disable_existing_loggers: false
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:g}s")


@pytest.fixture(scope="module")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A running Synapse main process on a private redis-server: {"redis_port", "log"}."""
    python = synapse_python()
    require(binary="redis-server", how="apt-get install redis-server (needed for a private Redis)")
    d = tmp_path_factory.mktemp("synapse")
    redis_port, http_port = _free_port(), _free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    hs: subprocess.Popen[bytes] | None = None
    try:
        _wait_port(redis_port, 10, redis, "redis-server")
        (d / "hs.yaml").write_text(HS_YAML.format(server_name=SERVER_NAME, d=d, http_port=http_port,
                                                  redis_port=redis_port, secret=uuid.uuid4().hex))
        (d / "log.yaml").write_text(LOG_YAML.format(d=d))
        subprocess.run([python, "-m", "synapse.app.homeserver", "-c", str(d / "hs.yaml"), "--generate-keys"],
                       check=True, capture_output=True, cwd=d, timeout=120)
        hs = subprocess.Popen([python, "-m", "synapse.app.homeserver", "-c", str(d / "hs.yaml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
        _wait_port(http_port, 120, hs, "Synapse")
        yield {"redis_port": redis_port, "log": d / "homeserver.log"}
    finally:
        if hs is not None:
            terminate(hs)
        terminate(redis)


def _synapse_subscribers(port: int) -> set[str]:
    """Redis client ids of the subscribed connections that are not factstream's."""
    import redis

    with redis.Redis(port=port) as r:
        return {str(c["id"]) for c in r.client_list()
                if int(c.get("sub", 0)) > 0 and not str(c.get("name", "")).startswith("factstream")}


def _key_errors(log: Path) -> int:
    return log.read_text(errors="replace").count("KeyError") if log.exists() else 0


async def _publish(port: int, stream: str, row: Any, *, custom: bool) -> None:
    pub = Publisher("fsw1", custom_streams=custom)
    ls = LocalStream(stream, "fsw1")
    pub.add_stream(stream, ls.source, 0)
    ls.add_listener(pub.notify)
    repl = await RedisReplication(ReplicationHub("fsw1", publisher=pub), f"redis://127.0.0.1:{port}",
                                  SERVER_NAME).start()
    try:
        await repl.wait_connected(10)
        for _ in range(5):
            ls.write([row])
            await asyncio.sleep(0.4)
        await asyncio.sleep(2.0)  # Synapse answers REPLICATE-triggered POSITIONs and any reconnect by now
    finally:
        await repl.stop()


async def _wait_subscribed(port: int, timeout: float = 30) -> set[str]:
    deadline = time.monotonic() + timeout
    while not (subs := _synapse_subscribers(port)):
        assert time.monotonic() < deadline, "Synapse never subscribed to its Redis channel"
        await asyncio.sleep(0.2)
    return subs


async def test_synapse_keeps_its_connection_when_factstream_publishes_synapse_streams(synapse: dict[str, Any]) -> None:
    port = synapse["redis_port"]
    before = await _wait_subscribed(port)
    errors = _key_errors(synapse["log"])
    await _publish(port, "caches", CachesRow("get_user_by_id", ["@u:fsoracle.test"], int(time.time() * 1000)),
                   custom=False)
    assert _synapse_subscribers(port) == before  # the same connection: never dropped
    assert _key_errors(synapse["log"]) == errors


async def test_a_stream_synapse_does_not_know_is_refused_because_it_breaks_synapse(synapse: dict[str, Any]) -> None:
    with pytest.raises(ForeignStreamError):
        Publisher("fsw1").add_stream("fs_custom", LocalStream("fs_custom", "fsw1").source, 0)
    # What the refusal prevents (declared the application's own channel, wrongly): Synapse drops its connection.
    port = synapse["redis_port"]
    before = await _wait_subscribed(port)
    errors = _key_errors(synapse["log"])
    await _publish(port, "fs_custom", ["x"], custom=True)
    assert _key_errors(synapse["log"]) > errors
    assert not before <= _synapse_subscribers(port)  # its subscription was dropped (and re-made)
