"""``factstream pub`` (validated commands over TCP as a client, or onto a Redis channel) and
``factstream status`` (tokens, rows/s and a server's connected readers), as processes."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from cli_run import cli, free_port, no_traceback, serve, start, stop


class LineServer:
    """A bare TCP peer that greets like a replication server and keeps every line it receives."""

    def __init__(self, answer: bytes = b"") -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.sendall(b"SERVER hs.test\nPING 1\n")
            conn.settimeout(5)
            sent_answer = False
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                self.received += data
                if self.answer and not sent_answer and b"USER_SYNC" in self.received:
                    conn.sendall(self.answer)
                    sent_answer = True

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


def test_pub_over_tcp_sends_only_valid_client_commands() -> None:
    peer = LineServer()
    try:
        out = cli("pub", f"127.0.0.1:{peer.port}", "--wait", "0.3", stdin=(
            "USER_SYNC worker1 @a:hs DEV start 1700000000000\n"
            "FEDERATION_ACK worker1 17\n"
        ))
    finally:
        peer.close()
    assert out.returncode == 0, out.stderr
    lines = peer.received.decode().splitlines()
    assert lines[0] == "NAME factstream-pub" and lines[1].startswith("PING ")
    assert lines[2:4] == ["USER_SYNC worker1 @a:hs DEV start 1700000000000", "FEDERATION_ACK worker1 17"]


def test_pub_takes_its_commands_after_the_options_too() -> None:
    """``pub HOST:PORT --wait 0.3 'CMD'`` said "unrecognized arguments: CMD": the commands may follow the options."""
    peer = LineServer()
    try:
        out = cli("pub", f"127.0.0.1:{peer.port}", "--wait", "0.3", "FEDERATION_ACK worker1 17",
                  "--client-name", "mixed", "FEDERATION_ACK worker1 18")
    finally:
        peer.close()
    assert out.returncode == 0, out.stderr
    lines = peer.received.decode().splitlines()
    assert lines[0] == "NAME mixed"
    assert lines[2:4] == ["FEDERATION_ACK worker1 17", "FEDERATION_ACK worker1 18"]
    wrong = cli("pub", "127.0.0.1:1", "--no-such-option", "PING 1")
    assert wrong.returncode == 2 and "unrecognized arguments: --no-such-option" in wrong.stderr


def test_pub_refuses_bad_lines_and_sends_nothing() -> None:
    peer = LineServer()
    out = cli("pub", f"127.0.0.1:{peer.port}", "REPLICATE", 'RDATA caches m 1 ["f",null,1]', "NOPE x",
              'USER_SYNC w @a:hs DEV start notanumber')
    with socket.create_connection(("127.0.0.1", peer.port)):
        pass  # let the peer's accept() return (pub refused before connecting)
    peer.close()
    assert out.returncode == 1 and no_traceback(out.stderr)
    err = out.stderr
    assert "argument 2: RDATA is not a command a client may send" in err
    assert "argument 3: unknown command 'NOPE'" in err and "argument 4:" in err
    assert "nothing sent (3 of 4 line(s) refused)" in err
    assert b"REPLICATE" not in peer.received


def test_pub_reports_the_servers_error() -> None:
    peer = LineServer(answer=b"ERROR you may not\n")
    try:
        out = cli("pub", f"127.0.0.1:{peer.port}", "USER_SYNC w @a:hs DEV start 1", "--wait", "2")
    finally:
        peer.close()
    assert out.returncode == 1 and "the server answered: you may not" in out.stderr


def test_pub_onto_redis_publishes_on_synapses_channels(redis_url: str, channel_prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    ps = r.pubsub()
    ps.subscribe(channel_prefix, f"{channel_prefix}/USER_IP")
    for _ in range(2):
        ps.get_message(timeout=2)
    try:
        out = cli("pub", "--redis", redis_url, "--server-name", channel_prefix,
                  'RDATA caches master 5 ["get_user_by_id",["@a:hs"],1]',
                  'USER_IP @u:hs ["tok","10.0.0.1","curl","DEV",1700000000000]')
        assert out.returncode == 0, out.stderr
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            msg = ps.get_message(timeout=1)
            if msg and msg["type"] == "message":
                got.append((msg["channel"].decode(), msg["data"].decode()))
        assert got == [(channel_prefix, 'RDATA caches master 5 ["get_user_by_id",["@a:hs"],1]'),
                       (f"{channel_prefix}/USER_IP", 'USER_IP @u:hs ["tok","10.0.0.1","curl","DEV",1700000000000]')]
        # A stream Synapse does not know is refused on a Synapse channel unless asked for.
        refused = cli("pub", "--redis", redis_url, "--server-name", channel_prefix, 'RDATA my_stream w 1 ["x"]')
        assert refused.returncode == 1 and "--custom-streams" in refused.stderr
        assert ps.get_message(timeout=1) is None
        allowed = cli("pub", "--redis", redis_url, "--server-name", channel_prefix, "--custom-streams",
                      'RDATA my_stream w 1 ["x"]')
        assert allowed.returncode == 0, allowed.stderr
        msg = ps.get_message(timeout=2)
        assert msg is not None and msg["data"] == b'RDATA my_stream w 1 ["x"]'
    finally:
        ps.close()
        r.close()


def test_status_shows_tokens_rates_and_connected_readers(tmp_path: Any) -> None:
    metrics_port = free_port()
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--produce", "--rate", "300", "--metrics-port", str(metrics_port))
    reader = start("tail", f"127.0.0.1:{port}", "--name", "reader-a")
    try:
        time.sleep(2)
        out = cli("status", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics_port}", "--json",
                  "--interval", "1.5")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        streams = {r["stream"]: r for r in doc["streams"]}
        assert set(streams) == {"caches", "receipts", "to_device"} and doc["server"] == "hs1"
        assert all(r["writer"] == "master" and r["token"] > 0 and r["rows_per_s"] > 10 for r in streams.values())
        names = {r["name"]: r for r in doc["readers"]}
        a = names["reader-a"]
        assert a["address"].startswith("127.0.0.1:") and a["connected_since"].endswith("Z")
        assert a["buffered"] == 0 and a["last_ping"] is not None
        text = cli("status", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics_port}", "--interval", "0.5")
        assert "reader-a" in text.stdout and "ROWS/S" in text.stdout and "LAST PING" in text.stdout
    finally:
        stop(reader)
        stop(proc)
    down = cli("status", f"127.0.0.1:{port}", "--connect-timeout", "0.5")
    assert down.returncode == 1 and "connection refused" in down.stderr and no_traceback(down.stderr)


def test_status_over_redis(tmp_path: Any, redis_url: str, channel_prefix: str) -> None:
    writer = start("serve", "--db", f"sqlite:///{tmp_path}/r.db", "--redis", redis_url, "--server-name", channel_prefix,
                   "--produce", "--rate", "300", "--status")
    try:
        assert writer.stdout is not None
        json.loads(writer.stdout.readline())  # listening
        out = cli("status", "--redis", redis_url, "--server-name", channel_prefix, "--json", "--interval", "1.5")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        streams = {r["stream"]: r for r in doc["streams"]}
        assert set(streams) == {"caches", "receipts", "to_device"}
        assert all(r["token"] > 0 and r["rows_per_s"] > 10 for r in streams.values()) and "readers" not in doc
    finally:
        stop(writer)
    out = cli("status", "--redis", redis_url, "--server-name", channel_prefix, "--metrics", "127.0.0.1:1")
    assert out.returncode == 2 and "not visible" in out.stderr


def test_status_metrics_must_be_a_writers_prometheus_endpoint(tmp_path: Any) -> None:
    """--metrics at the replication port, or at another HTTP server, is named as such (it used to say "this
    is a bug", or "0 connected readers"); HOST:PORT/metrics is read as given."""
    import http.server

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"hello\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    metrics_port = free_port()
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--metrics-port", str(metrics_port))
    try:
        for where, complaint in ((f"127.0.0.1:{port}", "replication listener"),
                                 (f"127.0.0.1:{other.server_address[1]}", "exports no factstream_* metric")):
            out = cli("status", f"127.0.0.1:{port}", "--interval", "0.2", "--metrics", where)
            assert out.returncode == 1 and no_traceback(out.stderr), out.stderr
            assert "is not a Prometheus metrics endpoint of a factstream writer" in out.stderr
            assert complaint in out.stderr and "internal error" not in out.stderr, out.stderr
        out = cli("status", f"127.0.0.1:{port}", "--interval", "0.2", "--metrics", f"127.0.0.1:{metrics_port}/metrics")
        assert out.returncode == 0 and "connected reader(s)" in out.stdout, out.stderr
    finally:
        stop(proc)
        other.shutdown()
        other.server_close()
