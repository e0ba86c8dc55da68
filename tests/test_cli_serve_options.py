"""``factstream serve`` refuses options that would do nothing, and names the option to change when it cannot listen.

Each case runs the installed executable as a user would. A refused combination is one line, exit 2,
before anything is opened: no database file is made and no carrier is contacted (the Redis and NATS
URLs below point at closed ports, which would answer exit 1 if they were tried).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_run import cli, free_port, no_traceback

REDIS = ("--redis", "redis://127.0.0.1:1")
NATS = ("--nats", "nats://127.0.0.1:1")

#: (options given, what the one line must say). Each option was accepted and silently ignored.
MISPLACED = [
    (("--rate", "300"), "--rate needs --produce"),
    (("--duration", "5"), "--duration needs --produce"),
    (("--duration", "0"), "--duration needs --produce"),  # the value of the default, but given
    (("--rollback-rate", "0.2"), "--rollback-rate needs --produce"),
    (("--seed", "0"), "--seed needs --produce"),
    (("--nats-replicas", "3"), "--nats-replicas needs --nats"),
    (("--nats-max-age", "60"), "--nats-max-age needs --nats"),
    ((*REDIS, "--nats-max-age", "60"), "--nats-max-age needs --nats"),
    ((*REDIS, "--port", "9092"), "--port sets the TCP listener's port, which --redis replaces"),
    ((*REDIS, "--port=0"), "--port sets the TCP listener's port, which --redis replaces"),
    ((*REDIS, "--host", "0.0.0.0"), "--host sets the TCP listener's address, which --redis replaces"),
    ((*REDIS, "--tls-handshake-timeout", "3"), "--tls-handshake-timeout sets TLS on the TCP listener, which --redis"),
    ((*NATS, "--port", "9092"), "--port sets the TCP listener's port, which --nats replaces"),
    ((*NATS, "--ping-interval", "2"), "--ping-interval applies to the TCP listener and --redis, not to --nats"),
    ((*NATS, "--timeout", "30"), "--timeout applies to the TCP listener and --redis, not to --nats"),
    ((*NATS, "--max-buffered", "50"), "--max-buffered applies to the TCP listener and --redis, not to --nats"),
    ((*REDIS, *NATS), "give only one carrier"),
    (("--tls-handshake-timeout", "3"), "--tls-handshake-timeout needs --tls-cert"),
]


@pytest.mark.parametrize("given, complaint", MISPLACED, ids=[" ".join(g) for g, _ in MISPLACED])
def test_an_option_that_would_do_nothing_is_refused(tmp_path: Path, given: tuple[str, ...], complaint: str) -> None:
    out = cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", *given, timeout=30)
    assert out.returncode == 2 and no_traceback(out.stderr), out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("factstream serve: ") and complaint in lines[0], out.stderr
    assert not os.path.exists(tmp_path / "w.db")  # refused before anything was opened


@pytest.mark.parametrize("carrier", [REDIS, NATS])
@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key", "--tls-client-ca"])
def test_listener_tls_files_are_refused_with_a_carrier_pointing_at_its_tls_url(
        tmp_path: Path, carrier: tuple[str, str], flag: str) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("not read\n")
    out = cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", *carrier, flag, str(pem), timeout=30)
    assert out.returncode == 2 and no_traceback(out.stderr), out
    assert f"{flag} sets TLS on the TCP listener, which {carrier[0]} replaces" in out.stderr, out.stderr
    assert ("rediss://" if carrier == REDIS else "tls://") in out.stderr


def test_tls_key_without_tls_cert_is_refused(tmp_path: Path) -> None:
    """It was ignored, and the listener ran in plaintext."""
    key = tmp_path / "k.pem"
    key.write_text("not read\n")
    out = cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--tls-key", str(key), timeout=30)
    assert out.returncode == 2 and "--tls-key needs --tls-cert" in out.stderr, out.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 some other process holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def one_line(out: object) -> str:
    stderr = getattr(out, "stderr")
    assert getattr(out, "returncode") == 1 and no_traceback(stderr), out
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("factstream serve: "), stderr
    return lines[0]


def test_a_metrics_port_in_use_names_metrics_port(tmp_path: Path, taken_port: int) -> None:
    """It said 'choose another with --port', an option that was not the problem."""
    line = one_line(cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--port", "0",
                        "--metrics-port", str(taken_port), timeout=30))
    assert f"--metrics-port {taken_port}: address already in use on 127.0.0.1:{taken_port}" in line, line
    assert "choose another --metrics-port" in line and "with --port" not in line


def test_a_listen_port_in_use_names_port(tmp_path: Path, taken_port: int) -> None:
    line = one_line(cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--port", str(taken_port), timeout=30))
    assert f"--port {taken_port}: address already in use on 127.0.0.1:{taken_port}" in line, line
    assert "choose another --port (or 0 to pick a free one)" in line


@pytest.mark.parametrize("host, complaint", [
    ("nohost.invalid", "--host nohost.invalid: cannot resolve that name"),  # it said only "Name or service not known"
    ("192.0.2.1", "--host 192.0.2.1: not an address of this machine"),  # TEST-NET-1: never local
])
def test_a_host_it_cannot_listen_on_names_host(tmp_path: Path, host: str, complaint: str) -> None:
    line = one_line(cli("serve", "--db", f"sqlite:///{tmp_path}/w.db", "--host", host, "--port", str(free_port()),
                        timeout=30))
    assert complaint in line and "0.0.0.0 for all of them" in line, line
