"""Replication over real sockets on 127.0.0.1, on stdlib asyncio and uvloop."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest

from factstream.commands import RemoteServerUpCommand
from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.replication import MemoryUpdateSource
from factstream.transport.tcp import (
    FetchError,
    FetchServer,
    RemoteUpdateSource,
    TcpClient,
    TcpServer,
    client_ssl_context,
    server_ssl_context,
)


BOTH_EVENT_LOOPS = True  # conftest runs every test here on asyncio and uvloop


class Raw:
    """A netcat-like client: raw lines in and out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def line(self, timeout: float = 2.0) -> str:
        return (await asyncio.wait_for(self.reader.readline(), timeout)).decode().rstrip("\n")

    async def until(self, prefix: str, timeout: float = 3.0) -> str:
        async def find() -> str:
            while True:
                line = await self.line(timeout)
                if line.startswith(prefix) or line == "":
                    return line

        return await asyncio.wait_for(find(), timeout)

    async def closed(self, timeout: float = 3.0) -> list[str]:
        lines = []
        while True:
            line = (await asyncio.wait_for(self.reader.readline(), timeout)).decode()
            if not line:
                self.close()
                return lines
            lines.append(line.rstrip("\n"))

    def close(self) -> None:
        self.writer.close()


def make_writer(name: str = "master", streams: tuple[str, ...] = ("to_device",)) -> tuple[ReplicationHub, dict[str, LocalStream]]:
    pub = Publisher(name)
    local = {}
    for s in streams:
        ls = LocalStream(s, name)
        pub.add_stream(s, ls.source, 0)
        ls.add_listener(pub.notify)
        local[s] = ls
    return ReplicationHub(name, publisher=pub), local


@pytest.fixture
async def writer() -> AsyncIterator[tuple[TcpServer, dict[str, LocalStream]]]:
    hub, local = make_writer()
    server = await TcpServer(hub, "hs.test", ping_interval=0.2, timeout=0.6).start()
    yield server, local
    await server.stop()


async def test_handshake_and_replicate_by_hand(writer: Any) -> None:
    server, local = writer
    local["to_device"].write([["@a:hs"]])
    raw = await Raw.connect(server.port)
    assert await raw.line() == "SERVER hs.test"
    assert (await raw.line()).startswith("PING ")
    raw.send(b"NAME reader.1\nPING 1\nREPLICATE\n")
    assert await raw.until("POSITION") == "POSITION to_device master 1 1"
    local["to_device"].write([["@b:hs"], ["@c:hs"]])
    assert await raw.until("RDATA") == 'RDATA to_device master batch ["@b:hs"]'
    assert await raw.line() == 'RDATA to_device master 2 ["@c:hs"]'
    raw.close()


async def test_no_rdata_before_replicate(writer: Any) -> None:
    server, local = writer
    raw = await Raw.connect(server.port)
    await raw.line()
    local["to_device"].write([["@a:hs"]])
    raw.send(b"REPLICATE\n")
    assert await raw.until("POSITION") == "POSITION to_device master 1 1"
    raw.close()


async def test_netcat_session_without_ping_is_not_timed_out_but_pinged(writer: Any) -> None:
    server, _ = writer
    raw = await Raw.connect(server.port)
    lines = [await raw.line() for _ in range(5)]  # SERVER, then PINGs every 0.2 s for ~0.8 s > timeout 0.6
    assert lines[0] == "SERVER hs.test"
    assert all(line.startswith("PING ") for line in lines[1:])
    raw.close()


async def test_keepalive_timeout_after_a_ping(writer: Any) -> None:
    server, _ = writer
    raw = await Raw.connect(server.port)
    raw.send(b"PING 1\n")
    lines = await raw.closed(timeout=3)
    assert lines[-1] == "ERROR no command received for 0.6s"


async def test_client_keeps_connection_alive_with_pings(writer: Any) -> None:
    server, _ = writer
    fol = Follower()
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port, ping_interval=0.2, timeout=0.6).start()
    await client.wait_connected(2)
    await asyncio.sleep(1.5)
    assert client.connects == 1 and client.connected
    await client.stop()


async def test_a_stall_of_our_own_loop_is_not_the_peers_silence(writer: Any) -> None:
    """A loop that stood still longer than the timeout (a long synchronous call, a paused process) closed its
    links at the next idle check, the peer's PINGs still unread in the socket (and here, both ends in one
    loop, unsent): under a loaded CI a 100,000-row burst did it to tests/test_tcp_flood.py. The stall is
    now taken off the silence: the link stays, as a link whose peer really goes quiet still closes (below)."""
    import time

    server, _ = writer
    client = await TcpClient(ReplicationHub("r", follower=Follower()), "127.0.0.1", server.port, ping_interval=0.2,
                             timeout=0.6).start()
    await client.wait_connected(2)
    await asyncio.sleep(0.3)
    time.sleep(1.5)  # the loop stands still for more than twice the timeout
    await asyncio.sleep(1.0)
    assert client.connects == 1 and client.connected
    await client.stop()


async def test_client_detects_a_dead_server_by_timeout() -> None:
    # A server that says hello and pings once, then goes silent.
    async def mute(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SERVER mute\nPING 1\n")
        try:
            await reader.read()
        finally:
            w.close()

    srv = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = await TcpClient(ReplicationHub("r", follower=Follower()), "127.0.0.1", port, ping_interval=0.1, timeout=0.4, backoff_initial=5).start()
    await client.wait_connected(2)
    conn = client.connection
    assert conn is not None
    assert await asyncio.wait_for(conn.closed, 3) == "timeout"
    await client.stop()
    srv.close()
    await srv.wait_closed()


async def test_wrong_server_name_is_refused_with_error() -> None:
    received: list[bytes] = []
    done = asyncio.Event()

    async def impostor(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SERVER impostor.example\nPING 1\n")
        received.append(await reader.read(4096))
        while not done.is_set():
            data = await reader.read(4096)
            if not data:
                done.set()
                break
            received.append(data)
        w.close()

    srv = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = await TcpClient(
        ReplicationHub("r", follower=Follower()), "127.0.0.1", port, expected_server_name="hs.test", backoff_initial=5
    ).start()
    await asyncio.wait_for(done.wait(), 3)
    text = b"".join(received).decode()
    assert "ERROR wrong server name: expected 'hs.test', got 'impostor.example'" in text
    assert client.connection is None
    await client.stop()
    srv.close()
    await srv.wait_closed()


@pytest.mark.parametrize(
    "data, error",
    [
        (b"BOGUS stuff\n", "ERROR invalid line: "),
        (b"RDATA to_device master 5 [\"x\"]\n", "ERROR RDATA is not a command a client may send"),
        (b"SERVER evil\n", "ERROR SERVER is not a command a client may send"),
        (b"PING \xff\xfe\n", "ERROR invalid line: "),
        (b"PING " + b"1" * 20000 + b"\n", "ERROR invalid line: "),
        (b"POSITION a b c d\n", "ERROR "),
    ],
    ids=["unknown", "rdata", "server", "non-utf8", "too-long", "bad-args"],
)
async def test_invalid_input_gets_error_and_close_and_server_survives(writer: Any, data: bytes, error: str) -> None:
    server, _ = writer
    raw = await Raw.connect(server.port)
    raw.send(b"PING 1\n" + data)
    lines = await raw.closed()
    assert lines[-1].startswith(error), lines[-1]
    # The server is still serving.
    again = await Raw.connect(server.port)
    assert await again.line() == "SERVER hs.test"
    again.close()


async def _client_of_one_connection(script: bytes, *, server_closes: bool) -> TcpClient:
    """A TcpClient after one connection to a server that sends ``script``, then closes the connection
    (``server_closes``) or waits for the client to."""

    async def serve(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(script)
        await w.drain()
        if not server_closes:
            await reader.read()
        w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = await TcpClient(ReplicationHub("r", follower=Follower()), "127.0.0.1", port, backoff_initial=5).start()
    try:
        for _ in range(300):
            await asyncio.sleep(0.01)
            if client.close_reasons:
                break
    finally:
        await client.stop()
        srv.close()
        await srv.wait_closed()
    return client


async def test_a_client_stopped_while_connecting_leaves_nothing_behind(caplog: pytest.LogCaptureFixture) -> None:
    """stop() at every moment of a connect: it returns at once, no connection outlives it (on the server
    no reader is left), and nothing is written to a closed transport. (On uvloop a stop that landed as
    the connect completed left the connection open until its timeout, and a queued flush raised
    'the handler is closed' in a callback; asyncio's wait_for can also lose the cancel then.)"""
    hub, _ = make_writer()
    server = await TcpServer(hub, "hs.test").start()
    try:
        for spins in range(60):
            client = await TcpClient(ReplicationHub("r"), "127.0.0.1", server.port, client_name="r").start()
            for _ in range(spins):
                await asyncio.sleep(0)
            await asyncio.wait_for(client.stop(), 5)
            assert not client.connected
        for _ in range(100):
            if not server.connections:
                break
            await asyncio.sleep(0.05)
        assert not server.connections
    finally:
        await server.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_invalid_direction_on_the_client_side() -> None:
    client = await _client_of_one_connection(b"SERVER x\nREPLICATE\n", server_closes=False)
    assert list(client.close_reasons) == ["direction"]


async def test_the_client_keeps_what_the_server_said_before_closing() -> None:
    """A writer says why it drops a reader (ERROR, then close): the client keeps it beside the close reason."""
    client = await _client_of_one_connection(
        b"SERVER x\nERROR client fell behind: more than 10 commands buffered\n", server_closes=True
    )
    assert list(client.server_errors) == ["client fell behind: more than 10 commands buffered"]
    assert len(client.close_reasons) == 1


async def test_slow_reader_is_disconnected_and_memory_stays_bounded(writer: Any) -> None:
    server, local = writer
    raw = await Raw.connect(server.port)
    raw.send(b"REPLICATE\n")  # and then never read again
    await asyncio.sleep(0.1)
    (conn,) = server.connections
    conn.max_buffered = 500
    peak = 0
    row = [["@" + "x" * 200 + ":hs"]]
    for i in range(200_000):
        local["to_device"].write(row)
        peak = max(peak, conn.buffered)
        if not conn.connected:
            break
        if i % 1000 == 0:
            await asyncio.sleep(0)
    assert not conn.connected, "a reader that never reads must be disconnected"
    assert peak <= 501
    await asyncio.wait_for(conn.closed, 5)
    assert server.connections == set()
    raw.close()


async def test_reconnect_with_catch_up_across_several_pages(writer: Any) -> None:
    server, local = writer
    ls = local["to_device"]
    fol = Follower(sources={"to_device": ls.source}, start_position=0, page_limit=7)
    got: list[int] = []
    fol.add_handler(lambda s, w, t, rows: got.append(t))
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port, backoff_initial=0.01).start()
    await client.wait_connected(2)
    ls.write([["@a"]])
    await fol.wait_for_position("to_device", "master", 1, 2)
    for conn in list(server.connections):
        conn.close("kicked by test")
    for i in range(40):  # written while the reader is away
        t = ls.reserve()
        ls.complete(t, None if i % 5 == 0 else [[f"@u{i}"]])
    await fol.wait_for_position("to_device", "master", 41, 5)
    assert client.connects == 2
    expected = [1] + [i + 2 for i in range(40) if i % 5 != 0]
    assert got == expected
    assert fol.stats["catchup_fetches"] >= 5
    await client.stop()


async def test_writer_restart(unused_tcp_port: int) -> None:
    source = MemoryUpdateSource()  # stands for the database both writer incarnations share
    hub, local = make_writer()
    ls = local["to_device"]
    ls.source = source
    hub.publisher._streams["to_device"].source = source  # type: ignore[union-attr]
    hub.publisher._streams["to_device"].sync_get = source.get_updates_now  # type: ignore[union-attr]
    server = await TcpServer(hub, "hs", port=unused_tcp_port).start()
    fol = Follower(sources={"to_device": source}, start_position=0)
    got: list[int] = []
    fol.add_handler(lambda s, w, t, rows: got.append(t))
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", unused_tcp_port, backoff_initial=0.05, backoff_max=0.2).start()
    for _ in range(3):
        ls.write([["@x"]])
    await fol.wait_for_position("to_device", "master", 3, 3)
    await server.stop()
    # The writer restarts from the shared store at position 3 and writes more while the reader is away.
    pub2 = Publisher("master")
    ls2 = LocalStream("to_device", "master", start=3, source=source)
    pub2.add_stream("to_device", source, 3)
    ls2.add_listener(pub2.notify)
    for _ in range(4):
        ls2.write([["@y"]])
    server2 = await TcpServer(ReplicationHub("master", publisher=pub2), "hs", port=unused_tcp_port).start()
    ls2.write([["@z"]])
    await fol.wait_for_position("to_device", "master", 8, 5)
    assert got == list(range(1, 9))
    await client.stop()
    await server2.stop()


async def test_user_sync_and_shared_commands_over_tcp(writer: Any) -> None:
    server, local = writer
    whub: ReplicationHub = server.sink
    ups: list[Any] = []
    whub.on("REMOTE_SERVER_UP", lambda cmd, conn: ups.append(cmd))
    rhub = ReplicationHub("reader1", follower=Follower())
    rhub.user_sync("@a:hs", "D", True, 5)  # queued until connected
    client = await TcpClient(rhub, "127.0.0.1", server.port, client_name="reader1", backoff_initial=0.01).start()
    await client.wait_connected(2)
    rhub.send(RemoteServerUpCommand("remote.example"))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if ups and whub.syncing_users():
            break
    assert whub.syncing_users() == {"reader1": {("@a:hs", "D")}}
    assert ups == [RemoteServerUpCommand("remote.example")]
    (conn,) = server.connections
    assert conn.peer_name == "reader1"
    conn.close("bye")
    await asyncio.sleep(0.05)
    for _ in range(100):  # the reader reconnects and re-announces its syncing users
        await asyncio.sleep(0.01)
        if whub.syncing_users():
            break
    assert whub.syncing_users() == {"reader1": {("@a:hs", "D")}}
    await client.stop()


async def test_in_memory_stream_catch_up_from_the_writer(writer: Any) -> None:
    server, _ = writer
    hub, local = make_writer(streams=("typing",))
    server2 = await TcpServer(hub, "hs2").start()
    fetch = await FetchServer({"typing": local["typing"].source}).start()
    for i in range(10):
        local["typing"].write([["!r:hs", [f"@u{i}:hs"]]])
    fol = Follower(sources={"typing": RemoteUpdateSource("typing", "127.0.0.1", fetch.port)}, start_position=0, page_limit=3)
    got: list[Any] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, rows[0].user_ids)))
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server2.port).start()
    await fol.wait_for_position("typing", "master", 10, 3)
    assert got == [(i + 1, [f"@u{i}:hs"]) for i in range(10)]
    await client.stop()
    await server2.stop()
    await fetch.stop()


async def test_fetch_failures_are_fetch_errors_naming_the_writer() -> None:
    """Nothing listening, a port that never answers, an answer that is not one: each a FetchError with the address."""
    import socket

    with socket.socket() as s:  # a port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(FetchError, match=f"127.0.0.1:{free}"):
        await RemoteUpdateSource("typing", "127.0.0.1", free, timeout=2).get_updates("master", 0, 5, 10)

    answers: list[bytes] = []
    done = asyncio.Event()
    handlers: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readline()
        if answers:
            writer.write(answers.pop(0))
            await writer.drain()
        else:
            await done.wait()  # holds the request unanswered
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    source = RemoteUpdateSource("typing", "127.0.0.1", port, timeout=0.3)
    try:
        with pytest.raises(FetchError, match=rf"127.0.0.1:{port} did not answer a typing fetch within 0.3s"):
            await source.get_updates("master", 0, 5, 10)
        for garbage in (b"<html>\n", b'{"updates": 3}\n', b"[1, 2]\n", b"\xff\xfe\n"):
            answers.append(garbage)
            with pytest.raises(FetchError, match="not a fetch answer"):
                await source.get_updates("master", 0, 5, 10)
        answers.append(b"")  # closed without a word
        with pytest.raises(FetchError, match="without an answer"):
            await source.get_updates("master", 0, 5, 10)
    finally:
        done.set()
        await asyncio.gather(*handlers, return_exceptions=True)
        server.close()
        await server.wait_closed()
    for bad in ({"port": 70000}, {"port": -1}, {"timeout": 0}, {"timeout": float("nan")}):
        with pytest.raises(ValueError):
            RemoteUpdateSource("typing", "127.0.0.1", **{"port": 1, **bad})
    with pytest.raises(ValueError, match="max_limit"):
        FetchServer({}, max_limit=0)


async def test_tls_with_verification(tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    hub, local = make_writer()
    server = await TcpServer(hub, "hs", ssl=server_ssl_context(cert, key)).start()
    local["to_device"].write([["@secret:hs"]])
    fol = Follower(sources={"to_device": local["to_device"].source}, start_position=0)
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port,
                             ssl=client_ssl_context(cert), server_hostname="localhost").start()
    await fol.wait_for_position("to_device", "master", 1, 5)
    await client.stop()
    # Without the CA the default context refuses the self-signed certificate.
    untrusting = await TcpClient(ReplicationHub("r2", follower=Follower()), "127.0.0.1", server.port,
                                 ssl=client_ssl_context(), server_hostname="localhost", backoff_initial=5).start()
    await asyncio.sleep(0.5)
    assert untrusting.connects == 0
    await untrusting.stop()
    await server.stop()


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_ = os


async def test_server_survives_random_garbage(writer: Any) -> None:
    import random

    server, local = writer
    rng = random.Random(5)
    for _ in range(25):
        raw = await Raw.connect(server.port)
        chunks = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) for _ in range(rng.randint(1, 5))]
        for c in chunks:
            raw.send(c + (b"\n" if rng.random() < 0.5 else b""))
        raw.close()
    fol = Follower(sources={"to_device": local["to_device"].source}, start_position=0)
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port).start()
    local["to_device"].write([["@still-alive:hs"]])
    await fol.wait_for_position("to_device", "master", 1, 5)
    await client.stop()


def test_backoff_is_exponential_capped_and_jittered() -> None:
    client = TcpClient(ReplicationHub("r"), "127.0.0.1", 1, backoff_initial=0.1, backoff_max=2.0)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (40, 2.0)]:
        delays = {client.next_delay(attempt) for _ in range(50)}
        assert all(base * 0.5 <= d <= base for d in delays)
        assert len(delays) > 1  # jitter


async def test_reader_of_two_writers_gets_each_writers_batches_in_order() -> None:
    hubs = {}
    servers = {}
    for name in ("w1", "w2"):
        pub = Publisher(name)
        ls = LocalStream("caches", name)
        pub.add_stream("caches", ls.source, 0)
        ls.add_listener(pub.notify)
        hubs[name] = ls
        servers[name] = await TcpServer(ReplicationHub(name, publisher=pub), f"{name}.hs").start()
    fol = Follower(typed=False, start_position=0)
    got: list[tuple[str, int, int]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((w, t, len(rows))))
    rhub = ReplicationHub("r", follower=fol)
    clients = [await TcpClient(rhub, "127.0.0.1", servers[n].port).start() for n in ("w1", "w2")]
    for c in clients:
        await c.wait_connected(3)
    while len(rhub.connections) < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    for i in range(30):
        for name, ls in hubs.items():
            ls.write([["c", [f"{name}-{i}-{j}"], 0] for j in range(1 + i % 3)])
    for name in hubs:
        await fol.wait_for_position("caches", name, 30, 5)
    for name in hubs:
        mine = [(t, n) for w, t, n in got if w == name]
        assert mine == [(i + 1, 1 + i % 3) for i in range(30)]
    for c in clients:
        await c.stop()
    for s in servers.values():
        await s.stop()


async def test_client_drops_duplicate_and_stale_rdata_from_the_wire() -> None:
    async def scripted(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            b"SERVER s\nPING 1\nPOSITION to_device m 2 2\n"
            b'RDATA to_device m 1 ["@old"]\n'
            b'RDATA to_device m 3 ["@a"]\n'
            b'RDATA to_device m 3 ["@dup"]\n'
            b'RDATA to_device m batch ["@b1"]\n'
            b'RDATA to_device m 4 ["@b2"]\n'
            b'RDATA to_device m 2 ["@stale"]\n'
            b"POSITION to_device m 4 6\n"
        )
        try:
            await reader.read()
        finally:
            w.close()

    srv = await asyncio.start_server(scripted, "127.0.0.1", 0)
    fol = Follower(typed=False, positions={("to_device", "m"): 2})
    got: list[tuple[int, list[Any]]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, rows)))
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", srv.sockets[0].getsockname()[1]).start()
    await fol.wait_for_position("to_device", "m", 6, 3)
    assert got == [(3, [["@a"]]), (4, [["@b1"], ["@b2"]])]
    assert fol.stats["stale_rows"] == 3
    await client.stop()
    srv.close()
    await srv.wait_closed()


@pytest.mark.parametrize("forward", [None, False])
async def test_shared_commands_are_forwarded_to_other_readers_and_server_ends_never_send_client_commands(
    forward: bool | None,
) -> None:
    from factstream.commands import LockReleasedCommand

    pub = Publisher("master")
    ls = LocalStream("caches", "master")
    pub.add_stream("caches", ls.source, 0)
    ls.add_listener(pub.notify)
    # A writer hub that also follows (and has a syncing user): it must still never send REPLICATE/USER_SYNC as a server.
    whub = ReplicationHub("master", publisher=pub, follower=Follower(), forward=forward)
    whub.user_sync("@master-user:hs", None, True, 1)
    server = await TcpServer(whub, "hs").start()
    heard: dict[str, list[Any]] = {"a": [], "b": []}
    hubs = {}
    clients = []
    for name in ("a", "b"):
        hubs[name] = ReplicationHub(name, follower=Follower())
        hubs[name].on("REMOTE_SERVER_UP", lambda cmd, conn, n=name: heard[n].append(cmd))
        hubs[name].on("LOCK_RELEASED", lambda cmd, conn, n=name: heard[n].append(cmd))
        clients.append(await TcpClient(hubs[name], "127.0.0.1", server.port).start())
    for c in clients:
        await c.wait_connected(3)
    while len(whub.connections) < 2:
        await asyncio.sleep(0.01)
    hubs["a"].send(RemoteServerUpCommand("back.example"))
    hubs["a"].send(LockReleasedCommand("a", "lock", "key"))
    for _ in range(200 if forward is None else 30):
        await asyncio.sleep(0.01)
        if len(heard["b"]) == 2:
            break
    if forward is None:  # a writer hub forwards by default, as Synapse's master does
        assert heard["b"] == [RemoteServerUpCommand("back.example"), LockReleasedCommand("a", "lock", "key")]
    else:
        assert heard["b"] == []
    assert heard["a"] == []
    assert all(c.close_reasons == type(c.close_reasons)() for c in clients)  # nobody was disconnected for direction
    for c in clients:
        await c.stop()
    await server.stop()


def test_the_old_relay_keyword_of_the_hub_still_works_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match="forward="):
        hub = ReplicationHub("master", publisher=Publisher("master"), relay=False)
    assert hub.forward is False


async def test_connection_closed_before_it_is_set_up_is_dropped_not_served() -> None:
    # A server stopping while a peer is connecting closes a connection whose
    # transport has not arrived yet; when it arrives it must be dropped at once,
    # or it would be served after the stop and keep the listener from closing.
    hub = ReplicationHub("master")
    server = await TcpServer(hub, "early.hs").start()
    conn = server._protocol()  # what the listener creates for an incoming peer
    assert conn not in server.connections  # a reader only once its connection is made
    conn.close("server stopping")
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # EOF: the early-closed connection drops the link at once
        writer.close()

    sink = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = sink.sockets[0].getsockname()[1]
    await asyncio.get_running_loop().create_connection(lambda: conn, "127.0.0.1", port)
    reason = await asyncio.wait_for(asyncio.shield(conn.closed), 2)
    assert reason and not conn.connected
    assert conn not in server.connections and not hub.connections
    await asyncio.wait_for(server.stop(), 5)
    sink.close()
    await asyncio.sleep(0.05)  # let the peer handler see EOF and close its side


async def test_end_to_end_on_each_relay_twin(relay_impl: ModuleType) -> None:
    """Writer and reader on the relay twin under test: single rows, batches, holes, catch-up, in order."""
    src = MemoryUpdateSource(relay=relay_impl)
    ls = LocalStream("to_device", "master", source=src)
    pub = Publisher("master", relay=relay_impl)
    pub.add_stream("to_device", src, 0)
    ls.add_listener(pub.notify)
    server = await TcpServer(ReplicationHub("master", publisher=pub), "hs.test", relay=relay_impl).start()
    fol = Follower(typed=False, start_position=0, sources={"to_device": src}, relay=relay_impl)
    got: list[tuple[int, list[Any]]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, rows)))
    expected = {ls.write([["@early"]]): [["@early"]]}  # before the reader connects: caught up
    client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port, relay=relay_impl).start()
    try:
        for i in range(600):
            if i % 7 == 0:
                ls.complete(ls.reserve(), None)  # a rolled-back fact: a hole
                continue
            rows = [[f"@{i}-{j}"] for j in range(3 if i % 5 == 0 else 1)]
            expected[ls.write(rows)] = rows
            if i % 100 == 0:
                await asyncio.sleep(0.01)
        await fol.wait_for_position("to_device", "master", ls.current_token(), timeout=10)
        assert got == sorted(expected.items())
        assert fol.stats["catchup_rows"] >= 1  # at least the fact written before it connected
    finally:
        await client.stop()
        await server.stop()


async def test_write_many_and_single_sends_interleave_in_order_on_each_relay_twin(relay_impl: ModuleType) -> None:
    """Runs of facts (write_many), single writes and the hub's own sends on one link: all arrive, in order.

    The relay's Broadcast appends straight to the link's queue of the turn
    (``send_queue``) while the hub's sends go through ``send_many``: both
    must land in the same order they were made.
    """
    src = MemoryUpdateSource(relay=relay_impl)
    ls = LocalStream("to_device", "master", source=src)
    pub = Publisher("master", relay=relay_impl, page_limit=50)
    pub.add_stream("to_device", src, 0)
    ls.add_listener(pub.notify)
    hub = ReplicationHub("master", publisher=pub)
    server = await TcpServer(hub, "hs.test", relay=relay_impl).start()
    fol = Follower(typed=False, start_position=0, sources={"to_device": src}, relay=relay_impl)
    got: list[tuple[int, list[Any]]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, rows)))
    reader_hub = ReplicationHub("r", follower=fol)
    seen_up: list[tuple[str, int]] = []
    reader_hub.on("REMOTE_SERVER_UP", lambda cmd, conn: seen_up.append((cmd.data, len(got))))  # type: ignore[attr-defined]
    client = await TcpClient(reader_hub, "127.0.0.1", server.port, relay=relay_impl).start()
    try:
        while not hub._replicating:
            await asyncio.sleep(0.005)
        expected: dict[int, list[Any]] = {}
        sent_up: list[tuple[str, int]] = []
        for turn in range(20):
            facts = [[[f"@{turn}-{i}-{j}"] for j in range(i % 3)] for i in range(120)]  # i % 3 == 0: a hole
            first = ls.current_token() + 1
            ls.write_many(facts)
            expected.update({first + i: rows for i, rows in enumerate(facts) if rows})
            hub.send(RemoteServerUpCommand(f"up{turn}"))  # after this turn's rows, before the next ones
            sent_up.append((f"up{turn}", len(expected)))
            expected[ls.write([[f"@single{turn}"]])] = [[f"@single{turn}"]]
            await asyncio.sleep(0)
        await fol.wait_for_position("to_device", "master", ls.current_token(), timeout=10)
        for _ in range(200):
            if len(seen_up) == len(sent_up):
                break
            await asyncio.sleep(0.01)
        assert got == sorted(expected.items())
        assert seen_up == sent_up  # each REMOTE_SERVER_UP came after exactly the facts written before it
    finally:
        await client.stop()
        await server.stop()


async def _raw_link(server: Any) -> tuple[Any, Any]:
    """A raw client connected to ``server``, past its SERVER line, and the server's end of that link."""
    raw = await Raw.connect(server.port)
    await raw.line()
    for _ in range(100):
        if server.connections:
            break
        await asyncio.sleep(0.01)
    (conn,) = server.connections
    return raw, conn


async def test_a_server_link_offers_its_send_queue_only_while_sending_is_appending(writer: Any) -> None:
    """``send_queue`` is the turn's queue once a write is scheduled, and None on flush, pause and close."""
    from factstream.commands import PositionCommand

    server, _ = writer
    raw, conn = await _raw_link(server)
    assert conn.send_queue is None
    conn.send_many([PositionCommand("to_device", "master", 1, 2)])
    queue = conn.send_queue
    assert type(queue) is list and len(queue) == 1
    queue.append(PositionCommand("to_device", "master", 2, 3))  # what a Broadcast does
    await raw.until("POSITION to_device master 1 2")
    assert await raw.line() == "POSITION to_device master 2 3"
    assert conn.send_queue is None  # flushed
    conn.send_many([PositionCommand("to_device", "master", 3, 4)])
    assert conn.send_queue is not None
    conn.pause_writing()
    assert conn.send_queue is None  # paused: sends are buffered, not appended to the turn's queue
    conn.resume_writing()
    conn.send_many([PositionCommand("to_device", "master", 4, 5)])
    assert await raw.line() == "POSITION to_device master 3 4"
    assert await raw.line() == "POSITION to_device master 4 5"
    conn.send_many([PositionCommand("to_device", "master", 5, 6)])
    conn.close("bye")
    assert conn.send_queue is None  # closing: nothing more goes out
    lines = await raw.closed()
    assert lines[-1].startswith("ERROR") and not any("5 6" in line for line in lines)


async def test_a_server_link_walks_its_states(writer: Any) -> None:
    """OPEN until the reader says NAME, READY after, CLOSED once gone; a link never counted twice."""
    from factstream.transport.tcp import ConnState, ServerConnection

    server, _ = writer
    raw, conn = await _raw_link(server)
    assert isinstance(conn, ServerConnection) and conn.state is ConnState.OPEN and not conn.handshake_done
    raw.send(b"NAME reader.states\n")
    for _ in range(100):
        if conn.state is ConnState.READY:
            break
        await asyncio.sleep(0.01)
    assert conn.state is ConnState.READY and conn.handshake_done and conn.peer_name == "reader.states"
    conn.close("bye")
    assert conn.state is ConnState.CLOSING and not conn.connected
    assert await asyncio.wait_for(asyncio.shield(conn.closed), 3) == "closed"
    assert conn.state is ConnState.CLOSED and conn.handshake_done  # still says the handshake had happened
    raw.close()


async def test_a_client_link_refusing_a_wrong_server_never_becomes_ready(writer: Any) -> None:
    server, _ = writer
    hub = ReplicationHub("reader.x")
    client = await TcpClient(hub, "127.0.0.1", server.port, client_name="reader.x", expected_server_name="not.hs").start()
    try:
        for _ in range(300):
            if client.close_reasons:
                break
            await asyncio.sleep(0.01)
        assert client.close_reasons[0] == "server_name"
    finally:
        await client.stop()


@pytest.mark.parametrize("kwargs, says", [
    ({"ping_interval": 0}, "ping_interval must be > 0 seconds, got 0"),
    ({"timeout": -1}, "timeout must be > 0 seconds, got -1"),
    ({"max_buffered": 0}, "max_buffered must be at least 1, got 0"),
    ({"max_line_length": 2.5}, "max_line_length must be a whole number, got float 2.5"),
    ({"port": 70000}, "port must be 0-65535, got 70000"),
])
def test_link_options_a_connection_cannot_mean_are_refused_at_construction(kwargs: dict, says: str) -> None:
    """A keepalive every 0 s would spin, a buffer of 0 commands drop every reader, port 70000 bind another:
    refused when the server or client is made, not when the first connection comes."""
    from factstream.replication import ReplicationHub

    with pytest.raises((ValueError, TypeError), match=re.escape(says)):
        TcpServer(ReplicationHub("w"), "hs", **kwargs)
    client_kwargs = {k: v for k, v in kwargs.items() if k != "port"}
    with pytest.raises((ValueError, TypeError), match=re.escape(says)):
        TcpClient(ReplicationHub("r"), "127.0.0.1", kwargs.get("port", 9092), **client_kwargs)
    with pytest.raises(ValueError, match=re.escape("backoff_initial (5) must not be above backoff_max (1)")):
        TcpClient(ReplicationHub("r"), "127.0.0.1", 9092, backoff_initial=5, backoff_max=1)
