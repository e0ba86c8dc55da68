"""The TCP writer under broken or hostile readers, on asyncio and uvloop.

What a server operator sees: a reader that stops reading is dropped even if
it never PINGs (it held what was queued for it forever), a dropped reader
leaves no traceback in the log, a client sending a command only a server may
send is logged naming it, a TLS client on a plaintext listener and a
plaintext client on a TLS one are told apart from garbage and logged as
WARNING, and a flood of refused clients is a few log lines, not one each.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from factstream.replication import LocalStream, Publisher, ReplicationHub
from factstream.transport import tcp_connection
from factstream.transport.tcp import TcpServer, server_ssl_context

BOTH_EVENT_LOOPS = True
LOGGER = "factstream.transport.tcp"


def _writer(streams: tuple[str, ...] = ("to_device", "caches", "receipts")) -> tuple[ReplicationHub, dict[str, LocalStream]]:
    pub = Publisher("master")
    local = {}
    for name in streams:
        ls = LocalStream(name, "master")
        pub.add_stream(name, ls.source, 0)
        ls.add_listener(pub.notify)
        local[name] = ls
    return ReplicationHub("master", publisher=pub), local


@pytest.fixture(autouse=True)
def _fresh_log_limiter() -> Iterator[None]:
    """Each test starts with the whole burst of refused-peer lines (another test may have spent it)."""
    lim = tcp_connection.PEER_ERRORS
    saved = (lim.burst, lim.window)
    lim._start, lim._count, lim.suppressed = -float("inf"), 0, 0
    yield
    lim.burst, lim.window = saved
    lim._start, lim._count, lim.suppressed = -float("inf"), 0, 0
    if lim._summary is not None:
        lim._summary.cancel()
        lim._summary = None


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler (a traceback in a writer's log)."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    yield seen
    loop.set_exception_handler(None)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


async def _until(cond: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_reader_that_stops_reading_is_dropped_even_if_it_never_pings(caplog: pytest.LogCaptureFixture) -> None:
    """It asked REPLICATE many times, then neither read nor wrote: the answers sat in the writer's memory for
    good (never a PING, so never timed out; no rows flowing, so never over max_buffered)."""
    caplog.set_level(logging.WARNING, LOGGER)
    hub, _ = _writer()
    server = await TcpServer(hub, "hs.test", ping_interval=0.3, timeout=1.0, max_buffered=10_000_000).start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"REPLICATE\n" * 100_000)  # 1 MB in, about 3 MB of POSITION out
        await _until(lambda: any(c._paused for c in server.connections), 10, "the socket to back up")
        (conn,) = server.connections
        reason = await asyncio.wait_for(asyncio.shield(conn.closed), 6)
        assert reason == "congestion"
        assert server.connections == set()
        (line,) = [m for m in _warnings(caplog) if "has read nothing" in m]
        assert "tcp from 127.0.0.1:" in line and "disconnecting it" in line
    finally:
        sock.close()
        await server.stop()


async def test_a_dropped_reader_that_reads_the_rest_leaves_no_traceback(
    caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """A reader dropped for falling behind that then reads what was queued: the transport closes by itself,
    and the abort scheduled for readers that never read must not run on it (stdlib asyncio logged
    'Exception in callback _SelectorTransport.abort()' with a traceback, once per dropped reader)."""
    caplog.set_level(logging.WARNING, LOGGER)
    hub, local = _writer(("to_device",))
    server = await TcpServer(hub, "hs.test", max_buffered=200).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"NAME slow\nREPLICATE\n")
        await _until(lambda: len(server.connections) == 1 and hub.connections, 5, "the reader to replicate")
        (conn,) = server.connections
        reader._transport.pause_reading()  # type: ignore[attr-defined]  # stop reading: the socket backs up
        row = [["@" + "x" * 2000 + ":hs"]]
        for i in range(20_000):
            local["to_device"].write(row)
            if not conn.connected:
                break
            if i % 50 == 0:
                await asyncio.sleep(0)
        assert not conn.connected, "the reader should have been dropped for falling behind"
        reader._transport.resume_reading()  # type: ignore[attr-defined]  # now read everything that was queued
        got = 0
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
            got += len(chunk)
        assert got > 1_000_000
        await asyncio.sleep(tcp_connection._ABORT_GRACE + 0.5)  # past the scheduled abort
        assert loop_errors == []
        assert any("slow" in m and "fell behind" in m for m in _warnings(caplog))
    finally:
        writer.close()
        await server.stop()


async def test_a_client_sending_a_server_command_is_logged_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    hub, _ = _writer()
    server = await TcpServer(hub, "hs.test").start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"NAME confused\nPOSITION to_device master 1 1\n")
        data = await asyncio.wait_for(reader.read(), 5)
        assert data.endswith(b"ERROR POSITION is not a command a client may send\n")
        (line,) = _warnings(caplog)
        port = writer.get_extra_info("sockname")[1]
        assert line == f"tcp from 127.0.0.1:{port} (confused) sent POSITION, which a client may not send; closing"
    finally:
        writer.close()
        await server.stop()


async def test_a_flood_of_refused_clients_is_a_few_log_lines_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    """200 clients each sending an unknown command: every one is refused, the log gets the burst and one
    line counting the rest (it got 200 WARNING lines, one per client, as fast as they came)."""
    caplog.set_level(logging.WARNING, LOGGER)
    tcp_connection.PEER_ERRORS.window = 1.0
    hub, _ = _writer()
    server = await TcpServer(hub, "hs.test").start()
    try:
        for _ in range(200):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"FOO bar\n")
            assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"ERROR invalid line: unknown command 'FOO': b'FOO bar'\n")
            writer.close()
        await asyncio.sleep(1.2)  # the window ends: the count is logged
        lines = _warnings(caplog)
        bad = [m for m in lines if "bad line" in m]
        assert 1 <= len(bad) <= tcp_connection.PEER_ERRORS.burst * 2, len(bad)
        counted = [m for m in lines if "more replication peers refused for what they sent" in m]
        assert counted, lines[-3:]
        assert len(bad) + sum(int(m.split()[0]) for m in counted) == 200
        assert server.connections == set()
    finally:
        await server.stop()


async def test_a_tls_client_on_a_plaintext_listener_is_named_as_such(caplog: pytest.LogCaptureFixture) -> None:
    """It was 'bad line ... line is not valid UTF-8 ... b'\\x16\\x03\\x01...', or nothing at all when the
    ClientHello held no newline byte."""
    caplog.set_level(logging.WARNING, LOGGER)
    hub, _ = _writer()
    server = await TcpServer(hub, "hs.test").start()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with pytest.raises(ssl.SSLError):
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port, ssl=ctx), 5)
        await _until(lambda: _warnings(caplog), 3, "the listener's warning")
        (line,) = _warnings(caplog)
        assert line.startswith("tcp from 127.0.0.1:") and "started a TLS handshake, but this listener is plaintext" in line
        assert server.connections == set()
    finally:
        await server.stop()


async def test_a_plaintext_client_on_a_tls_listener_is_a_warning_naming_it(
    caplog: pytest.LogCaptureFixture, tls_files: tuple[str, str]
) -> None:
    """It was an INFO line (hidden under serve's default logging) saying '[SSL: WRONG_VERSION_NUMBER]'."""
    caplog.set_level(logging.INFO, LOGGER)
    hub, _ = _writer()
    server = await TcpServer(hub, "hs.test", ssl=server_ssl_context(*tls_files)).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"NAME plain\nPING 1\nREPLICATE\n")
        await asyncio.wait_for(reader.read(), 5)
        await _until(lambda: server.handshake_failures == 1, 3, "the failed handshake")
        port = writer.get_extra_info("sockname")[1]
        assert _warnings(caplog) == [
            f"replication listener: 127.0.0.1:{port} spoke plaintext to this TLS listener (a reader without --tls?); closing"
        ]
    finally:
        writer.close()
        await server.stop()
