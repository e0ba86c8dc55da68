"""URLs on the command line: every password masked on every path, URLs given where HOST:PORT belongs,
TLS asked for and not given, and connection failures said so a user can act on them.

Against a private nats-server with a user and password (JetStream), the shared Redis (no password) and
plain TCP ports, through the installed ``factstream`` executable.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_run import cli, no_traceback, start, stop
from conftest import REDIS_HOST, REDIS_PORT, REDIS_START, require_service
from nats_helpers import NatsServer

SECRET = "Pw-n0t-f0r-y0ur-eyes"


def said(out: subprocess.CompletedProcess[str]) -> str:
    """stdout + stderr, checked for what every failure must not show."""
    text = out.stdout + out.stderr
    assert SECRET not in text, text
    assert no_traceback(text) and "internal error" not in text, text
    return text


class AuthNatsServer(NatsServer):
    """A private JetStream server that requires user ``u`` with password SECRET."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--user", "u", "--pass", SECRET]


@pytest.fixture(scope="module")
def nats_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthNatsServer]:
    server = AuthNatsServer(tmp_path_factory.mktemp("nats") / "store")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_plain() -> str:
    require_service("Redis", REDIS_HOST, REDIS_PORT, REDIS_START)
    return f"{REDIS_HOST}:{REDIS_PORT}"


def cluster(server: AuthNatsServer, *ports: int) -> str:
    """A server list: the live server first, then dead ones, each with the password."""
    return ",".join(f"nats://u:{SECRET}@127.0.0.1:{p}" for p in (server.port, *ports))


# --- finding 1: every server of a NATS server list masked, on every output path ---------------------------


def test_a_nats_server_list_is_masked_on_every_output_path(nats_auth: AuthNatsServer, tmp_path: Path) -> None:
    url = cluster(nats_auth, 1)
    name = f"t-{uuid.uuid4().hex[:8]}"
    writer = start("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--nats", url, "--server-name", name,
                   "--status", "--produce", "--rate", "200", "-v")
    try:
        assert writer.stdout is not None
        listening = writer.stdout.readline()
        assert json.loads(listening)["nats"].count(":***@") == 2, listening
        time.sleep(1)
        status = cli("status", "--nats", url, "--server-name", name, "--interval", "0.5")
        assert status.returncode == 0, said(status)
        assert said(status).count(":***@") == 2
        as_json = cli("status", "--nats", url, "--server-name", name, "--interval", "0.5", "--json")
        assert as_json.returncode == 0 and SECRET not in said(as_json)
        rec = cli("record", "--nats", url, "--server-name", name, "--duration", "1", "--dir", str(tmp_path / "rec"))
        assert rec.returncode == 0, said(rec)
        (capture,) = (tmp_path / "rec").iterdir()
        header = gzip.decompress(capture.read_bytes()).decode().splitlines()[0]
        assert "# connected nats" in header and header.count(":***@") == 2 and SECRET not in header, header
    finally:
        out, err = stop(writer)
    assert SECRET not in listening + out + err
    assert "serving" in err and err.count(":***@") >= 2, err  # the start-up lines (-v)


def test_a_dead_nats_server_list_is_masked_in_the_error(nats_auth: AuthNatsServer, tmp_path: Path) -> None:
    dead = f"nats://u:{SECRET}@127.0.0.1:1,nats://u:{SECRET}@127.0.0.1:2"
    for cmd in (["tail", "--nats", dead, "--server-name", "hs", "--count", "1"],
                ["status", "--nats", dead, "--server-name", "hs"],
                ["serve", "--db", f"sqlite:///{tmp_path}/d.db", "--nats", dead, "--server-name", "hs"]):
        out = cli(*cmd)
        assert out.returncode == 1 and said(out).count(":***@") == 2, (cmd, out.stderr)


# --- finding 4: a NATS token and a Redis password without its colon ------------------------------------


def test_a_nats_token_is_masked(nats_auth: AuthNatsServer) -> None:
    out = cli("tail", "--nats", f"nats://{SECRET}@127.0.0.1:{nats_auth.port}", "--server-name", "hs", "--count", "1")
    assert out.returncode == 1 and f"nats://***@127.0.0.1:{nats_auth.port}" in said(out)
    assert "refused the credentials" in out.stderr


def test_a_redis_password_without_its_colon_is_masked_and_explained(redis_plain: str) -> None:
    for cmd in (["tail"], ["status"], ["pub", "PING 1"]):
        out = cli(cmd[0], "--redis", f"redis://{SECRET}@{redis_plain}", "--server-name", "hs", *cmd[1:])
        assert out.returncode == 1 and f"redis://***@{redis_plain}" in said(out), out.stderr
        if cmd[0] != "tail":  # tail still words it through serve's check_redis
            assert "after a colon" in out.stderr, out.stderr


# --- finding 2: a URL where HOST:PORT belongs --------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["tail", "status", "record", "positions", "pub"])
def test_a_url_given_as_host_port_is_a_usage_error(cmd: str, tmp_path: Path) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:6379"
    argv = {"tail": [cmd, url], "status": [cmd, url], "record": [cmd, url, "--dir", str(tmp_path / "rec")],
            "positions": [cmd, "--connect", url], "pub": [cmd, url, "PING 1"]}[cmd]
    started = time.monotonic()
    out = cli(*argv)
    assert out.returncode == 2 and time.monotonic() - started < 5, out.stderr
    assert "'redis://:***@127.0.0.1:6379' is a URL: use --redis URL" in said(out), out.stderr
    assert not (tmp_path / "rec").exists()  # record made no capture named after it


def test_a_url_of_a_carrier_the_command_lacks_names_what_it_takes() -> None:
    out = cli("pub", f"nats://u:{SECRET}@127.0.0.1:4222", "PING 1")
    assert out.returncode == 2 and "takes HOST:PORT of a TCP writer" in said(out) and "--redis URL" in out.stderr
    assert "--nats" not in out.stderr


def test_user_and_password_given_as_host_port_is_a_usage_error() -> None:
    out = cli("tail", f"u:{SECRET}@127.0.0.1:19092")
    assert out.returncode == 2 and "'u:***@127.0.0.1:19092' holds a user or password" in said(out)


def test_an_unknown_host_fails_at_once() -> None:
    started = time.monotonic()
    out = cli("tail", "nohost.invalid:9092")  # --connect-timeout is 10 s by default
    assert out.returncode == 1 and time.monotonic() - started < 5
    assert "unknown host 'nohost.invalid'" in said(out)


# --- finding 3: argparse's own errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["positions", "--nats", f"nats://u:{SECRET}@127.0.0.1:14222", "--server-name", "hs"],
        ["pub", "PING 1", "--nats", f"nats://u:{SECRET}@127.0.0.1:14222"],
        ["tail", "127.0.0.1:19092", "--rediss", f"redis://:{SECRET}@h:1"],
        ["synapse", "check", "--redis", f"redis://:{SECRET}@h:1"],
        ["tail", "127.0.0.1:19092", "--connect-timeout", f"redis://:{SECRET}@h:1"],
    ],
)
def test_argparse_errors_mask_the_password(argv: list[str]) -> None:
    out = cli(*argv)
    assert out.returncode == 2 and ":***@" in said(out), out.stderr


# --- finding 13: TLS asked for, not given ---------------------------------------------------------------------


def test_tls_url_to_a_nats_server_without_tls_is_refused(nats_auth: AuthNatsServer) -> None:
    url = f"tls://u:{SECRET}@127.0.0.1:{nats_auth.port}"
    for cmd in (["status", "--nats", url, "--server-name", "hs", "--interval", "0.2"],
                ["tail", "--nats", url, "--server-name", "hs", "--count", "1"]):
        out = cli(*cmd)  # it used to connect in plaintext, sending the password in the clear
        assert out.returncode == 1 and "does not offer TLS" in said(out), out.stderr


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["status", "--redis", "redis://127.0.0.1:1", "--server-name", "hs", "--tls"], "rediss://"),
        (["status", "--nats", "nats://127.0.0.1:1", "--server-name", "hs", "--cafile", "/etc/hosts"], "tls://"),
        (["pub", "--redis", "redis://127.0.0.1:1", "--server-name", "hs", "--insecure", "PING 1"], "rediss://"),
    ],
)
def test_tcp_tls_options_with_a_carrier_are_refused(argv: list[str], complaint: str) -> None:
    out = cli(*argv)
    assert out.returncode == 2 and "only to TCP" in said(out) and complaint in out.stderr, out.stderr


# --- findings 19, 20: what went wrong, and what to do -------------------------------------------------------


def test_nats_failures_say_what_to_do(nats_auth: AuthNatsServer) -> None:
    port = nats_auth.port
    cases: list[tuple[str, int, str]] = [
        (f"nats://u:wrong-{SECRET}@127.0.0.1:{port}", 1, "refused the credentials"),
        (f"nats://127.0.0.1:{port}", 1, "requires credentials"),
        (f"http://u:{SECRET}@127.0.0.1:{port}", 2, "bad NATS URL"),
        (f"nats://u:{SECRET}@127.0.0.1:notaport", 2, "the port must be a number"),
        ("nats://nohost.invalid:4222", 1, "unknown host 'nohost.invalid'"),
        ("nats://127.0.0.1:1", 1, "nothing listens there"),
    ]
    for url, status, complaint in cases:
        out = cli("status", "--nats", url, "--server-name", "hs", "--connect-timeout", "2")
        assert out.returncode == status and complaint in said(out), (url, out.stderr)
        assert "start it with JetStream" not in out.stderr or "nothing listens" in complaint


def test_redis_failures_say_what_to_do(redis_plain: str) -> None:
    cases = [
        (f"redis://:{SECRET}@{redis_plain}", "has no password set, but the URL gives one"),
        (f"redis://{redis_plain}/99", "has no database 99"),
        ("redis://nohost.invalid:6379", "unknown host 'nohost.invalid'"),
        ("redis://127.0.0.1:1", "nothing listens there"),
    ]
    for url, complaint in cases:
        out = cli("status", "--redis", url, "--server-name", "hs", "--connect-timeout", "2")
        assert out.returncode == 1 and complaint in said(out), (url, out.stderr)
    started = time.monotonic()
    out = cli("status", "--redis", f"rediss://{redis_plain}", "--server-name", "hs", "--connect-timeout", "1")
    assert out.returncode == 1 and "plaintext port" in said(out) and time.monotonic() - started < 4, out.stderr
