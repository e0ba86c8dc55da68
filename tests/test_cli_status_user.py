"""``factstream status`` and ``positions`` as an operator runs them: the installed executable, real carriers.

Each test is a defect found by using the commands against real writers (TCP,
Redis, NATS JetStream) and fixed in ``cli/status.py`` or ``cli/positions.py``.
"""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import pytest
from cli_run import ENV, FACTSTREAM, IN_CI, cli, free_port, serve, start, stop

pytestmark = pytest.mark.timeout(120)


def no_traceback(text: str) -> bool:
    return "Traceback" not in text and "internal error" not in text


def interrupt_after(delay: float, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run factstream ARGS with SIGINT at its default (as at a terminal), Ctrl-C it after ``delay``."""
    proc = subprocess.Popen([FACTSTREAM, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    sent = time.monotonic()
    out, err = stop(proc, signal.SIGINT, timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - sent


def test_ctrl_c_while_reading_a_silent_metrics_port_exits_130_at_once(tmp_path: Any, silent_port: int) -> None:
    """The /metrics read blocked the event loop: Ctrl-C waited for --connect-timeout, then exit 1 "timed out"."""
    proc, port = serve(f"sqlite:///{tmp_path}/w.db", "--produce", "--rate", "50")
    try:
        done, waited = interrupt_after(2.0, "status", f"127.0.0.1:{port}", "--interval", "0.5",
                                       "--metrics", f"127.0.0.1:{silent_port}", "--connect-timeout", "20")
    finally:
        stop(proc)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert waited < 5, f"Ctrl-C took {waited:.1f}s"
    assert no_traceback(done.stderr) and "timed out" not in done.stderr, done.stderr


class _Metrics(http.server.BaseHTTPRequestHandler):
    """A /metrics behind basic authentication (a reverse proxy in front of serve --metrics-port)."""

    wanted = "Basic " + base64.b64encode(b"ops:s3cr/et@x").decode()
    body = (b"# HELP factstream_reader_buffered_commands x\n# TYPE factstream_reader_buffered_commands gauge\n"
            b'factstream_reader_buffered_commands{address="10.0.0.7:5000",name="worker-7",server="hs1"} 3.0\n')

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != self.wanted:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="metrics"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def test_metrics_url_with_user_and_password_is_used_and_masked(tmp_path: Any) -> None:
    """http://USER:PASSWORD@HOST/metrics was looked up as the host name "USER:PASSWORD@HOST" (and a password
    holding '/' was cut there, its first part printed as a "nonnumeric port")."""
    http_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=http_srv.serve_forever, daemon=True).start()
    mport = http_srv.server_address[1]
    proc, port = serve(f"sqlite:///{tmp_path}/w.db")
    try:
        good = f"http://ops:s3cr/et%40x@127.0.0.1:{mport}/metrics"
        out = cli("status", f"127.0.0.1:{port}", "--interval", "0.3", "--metrics", good, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert [(r["name"], r["buffered"]) for r in doc["readers"]] == [("worker-7", 3)]
        text = cli("status", f"127.0.0.1:{port}", "--interval", "0.3", "--metrics", good)
        assert text.returncode == 0 and "worker-7" in text.stdout, text.stderr
        bad = cli("status", f"127.0.0.1:{port}", "--interval", "0.3", "--metrics",
                  f"http://ops:wr/ong@127.0.0.1:{mport}/metrics")
        assert bad.returncode == 1 and "401" in bad.stderr and no_traceback(bad.stderr), bad.stderr
        for result in (out, text, bad):
            assert "s3cr" not in result.stdout + result.stderr and "wr/ong" not in result.stderr
            assert "'wr'" not in result.stderr
    finally:
        stop(proc)
        http_srv.shutdown()
        http_srv.server_close()


def _private(program: str, *args: str) -> subprocess.Popen[bytes]:
    if shutil.which(program) is None:
        if IN_CI:
            pytest.fail(f"{program} is not installed (make prerequisites)")
        pytest.skip(f"{program} is not installed (make prerequisites)")
    return subprocess.Popen([program, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_port(port: int, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def test_nats_server_lost_during_status_is_one_line_not_a_bug(tmp_path: Any) -> None:
    """A NATS server that goes away while status measures was "internal error: NoServersError ... this is a
    bug"; it is now said as what happened, URL masked."""
    nport = free_port()
    nats = _private("nats-server", "-a", "127.0.0.1", "-p", str(nport), "-js", "-sd", str(tmp_path / "js"))
    writer = None
    try:
        _wait_port(nport)
        writer = start("serve", "--db", f"sqlite:///{tmp_path}/n.db", "--nats", f"nats://127.0.0.1:{nport}",
                       "--server-name", "lost-nats", "--produce", "--rate", "50", "--status")
        assert writer.stdout is not None
        json.loads(writer.stdout.readline())  # listening
        status = start("status", "--nats", f"nats://ops:s3cret@127.0.0.1:{nport}", "--server-name", "lost-nats",
                       "--interval", "3")
        time.sleep(1.5)
        nats.terminate()
        nats.wait(10)
        out, err = status.communicate(timeout=60)
        assert status.returncode == 1, (status.returncode, err)
        assert no_traceback(err) and "lost NATS at nats://ops:***@127.0.0.1" in err, err
        assert "s3cret" not in out + err
    finally:
        if writer is not None:
            stop(writer)
        if nats.poll() is None:
            nats.terminate()
            nats.wait(10)


def test_redis_channel_nobody_writes_on_is_said(tmp_path: Any, redis_url: str, channel_prefix: str) -> None:
    """A mistyped --server-name over Redis printed an empty table (status) or an empty replication column
    next to the database's rows (positions), exit 0, as if the writers were there and quiet."""
    db = tmp_path / "w.db"
    proc, _ = serve(f"sqlite:///{db}", "--produce", "--rate", "50", "--duration", "0.5")
    try:
        time.sleep(1.5)
    finally:
        stop(proc)
    nobody = f"{channel_prefix}-nobody"
    out = cli("status", "--redis", redis_url, "--server-name", nobody, "--interval", "0.5")
    assert out.returncode == 0 and f"no writer answered REPLICATE on channel {nobody!r}" in out.stdout, out
    assert "check --server-name" in out.stdout
    pos = cli("positions", "--db", f"sqlite:///{db}", "--redis", redis_url, "--server-name", nobody)
    assert pos.returncode == 0, pos.stderr
    assert f"# no writer answered REPLICATE on channel {nobody!r} within 1s (check --server-name)" in pos.stdout
    assert "caches" in pos.stdout  # the database's rows are still listed
    as_json = cli("positions", "--db", f"sqlite:///{db}", "--redis", redis_url, "--server-name", nobody, "--json")
    assert as_json.returncode == 0 and isinstance(json.loads(as_json.stdout), list)


def test_json_interval_is_the_measured_window_not_the_connect_wait(tmp_path: Any) -> None:
    """status --json's "interval" counted the connect retries too (a writer restarting: 3.6 for --interval 1),
    so rows / interval disagreed with rows_per_s."""
    port = free_port()
    status = start("status", f"127.0.0.1:{port}", "--interval", "1", "--json", "--connect-timeout", "15")
    time.sleep(2.5)  # the writer is restarting: status retries the refused connect meanwhile
    proc = start("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--port", str(port), "--produce", "--rate", "100")
    try:
        out, err = status.communicate(timeout=60)
    finally:
        stop(proc)
    assert status.returncode == 0, err
    doc = json.loads(out)
    assert 0.9 <= doc["interval"] <= 1.5, doc["interval"]
    for r in doc["streams"]:
        assert abs(r["rows"] / doc["interval"] - r["rows_per_s"]) <= 0.1 + 0.01 * r["rows_per_s"], r

