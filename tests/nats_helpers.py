"""Shared pieces of the NATS JetStream tests: the shared server, private servers and clusters, nodes.

The shared server (127.0.0.1:4222) gets a fresh deployment name per test and
its stream is deleted afterwards. Private servers and clusters are started
from the ``nats-server`` binary on free loopback ports with their own store
directories, and only those processes are ever stopped or killed. Writer and
Reader add a JetStream link (``.nats``) to the carrier-neutral ones of
:mod:`replication_helpers`, whose helpers (start_all, settle, ...) are
re-exported here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import replication_helpers
from conftest import IN_CI, require_service
from factstream.replication import MemoryUpdateSource
from factstream.transport.nats import JetStreamLayout, NatsReplication
from replication_helpers import (  # the NATS tests import these from here
    STREAM as STREAM,
    assert_exact as assert_exact,
    random_fact as random_fact,
    settle as settle,
    start_all as start_all,
    stop_all as stop_all,
)

NATS_SERVER = shutil.which("nats-server")
SHARED_URL = "nats://127.0.0.1:4222"
FAST: dict[str, Any] = dict(ack_timeout=1.0, heartbeat=0.5, consumer_heartbeat=0.25, connect_timeout=1.0,
                            api_timeout=2.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def nats_url() -> str:
    """The shared JetStream server (skips, or fails under CI=true, when it is down)."""
    require_service("NATS JetStream", "127.0.0.1", 4222, "nats-server -js -p 4222")
    return SHARED_URL


async def delete_stream(url: str, server_name: str) -> None:
    import nats

    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        try:
            await nc.jetstream().delete_stream(JetStreamLayout.for_server(server_name).stream)
        except Exception:  # noqa: BLE001 - the test may have failed before creating it
            pass
    finally:
        await nc.close()


@pytest.fixture
def deployment(nats_url: str) -> Iterator[str]:
    """A server name unique to this test; its JetStream stream on the shared server is deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    asyncio.run(delete_stream(nats_url, name))


def require_nats_server() -> str:
    if NATS_SERVER is None:
        msg = "the nats-server binary is not on PATH"
        if IN_CI:
            pytest.fail(msg + " (CI=true: a missing tool is a failure)")
        pytest.skip(msg)
    return NATS_SERVER


class NatsServer:
    """A private nats-server with JetStream (optionally one node of a cluster) on loopback."""

    def __init__(self, store: Path, port: int | None = None, *, name: str = "n1", cluster_port: int | None = None,
                 routes: list[int] | None = None, cluster_name: str = "fs") -> None:
        self.binary = require_nats_server()
        self.store = store
        self.port = port or free_port()
        self.name = name
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.cluster_name = cluster_name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store),
                "-n", self.name]
        if self.cluster_port is not None:
            argv += ["--cluster_name", self.cluster_name, "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)]
        return argv

    def start(self, wait: bool = True) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        log = open(self.store.parent / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log)
        log.close()
        if wait:
            self.wait_listening()

    def wait_listening(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, f"nats-server {self.name} exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nats-server {self.name} not listening on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """Three JetStream nodes routed to each other on loopback."""

    def __init__(self, root: Path, size: int = 3) -> None:
        cports = [free_port() for _ in range(size)]
        self.nodes = [
            NatsServer(root / f"n{i + 1}", name=f"n{i + 1}", cluster_port=cports[i],
                       routes=[p for j, p in enumerate(cports) if j != i])
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self) -> None:
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_listening()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class Writer(replication_helpers.Writer):
    """One writer instance: a LocalStream over the shared source, its publisher, hub and JetStream link."""

    def __init__(self, name: str, url: str, server_name: str, source: MemoryUpdateSource, *,
                 start_token: int = 0, **options: Any) -> None:
        super().__init__(name, source, start_token=start_token)
        self.nats = NatsReplication(self.hub, url, server_name, **{**FAST, **options})

    @property
    def link(self) -> NatsReplication:
        return self.nats


class CountingSource:
    """A real update source that counts the queries made of it (the 'database' of a reader)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queries = 0

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Any:
        self.queries += 1
        return await self.inner.get_updates(instance_name, from_token, upto_token, limit)


class Reader(replication_helpers.Reader):
    """One reader instance whose follower catches up from the shared source only when it must."""

    def __init__(self, name: str, url: str, server_name: str, source: Any, *,
                 positions: dict[tuple[str, str], int] | None = None, start_position: int | None = 0,
                 got: dict[str, list[tuple[int, list[Any]]]] | None = None, **options: Any) -> None:
        super().__init__(name, CountingSource(source), positions=positions, start_position=start_position, got=got)
        self.nats = NatsReplication(self.hub, url, server_name, **{**FAST, **options})

    @property
    def link(self) -> NatsReplication:
        return self.nats


@asynccontextmanager
async def writer_and_reader(url: str, server_name: str, **writer_options: Any) -> AsyncIterator[tuple[Writer, Reader]]:
    """Writer ``w1`` and reader ``r1`` over a fresh shared source, started; both stopped on the way out."""
    source = MemoryUpdateSource()
    writer = Writer("w1", url, server_name, source, **writer_options)
    reader = Reader("r1", url, server_name, source)
    await start_all([writer, reader])
    try:
        yield writer, reader
    finally:
        await stop_all([writer, reader])


def run_loop(loop_name: str, coro: Awaitable[Any], timeout: float = 90.0) -> Any:
    """Run ``coro`` on a fresh stdlib or uvloop loop with an overall timeout."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop

    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(bounded())


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}
