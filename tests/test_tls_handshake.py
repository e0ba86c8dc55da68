"""The TLS listener: handshakes that never finish cost a slot for a few seconds, never a reader forever.

On asyncio and uvloop: plaintext clients on a TLS port are dropped after the
handshake timeout and never count as readers; handshakes in progress are
bounded; stopping does not wait per stuck handshake; mutual TLS accepts a
client whose certificate the CA signed and refuses one without (API and
``factstream serve --tls-client-ca``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub
from factstream.transport.tcp import TcpClient, TcpServer, client_ssl_context, server_ssl_context

from conftest import require, subprocess_env

BOTH_EVENT_LOOPS = True
FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, all signed by the CA."""
    require(binary="openssl", how="apt-get install openssl (needed to make test certificates)")
    d = tmp_path_factory.mktemp("pki")
    f = {n: str(d / n) for n in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr", "client.pem",
                                  "client.key", "client.csr", "ext.cnf")}
    Path(f["ext.cnf"]).write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f["ca.key"], "-out", f["ca.pem"],
             "-days", "1", "-subj", "/CN=factstream test CA")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f[f"{who}.key"], "-out", f[f"{who}.csr"],
                 "-subj", f"/CN={'localhost' if who == 'server' else 'reader1'}")
        _openssl("x509", "-req", "-in", f[f"{who}.csr"], "-CA", f["ca.pem"], "-CAkey", f["ca.key"],
                 "-CAcreateserial", "-out", f[f"{who}.pem"], "-days", "1", "-extfile", f["ext.cnf"])
    return f


def _writer() -> tuple[ReplicationHub, LocalStream]:
    pub = Publisher("master")
    ls = LocalStream("to_device", "master")
    pub.add_stream("to_device", ls.source, 0)
    ls.add_listener(pub.notify)
    return ReplicationHub("master", publisher=pub), ls


async def _close(writers: list[asyncio.StreamWriter]) -> None:
    for w in writers:
        w.close()
    for w in writers:
        try:
            await asyncio.wait_for(w.wait_closed(), 2)
        except (OSError, ssl.SSLError, TimeoutError):
            pass


async def _eventually(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_plaintext_clients_never_count_as_readers(pki: dict[str, str]) -> None:
    hub, _ = _writer()
    server = await TcpServer(hub, "tls.hs", ssl=server_ssl_context(pki["server.pem"], pki["server.key"]),
                             handshake_timeout=1.0, max_handshakes=1000).start()
    socks = []
    try:
        for _ in range(500):
            socks.append(await asyncio.open_connection("127.0.0.1", server.port))
        for _, w in socks[:100]:
            w.write(b"NAME plain\nREPLICATE\n")  # plaintext where a ClientHello belongs
        await asyncio.sleep(0.2)
        assert len(server.connections) == 0
        await _eventually(lambda: server.handshakes == 0, 10, "stuck handshakes to time out")
        assert len(server.connections) == 0 and server.handshake_failures >= 400
        # The listener still serves a real TLS reader afterwards.
        fol = Follower(sources={}, start_position=0)
        client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port,
                                 ssl=client_ssl_context(pki["ca.pem"]), server_hostname="localhost").start()
        await client.wait_connected(5)
        await _eventually(lambda: len(server.connections) == 1, 5, "the TLS reader to count")
        await client.stop()
    finally:
        await _close([w for _, w in socks])
        await server.stop()


async def test_handshakes_in_progress_are_bounded_and_stop_is_quick(pki: dict[str, str]) -> None:
    hub, _ = _writer()
    server = await TcpServer(hub, "tls.hs", ssl=server_ssl_context(pki["server.pem"], pki["server.key"]),
                             handshake_timeout=30.0, max_handshakes=10).start()
    socks = []
    try:
        for _ in range(50):
            socks.append(await asyncio.open_connection("127.0.0.1", server.port))
        await _eventually(lambda: server.handshakes_refused >= 40, 5, "connections past the bound to be refused")
        assert server.handshakes == 10 and len(server.connections) == 0
        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started < 2.5  # not ~2 s per stuck handshake
        assert server.handshakes == 0
    finally:
        await _close([w for _, w in socks])


async def test_data_sent_right_after_the_handshake_is_not_lost(pki: dict[str, str]) -> None:
    """REPLICATE in the first TLS record after the handshake gets its POSITION answer."""
    hub, ls = _writer()
    ls.write([["@a:hs"]])
    server = await TcpServer(hub, "tls.hs", ssl=server_ssl_context(pki["server.pem"], pki["server.key"])).start()
    try:
        for _ in range(5):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=client_ssl_context(pki["ca.pem"]), server_hostname="localhost"
            )
            writer.write(b"NAME r\nREPLICATE\n")
            lines: list[str] = []
            while not any(x.startswith("POSITION") for x in lines):
                lines.append((await asyncio.wait_for(reader.readline(), 5)).decode().rstrip("\n"))
            assert "POSITION to_device master 1 1" in lines
            await _close([writer])
    finally:
        await server.stop()


async def test_mutual_tls_accepts_a_signed_client_and_refuses_one_without(pki: dict[str, str]) -> None:
    hub, ls = _writer()
    ctx = server_ssl_context(pki["server.pem"], pki["server.key"], client_cafile=pki["ca.pem"])
    server = await TcpServer(hub, "mtls.hs", ssl=ctx, handshake_timeout=2.0).start()
    try:
        # Without a client certificate: refused, never a reader.
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client_ssl_context(pki["ca.pem"]), server_hostname="localhost"
        )
        try:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                line = await asyncio.wait_for(reader.readline(), 5)
                if not line:
                    raise ConnectionResetError("closed without a line")
        finally:
            await _close([writer])
        await _eventually(lambda: server.handshake_failures >= 1, 5, "the refusal to be counted")
        assert len(server.connections) == 0
        # With a certificate the CA signed: a reader.
        good = client_ssl_context(pki["ca.pem"], certfile=pki["client.pem"], keyfile=pki["client.key"])
        fol = Follower(sources={"to_device": ls.source}, start_position=0)
        client = await TcpClient(ReplicationHub("r", follower=fol), "127.0.0.1", server.port, ssl=good,
                                 server_hostname="localhost").start()
        ls.write([["@b:hs"]])
        await fol.wait_for_position("to_device", "master", 1, 5)
        assert len(server.connections) == 1
        await client.stop()
    finally:
        await server.stop()


def test_serve_tls_client_ca_on_the_cli(pki: dict[str, str], tmp_path: Any) -> None:
    proc = subprocess.Popen(
        [FACTSTREAM, "serve", "--db", f"sqlite:///{tmp_path}/w.db", "--port", "0", "--status",
         "--tls-cert", pki["server.pem"], "--tls-key", pki["server.key"], "--tls-client-ca", pki["ca.pem"],
         "--tls-handshake-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        port = first["port"]

        async def clients() -> tuple[bool, bool]:
            async def try_with(ctx: ssl.SSLContext) -> bool:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                                   server_hostname="localhost")
                except (ssl.SSLError, ConnectionError):
                    return False
                try:
                    line = await asyncio.wait_for(reader.readline(), 5)
                    return line.startswith(b"SERVER ")
                except (ssl.SSLError, ConnectionError):
                    return False
                finally:
                    await _close([writer])

            bad = await try_with(client_ssl_context(pki["ca.pem"]))
            good = await try_with(client_ssl_context(pki["ca.pem"], certfile=pki["client.pem"],
                                                     keyfile=pki["client.key"]))
            return bad, good

        bad, good = asyncio.run(clients())
        assert (bad, good) == (False, True)
        plain = [__import__("socket").create_connection(("127.0.0.1", port)) for _ in range(20)]
        deadline = time.monotonic() + 10
        status: dict[str, Any] = {}
        for line in proc.stdout:
            status = json.loads(line)
            if status["event"] == "status" and status["readers"] == 0 and status["handshakes"] == 0:
                break
            assert time.monotonic() < deadline, status
        for s in plain:
            s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # Usage mistakes are one line, no traceback.
    miss = subprocess.run([FACTSTREAM, "serve", "--tls-client-ca", pki["ca.pem"]], capture_output=True, text=True,
                          env=subprocess_env(), timeout=30)
    assert miss.returncode == 2 and "--tls-client-ca needs --tls-cert" in miss.stderr
    assert "Traceback" not in miss.stderr
