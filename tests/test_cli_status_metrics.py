"""``factstream status --metrics`` as an operator runs it: the installed executable against real endpoints.

Every way a ``--metrics`` URL can fail (nothing listening, an unknown host,
HTTP 401/404/500, a page that is no writer's, the replication port, a port
that closes at once or never answers) prints no part of a password given in
it, whatever characters the password holds; and a bad ``--metrics`` fails at
once, not after ``--interval``.
"""

from __future__ import annotations

import base64
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from cli_run import cli, free_port, no_traceback, serve, start, stop

pytestmark = pytest.mark.timeout(300)

READER_BODY = (b"# HELP factstream_reader_buffered_commands x\n# TYPE factstream_reader_buffered_commands gauge\n"
               b'factstream_reader_buffered_commands{address="10.0.0.7:5000",name="worker-7",server="hs1"} 3.0\n')


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """/401, /404, /500: that status; /page: a page with no factstream metric; /auth: metrics behind basic auth."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.partition("?")[0]
        code, body = 200, b"<html>not metrics</html>\n"
        if path in ("/401", "/404", "/500"):
            code, body = int(path[1:]), b""
        elif path == "/auth":
            wanted = getattr(self.server, "wanted", None)
            code, body = (200, READER_BODY) if self.headers.get("Authorization") == wanted else (401, b"")
        self.send_response(code)
        if code == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="metrics"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Sockets:
    """A port that reads the request and closes (no HTTP answer) and one that accepts and never answers."""

    def __init__(self) -> None:
        self.closer = socket.create_server(("127.0.0.1", 0))
        self.silent = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        for srv, keep in ((self.closer, False), (self.silent, True)):
            srv.settimeout(0.2)
            threading.Thread(target=self._accept, args=(srv, keep), daemon=True).start()

    def _accept(self, srv: socket.socket, keep: bool) -> None:
        while not self.stopping.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            if keep:
                self.held.append(conn)
                continue
            try:  # the request read first: closing on it unread resets the connection instead
                conn.settimeout(2)
                conn.recv(65536)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        for s in [*self.held, self.closer, self.silent]:
            s.close()


def _drain(stream: Any) -> None:
    try:
        while stream.readline():
            pass
    except (OSError, ValueError):  # closed by stop()
        pass


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A writer (its replication and metrics ports), an HTTP server (see _Endpoint) and the two odd ports."""
    http_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=http_srv.serve_forever, daemon=True).start()
    odd = _Sockets()
    metrics_port = free_port()
    proc, port = serve(f"sqlite:///{tmp_path_factory.mktemp('w')}/w.db", "--metrics-port", str(metrics_port))
    # its --status lines (1 KB/s) drained: a full pipe stops the writer after a minute
    threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    try:
        yield {"target": f"127.0.0.1:{port}", "metrics": f"127.0.0.1:{metrics_port}", "server": http_srv,
               "http": f"127.0.0.1:{http_srv.server_address[1]}", "closer": f"127.0.0.1:{odd.closer.getsockname()[1]}",
               "silent": f"127.0.0.1:{odd.silent.getsockname()[1]}"}
    finally:
        stop(proc)
        http_srv.shutdown()
        http_srv.server_close()
        odd.close()


def _pieces(password: str) -> set[str]:
    """The password as written and decoded, and every part of it between the characters a URL parser cuts at."""
    return {password, unquote(password), *(p for p in re.split(r"%40|[/?#@]", password) if p)}


#: Passwords (as written in the URL) holding the characters a URL parser ends a userinfo or an authority at.
#: Every part is three characters at least, so that a part found in the output is the password's.
PASSWORDS = [
    "Zq7/Wx4",       # '/': urllib cut the host there
    "Zq7%40Wx4",     # '@' percent-encoded
    "Zq7@Wx4",       # '@' as it is
    "Zq7?Wx4",
    "Zq7#Wx4",
    "Zq7/Wx4?Kj9",   # '/' and then '?': shown whole ("http://ops:Zq7/Wx4?Kj9@..."), and "nonnumeric port: 'Zq7'"
    "Zq7/Wx4#Kj9",
    "Zq7?Wx4/Kj9",
    "Zq7#Wx4/Kj9",
    "Zq7:Wx4/Kj9",
]


@pytest.mark.parametrize("password", PASSWORDS)
def test_no_error_of_metrics_shows_any_part_of_the_password(endpoints: dict[str, Any], password: str) -> None:
    """Each failing --metrics says what is wrong, with the URL's password masked: a password holding '/' and
    then '?' or '#' was shown whole, urllib having read it as the host's port."""
    where = {
        "connection refused": ("127.0.0.1:1/metrics", "Connection refused"),
        "unknown host": ("nohost.invalid:9100/metrics", "cannot read metrics"),
        "HTTP 401": (f"{endpoints['http']}/401", "HTTP 401"),
        "HTTP 404": (f"{endpoints['http']}/404", "HTTP 404"),
        "HTTP 500": (f"{endpoints['http']}/500", "HTTP 500"),
        "not metrics": (f"{endpoints['http']}/page", "exports no factstream_* metric"),
        "replication port": (f"{endpoints['target']}/metrics", "replication listener"),
        "no HTTP answer": (f"{endpoints['closer']}/metrics", "closed the connection"),
        "timeout": (f"{endpoints['silent']}/metrics", "timed out"),
    }
    for what, (hostpath, said) in where.items():
        out = cli("status", endpoints["target"], "--interval", "0.2", "--connect-timeout", "1",
                  "--metrics", f"http://ops:{password}@{hostpath}")
        shown = out.stdout + out.stderr
        leaked = sorted(p for p in _pieces(password) if p in shown)
        assert not leaked, f"{what}: {leaked} in {shown!r}"
        assert out.returncode == 1, (what, out.returncode, out.stderr)
        assert said in out.stderr and "http://ops:***@" in out.stderr, (what, out.stderr)
        assert no_traceback(out.stderr) and len(out.stderr.strip().splitlines()) == 1, (what, out.stderr)


@pytest.mark.parametrize("password", ["Zq7/Wx4?Kj9", "Zq7?Wx4/Kj9", "Zq7#Wx4/Kj9", "Zq7@Wx4"])
def test_a_password_with_slash_and_question_mark_is_sent(endpoints: dict[str, Any], password: str) -> None:
    """urllib was handed such a URL whole ('nonnumeric port'); the user and password are now sent as basic auth."""
    endpoints["server"].wanted = "Basic " + base64.b64encode(f"ops:{password}".encode()).decode()
    out = cli("status", endpoints["target"], "--interval", "0.2", "--json",
              "--metrics", f"http://ops:{password}@{endpoints['http']}/auth")
    assert out.returncode == 0, out.stderr
    assert [(r["name"], r["buffered"]) for r in json.loads(out.stdout)["readers"]] == [("worker-7", 3)]
    assert not any(p in out.stdout + out.stderr for p in _pieces(password))


@pytest.mark.parametrize(("url", "secret"), [
    ("http://ops:Zq7@Wx4/Kj9?Vb5@{http}/auth", ("Zq7", "Wx4", "Kj9", "Vb5")),  # password Zq7, or Zq7@Wx4/Kj9?Vb5
    ("http://{http}/metrics?who=Zq7@Wx4", ("Zq7",)),  # no password, or a password ending in "who=Zq7", host Wx4
])
def test_a_url_that_reads_two_ways_is_refused_masked(endpoints: dict[str, Any], url: str, secret: tuple[str]) -> None:
    """Two '@'s a host follows, one after a '/' and a '?': which one ends a password cannot be told."""
    out = cli("status", endpoints["target"], "--interval", "0.2", "--metrics", url.format(http=endpoints["http"]))
    assert out.returncode == 2 and "can be read two ways" in out.stderr and "%40" in out.stderr, out.stderr
    assert no_traceback(out.stderr) and not any(p in out.stderr for p in secret), out.stderr


def test_a_bad_metrics_address_fails_at_once_not_after_the_interval(endpoints: dict[str, Any]) -> None:
    """--metrics was first read after --interval: `status W --interval 10 --metrics 127.0.0.1:1` said
    "Connection refused" after 10 s. The endpoint is now read while status connects and listens."""
    for where, said in (("127.0.0.1:1", "Connection refused"), ("nohost.invalid:9100", "cannot read metrics"),
                        (endpoints["target"], "replication listener"),
                        (f"{endpoints['http']}/page", "exports no factstream_* metric"),
                        (f"{endpoints['http']}/404", "HTTP 404")):
        began = time.monotonic()
        out = cli("status", endpoints["target"], "--interval", "10", "--metrics", where)
        took = time.monotonic() - began
        assert out.returncode == 1 and said in out.stderr and no_traceback(out.stderr), (where, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == "", (where, out.stdout, out.stderr)
        assert took < 5, f"--metrics {where}: failed after {took:.1f}s"
    # a writer that is not up yet (status retries its connect for --connect-timeout): --metrics fails first
    began = time.monotonic()
    out = cli("status", f"127.0.0.1:{free_port()}", "--interval", "10", "--connect-timeout", "10",
              "--metrics", "127.0.0.1:1")
    assert out.returncode == 1 and "Connection refused" in out.stderr, out.stderr
    assert time.monotonic() - began < 5


def test_a_silent_metrics_port_gives_up_connect_timeout_after_the_start(endpoints: dict[str, Any]) -> None:
    """The wait for an endpoint that never answers starts with the command, not after the interval."""
    began = time.monotonic()
    out = cli("status", endpoints["target"], "--interval", "3", "--connect-timeout", "4",
              "--metrics", endpoints["silent"])
    took = time.monotonic() - began
    assert out.returncode == 1 and "timed out" in out.stderr, out.stderr
    assert 3.5 < took < 6.5, f"gave up after {took:.1f}s"


def _reader_names(metrics: str) -> set[str]:
    """The reader names a writer's /metrics lists now."""
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as resp:
        return set(re.findall(r'^factstream_reader_buffered_commands\{.*name="([^"]*)"', resp.read().decode(), re.M))


def test_the_readers_listed_are_those_at_the_end_of_the_interval(endpoints: dict[str, Any]) -> None:
    """--metrics is read at the start (to fail at once) and again at the end: a reader that came during the
    interval is listed, one that left is not."""
    early = start("tail", endpoints["target"], "--name", "early-reader")
    late = None
    try:
        deadline = time.monotonic() + 20
        while "early-reader" not in _reader_names(endpoints["metrics"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        status = start("status", endpoints["target"], "--interval", "8", "--json", "--metrics", endpoints["metrics"])
        began = time.monotonic()
        time.sleep(1.0)
        late = start("tail", endpoints["target"], "--name", "late-reader")
        stop(early)  # gone before the interval ends
        while time.monotonic() < began + 7:
            if "late-reader" in _reader_names(endpoints["metrics"]):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the late reader did not connect within the interval (a loaded machine?)")
        assert status.poll() is None, "status ended before the late reader came"
        out, err = status.communicate(timeout=60)
        assert status.returncode == 0, err
        names = {r["name"] for r in json.loads(out)["readers"]}
        assert "late-reader" in names and "early-reader" not in names, names
    finally:
        for proc in (early, late):
            if proc is not None and proc.returncode is None:
                stop(proc)


def test_redact_about_hides_what_redact_url_hides() -> None:
    """The masking status uses is at least as strong as redact_url on every URL test_redaction holds."""
    from test_redaction import SECRET, URL_ONLY, URLS

    from factstream.redaction import redact_about, redact_url, url_passwords

    for given, _ in [*URLS, *URL_ONLY]:
        assert SECRET not in redact_about(given, given), given
        assert SECRET not in redact_about(f"cannot read {given}: refused", given), given
        for password in url_passwords(given):  # quoted back bare, as a driver or urllib does
            assert password not in redact_about(f"bad port {password!r} in {given}", given), (given, password)
        assert redact_about(redact_url(given), given) == redact_url(given)
