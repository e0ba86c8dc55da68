"""``factstream tail`` finishes, fails or speaks: the installed executable against real listeners."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli_run import FACTSTREAM, ENV, cli, free_port, no_traceback, serve, start, stop


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A writer producing ~400 facts/s for the whole module: (db_url, port)."""
    d = tmp_path_factory.mktemp("tail")
    db_url = f"sqlite:///{d}/w.db"
    proc, port = serve(db_url, "--produce", "--rate", "400", "--seed", "5")
    time.sleep(0.5)
    yield db_url, port
    stop(proc)


def test_closed_stdout_ends_quietly_with_status_0(writer: tuple[str, int]) -> None:
    _, port = writer
    # `factstream tail ... | head -3`: the shell's pipeline, exactly.
    out = subprocess.run(f"'{FACTSTREAM}' tail 127.0.0.1:{port} | head -3; echo status=${{PIPESTATUS[0]}}",
                         shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60, env=ENV)
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and lines[-1] == "status=0", out
    assert out.stderr == "", out.stderr


def test_count_is_exact_and_rows_are_compact_wire_json(writer: tuple[str, int]) -> None:
    _, port = writer
    out = cli("tail", f"127.0.0.1:{port}", "--count", "7")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 7
    for line in lines:
        stream, who, token, row = line.split(" ", 3)
        assert who == "master" and int(token) > 0 and isinstance(json.loads(row), list)
        assert ", " not in row or '", "' in row  # compact separators, as on the wire
    js = cli("tail", f"127.0.0.1:{port}", "--count", "3", "--json")
    objs = [json.loads(line) for line in js.stdout.splitlines()]
    assert len(objs) == 3 and set(objs[0]) == {"stream", "writer", "token", "row"}
    assert all('", "' not in line and '": ' not in line for line in js.stdout.splitlines())


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_count_must_be_a_positive_number(count: str) -> None:
    out = cli("tail", "127.0.0.1:9", "--count", count)
    assert out.returncode == 2 and "--count" in out.stderr and no_traceback(out.stderr)


def test_from_start_and_from_need_db() -> None:
    for opt in (["--from-start"], ["--from", "5"]):
        out = cli("tail", "127.0.0.1:9", *opt)
        assert out.returncode == 2 and "needs --db" in out.stderr


def test_nothing_listening_fails_after_the_connect_timeout() -> None:
    port = free_port()
    started = time.monotonic()
    out = cli("tail", f"127.0.0.1:{port}", "--connect-timeout", "1")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"factstream tail: cannot connect to 127.0.0.1:{port}: connection refused (is a replication listener "
        "running there? e.g. factstream serve --port PORT)"]
    assert time.monotonic() - started < 15


def test_a_silent_peer_fails_after_the_connect_timeout() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        out = cli("tail", f"127.0.0.1:{port}", "--connect-timeout", "1")
    assert out.returncode == 1 and "no SERVER greeting within 1s" in out.stderr and no_traceback(out.stderr)


def _http_server() -> tuple[Any, int]:
    import http.server

    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def test_an_http_port_fails_at_once() -> None:
    httpd, port = _http_server()
    try:
        started = time.monotonic()
        out = cli("tail", f"127.0.0.1:{port}", "--connect-timeout", "30")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert out.returncode == 1 and "does not speak the replication protocol" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 20


def test_a_wrong_server_name_fails_at_once(writer: tuple[str, int]) -> None:
    _, port = writer
    started = time.monotonic()
    out = cli("tail", f"127.0.0.1:{port}", "--server-name", "other.hs", "--connect-timeout", "30")
    assert out.returncode == 1
    assert out.stderr.strip() == f"factstream tail: 127.0.0.1:{port} is server 'hs1', not 'other.hs' (--server-name)"
    assert time.monotonic() - started < 20
    db_url, _ = writer
    out = cli("tail", f"127.0.0.1:{port}", "--db", db_url, "--server-name", "other.hs")
    assert out.returncode == 1 and "is server 'hs1', not 'other.hs'" in out.stderr


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


def test_tls_mistakes_fail_at_once_with_one_line(tmp_path: Any, tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    proc, port = serve(f"sqlite:///{tmp_path}/t.db", "--tls-cert", cert, "--tls-key", key, "--produce", "--rate", "100")
    try:
        # Not trusted: no CA given for a self-signed certificate.
        out = cli("tail", f"127.0.0.1:{port}", "--tls", "--connect-timeout", "30")
        assert out.returncode == 1 and "not trusted" in out.stderr and "--cafile" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        # Plaintext to the TLS port.
        out = cli("tail", f"127.0.0.1:{port}", "--connect-timeout", "5")
        assert out.returncode == 1 and no_traceback(out.stderr)
        assert "SERVER" in out.stderr and len(out.stderr.strip().splitlines()) == 1
        # With the CA it works.
        out = cli("tail", f"127.0.0.1:{port}", "--cafile", cert, "--count", "1", "--connect-timeout", "5", timeout=30)
        assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr
    finally:
        stop(proc)
    plain, pport = serve(f"sqlite:///{tmp_path}/p.db")
    try:
        out = cli("tail", f"127.0.0.1:{pport}", "--tls", "--insecure", "--connect-timeout", "5")
        assert out.returncode == 1 and "TLS handshake" in out.stderr and no_traceback(out.stderr)
    finally:
        stop(plain)


def test_a_lost_writer_fails_without_retry_and_warns_with_retry(tmp_path: Any) -> None:
    db_url = f"sqlite:///{tmp_path}/r.db"
    proc, port = serve(db_url, "--produce", "--rate", "100")
    plain = start("tail", f"127.0.0.1:{port}")
    follower = start("tail", f"127.0.0.1:{port}", "--retry", "forever")
    time.sleep(2)
    stop(proc)
    out, err = plain.communicate(timeout=30)
    assert plain.returncode == 1 and out and "closed the connection" in err and no_traceback(err)
    time.sleep(2)
    assert follower.poll() is None  # still trying
    proc2 = start("serve", "--db", db_url, "--port", str(port), "--produce", "--rate", "100", "--server-name", "hs1")
    try:
        time.sleep(3)
        out, err = stop(follower, signal.SIGTERM)
    finally:
        stop(proc2)
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) >= 2, err  # the loss and at least one failed attempt, at default verbosity
    assert any("reconnected" in line for line in warnings) and no_traceback(err)


def test_db_follower_replays_from_a_token_and_filters_writers(writer: tuple[str, int]) -> None:
    db_url, port = writer
    out = cli("tail", f"127.0.0.1:{port}", "--db", db_url, "--from", "3", "--stream", "caches", "--count", "4",
              "--writer", "master")
    assert out.returncode == 0, out.stderr
    tokens = [int(line.split(" ")[2]) for line in out.stdout.splitlines()]
    assert len(tokens) == 4 and tokens == sorted(tokens) and tokens[0] > 3


def test_format_templates_and_timestamps(writer: tuple[str, int]) -> None:
    _, port = writer
    out = cli("tail", f"127.0.0.1:{port}", "--stream", "caches", "--count", "3",
              "--format", r"%T|%s|%w|%t|%{cache_func}|%l\n")
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        ts, stream, who, token, func, wire_line = line.split("|", 5)
        assert ts.endswith("Z") and "T" in ts and stream == "caches" and who == "master"
        assert func == "get_user_by_id" and wire_line.startswith(f"RDATA caches master {token} [")
    stamped = cli("tail", f"127.0.0.1:{port}", "--count", "2", "--timestamps")
    assert all(line.split(" ")[0].endswith("Z") and len(line.split(" ")) >= 5 for line in stamped.stdout.splitlines())
    bad = cli("tail", f"127.0.0.1:{port}", "--format", "%q")
    assert bad.returncode == 2 and "unknown placeholder %q" in bad.stderr


def test_verbose_flag_after_the_subcommand(writer: tuple[str, int]) -> None:
    out = cli("tail", "127.0.0.1:1", "--connect-timeout", "0.5", "-v")
    assert out.returncode == 1 and "retrying" in out.stderr  # INFO lines shown with -v after the subcommand
    quiet = cli("tail", "127.0.0.1:1", "--connect-timeout", "0.5")
    assert "retrying" not in quiet.stderr


def test_ctrl_c_exits_130_without_traceback(writer: tuple[str, int]) -> None:
    _, port = writer
    proc = start("tail", f"127.0.0.1:{port}", start_new_session=True)
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and no_traceback(err) and out


def test_closed_stdout_is_quiet_for_other_commands_too(tmp_path: Any) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("NOT A COMMAND line\n" * 100_000)
    out = subprocess.run(f"'{FACTSTREAM}' decode '{bad}' --max-errors 1000000 | head -1; echo status=${{PIPESTATUS[0]}}",
                         shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120, env=ENV)
    assert out.stdout.splitlines()[-1] == "status=0" and out.stderr == "", out


def test_redis_count_is_exact_under_a_flood(redis_url: str, channel_prefix: str) -> None:
    import redis

    proc = start("tail", "--redis", redis_url, "--server-name", channel_prefix, "--count", "2")
    r = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while r.pubsub_numsub(channel_prefix)[0][1] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        pipe = r.pipeline(transaction=False)
        for i in range(2000):
            pipe.publish(channel_prefix, f"POSITION caches w1 {i} {i + 1}")
        pipe.execute()
        out, err = proc.communicate(timeout=30)
    finally:
        r.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["POSITION caches w1 0 1", "POSITION caches w1 1 2"]
