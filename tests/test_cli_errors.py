"""The CLI's error boundary: one clear line and a non-zero exit for each user mistake, no traceback
(unless --debug or -vv), no password in any output, Ctrl-C exits 130 and stops child processes."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import time
import uuid
from typing import Any

import pytest

from cli_run import cli, no_traceback, start
from conftest import PG_HOST, PG_PORT, PG_START, PG_USER, require_service


def one_error_line(out: subprocess.CompletedProcess[str], prog: str) -> str:
    assert out.returncode != 0, out
    assert no_traceback(out.stderr), out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"factstream {prog}: ")
    return lines[0]


@pytest.mark.postgres
def test_postgres_database_that_does_not_exist() -> None:
    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    missing = f"nosuch_{uuid.uuid4().hex[:8]}"
    url = f"postgresql://{PG_USER}:s3cret-pw@{PG_HOST}:{PG_PORT}/{missing}"
    for cmd in (["serve", "--db", url, "--port", "0"], ["positions", "--db", url]):
        line = one_error_line(cli(*cmd), cmd[0])
        assert f'database "{missing}" does not exist' in line
        assert "s3cret-pw" not in line


def test_unreachable_database_names_it() -> None:
    port = _free_port()
    url = f"postgresql://postgres:hunter2@127.0.0.1:{port}/x"
    line = one_error_line(cli("serve", "--db", url, "--port", "0"), "serve")
    assert f"127.0.0.1:{port}" in line and "hunter2" not in line and "***" in line


def test_bad_sqlite_path() -> None:
    line = one_error_line(cli("serve", "--db", "sqlite:////no/such/dir/x.db", "--port", "0"), "serve")
    assert "/no/such/dir/x.db" in line


def test_port_already_in_use(tmp_path: Any) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = one_error_line(cli("serve", "--db", f"sqlite:///{tmp_path}/a.db", "--port", str(port)), "serve")
    assert "address already in use" in line and str(port) in line and "--port" in line


def test_missing_tls_cert_file_is_named(tmp_path: Any) -> None:
    missing = str(tmp_path / "nope" / "cert.pem")
    out = cli("serve", "--db", f"sqlite:///{tmp_path}/a.db", "--port", "0", "--tls-cert", missing)
    line = one_error_line(out, "serve")
    assert out.returncode == 2 and missing in line and "--tls-cert" in line
    out = cli("tail", "127.0.0.1:9", "--cafile", missing)
    assert missing in one_error_line(out, "tail")


def _self_signed(tmp_path: Any, name: str, *passphrase: str) -> tuple[str, str]:
    """(certificate, key) files made by openssl; the key encrypted when a passphrase is given."""
    cert, key = str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key")
    secret = ["-passout", f"pass:{passphrase[0]}"] if passphrase else ["-nodes"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", *secret, "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    return cert, key


def test_unusable_tls_files_say_which_file_and_why(tmp_path: Any) -> None:
    """Not OpenSSL's "[SSL] PEM lib", and no passphrase prompt on the terminal for an encrypted key."""
    cert, key = _self_signed(tmp_path, "a")
    _, other_key = _self_signed(tmp_path, "b")
    enc_cert, enc_key = _self_signed(tmp_path, "c", "s3cret")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [
        (("--tls-cert", cert), f"{cert} holds a certificate but no private key: give the key file too (--tls-key)"),
        (("--tls-cert", cert, "--tls-key", other_key),
         f"the private key in {other_key} does not belong to the certificate in {cert}"),
        (("--tls-cert", str(junk), "--tls-key", key), f"{junk} holds no PEM certificate"),
        (("--tls-cert", cert, "--tls-key", str(junk)), f"{junk} holds no PEM private key"),
        (("--tls-cert", enc_cert, "--tls-key", enc_key), f"the private key in {enc_key} is encrypted"),
        (("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(junk)), f"{junk} holds no PEM CA certificate"),
    ]
    for args, says in cases:
        out = cli("serve", "--db", f"sqlite:///{tmp_path}/a.db", "--port", "0", *args, stdin="")
        line = one_error_line(out, "serve")
        assert out.returncode == 2 and says in line and "PEM lib" not in line, (args, out.stderr)
        assert "pass phrase" not in out.stdout + out.stderr and "s3cret" not in line
    line = one_error_line(cli("tail", "127.0.0.1:9", "--cafile", str(junk)), "tail")
    assert f"{junk} holds no PEM CA certificate" in line


def test_truncated_gzip_is_one_line(tmp_path: Any) -> None:
    bad = tmp_path / "cut.log.gz"
    bad.write_bytes(gzip.compress(b'RDATA caches m 1 ["f",null,1]\n' * 1000)[:60])
    out = cli("decode", str(bad))
    assert out.returncode != 0 and no_traceback(out.stderr)
    assert "truncated" in out.stderr or "corrupt" in out.stderr or "cut.log.gz" in out.stderr


def test_debug_and_vv_show_the_traceback(tmp_path: Any) -> None:
    for flags in (["--debug"], ["-vv"]):
        out = cli("serve", "--db", "sqlite:////no/such/dir/x.db", "--port", "0", *flags)
        assert out.returncode == 1 and "Traceback" in out.stderr and "DatabaseError" in out.stderr


def test_debug_traceback_masks_the_password() -> None:
    url = f"postgresql://postgres:hunter2@127.0.0.1:{_free_port()}/x"
    out = cli("--debug", "serve", "--db", url, "--port", "0")
    assert out.returncode == 1 and "Traceback" in out.stderr and "hunter2" not in out.stderr


def test_usage_errors_exit_2_with_argparse_message() -> None:
    out = cli("tail", "not-a-target")
    assert out.returncode == 2 and "expected HOST:PORT" in out.stderr and no_traceback(out.stderr)
    out = cli("no-such-command")
    assert out.returncode == 2 and no_traceback(out.stderr)


def test_an_option_is_taken_only_by_its_full_name() -> None:
    """A mistyped option is named as unknown, not read as the longer option it begins (argparse's default)."""
    out = cli("tail", "--connect", "127.0.0.1:1")  # once read as --connect-timeout: "invalid float value"
    assert out.returncode == 2 and no_traceback(out.stderr)
    assert "unrecognized arguments: --connect" in out.stderr and "float" not in out.stderr
    out = cli("logs", "parse", "--ou", "x", "y")  # nested subcommands too
    assert out.returncode == 2 and "--out" in out.stderr and no_traceback(out.stderr)
    # The command that did not know the option says so, with its own usage (not the top parser's).
    out = cli("record", "127.0.0.1:1", "--outdir", "x")
    assert out.returncode == 2 and no_traceback(out.stderr)
    assert out.stderr.startswith("usage: factstream record "), out.stderr
    assert "factstream record: error: unrecognized arguments: --outdir x (see factstream record --help)" in out.stderr
    out = cli("logs", "parse", "x", "--out", "y", "--bogus")
    assert "factstream logs parse: error: unrecognized arguments: --bogus" in out.stderr, out.stderr
    out = cli("tail", "--connect-timeout", "0.2", "127.0.0.1:1")  # the full name still works: a clear failure to connect
    assert out.returncode != 2 and no_traceback(out.stderr), out.stderr


#: (command line, the complaint): values an option cannot mean. Taken as given they hung a command
#: (status --interval -1, positions --wait -1, tail --ping-interval 0), bound another port than the one
#: asked for (serve --port 99999 listened on 34463), ended in an "internal error" (--metrics-port 70000)
#: or ran a demo that verified nothing and said PASS (--readers 0, --duration -1).
NONSENSE = [
    (("serve", "--port", "99999"), "argument --port: a port is 0-65535 (0 picks a free one), got 99999"),
    (("serve", "--metrics-port", "70000"), "argument --metrics-port: a port is 0-65535"),
    (("serve", "--port", "http"), "argument --port: expected a port number, got 'http'"),
    (("serve", "--produce", "--rate", "-5"), "argument --rate: must be at least 0, got -5"),
    (("serve", "--produce", "--rate", "nan"), "argument --rate: expected a finite number, got 'nan'"),
    (("serve", "--produce", "--duration", "-1"), "argument --duration: must be more than 0 (or 0: never stop), got -1"),
    (("serve", "--produce", "--rollback-rate", "2"), "argument --rollback-rate: must be a share below 1"),
    (("serve", "--ping-interval", "0"), "argument --ping-interval: must be more than 0, got 0"),
    (("serve", "--max-buffered", "0"), "argument --max-buffered: must be at least 1, got 0"),
    (("tail", "127.0.0.1:1", "--connect-timeout", "-1"), "argument --connect-timeout: must be more than 0, got -1"),
    (("tail", "127.0.0.1:1", "--ping-interval", "0"), "argument --ping-interval: must be more than 0"),
    (("tail", "127.0.0.1:1", "--from", "-4"), "argument --from: must be at least 0, got -4"),
    (("status", "127.0.0.1:1", "--interval", "-1"), "argument --interval: must be more than 0, got -1"),
    (("positions", "--connect", "127.0.0.1:1", "--wait", "-1"), "argument --wait: must be more than 0, got -1"),
    (("pub", "127.0.0.1:1", "--wait", "-1", "PING 1"), "argument --wait: must be more than 0 (or 0: do not wait)"),
    (("record", "127.0.0.1:1", "--rotate-time", "0"), "argument --rotate-time: must be more than 0, got 0"),
    (("record", "127.0.0.1:1", "--flush-interval", "1x"), "argument --flush-interval: expected a duration like 30"),
    (("demo", "--readers", "0"), "argument --readers: must be at least 1, got 0"),
    (("demo", "--duration", "-1"), "argument --duration: must be more than 0, got -1"),
    (("demo", "--rollback-rate", "1"), "argument --rollback-rate: must be a share below 1"),
    (("decode", "--max-errors", "-1", "x"), "argument --max-errors: must be at least 0, got -1"),
    (("logs", "report", "x", "--bucket", "0"), "argument --bucket: must be at least 1, got 0"),
    (("synapse", "watch", "--redis", "redis://127.0.0.1:1", "--server-name", "x", "--frozen-after", "0"),
     "argument --frozen-after: must be more than 0, got 0"),
]


@pytest.mark.parametrize("args, complaint", NONSENSE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in NONSENSE])
def test_an_option_value_it_cannot_mean_is_a_usage_error(tmp_path: Any, args: tuple[str, ...], complaint: str) -> None:
    db = ("--db", f"sqlite:///{tmp_path}/w.db") if args[0] == "serve" else ()
    out = cli(*args, *db, timeout=30)
    assert out.returncode == 2 and no_traceback(out.stderr), out
    assert f"error: {complaint}" in out.stderr, out.stderr
    assert not os.path.exists(tmp_path / "w.db")  # refused before anything was opened


def test_durations_take_units_and_zero_only_where_it_means_something(tmp_path: Any) -> None:
    out = cli("tail", "127.0.0.1:1", "--connect-timeout", "2s")  # a unit is taken: then a clear failure
    assert out.returncode == 1 and "connection refused" in out.stderr, out.stderr
    out = cli("tail", "127.0.0.1:1", "--connect-timeout", "0")
    assert out.returncode == 2 and "must be more than 0, got 0" in out.stderr and "(or 0" not in out.stderr


@pytest.mark.parametrize("cmd", [("tail", "127.0.0.1:1"), ("positions",)])
def test_a_reader_never_creates_the_sqlite_database_it_was_given(tmp_path: Any, cmd: tuple[str, ...]) -> None:
    """A mistyped --db path was created (an empty database for a reader to wait on), and the error
    shown was the writer's absence; now the path is named, and nothing is created."""
    missing = tmp_path / "typo.db"
    out = cli(*cmd, "--db", f"sqlite:///{missing}")
    assert out.returncode == 2, out  # a missing file named by an option: a usage error, as docs/cli.md says
    line = one_error_line(out, cmd[0])
    assert f"no database at '{missing}' ({cmd[0]} never creates one); give the writer's --db URL" in line
    assert not missing.exists()
    line = one_error_line(cli(*cmd, "--db", "sqlite:///:memory:"), cmd[0])
    assert "sqlite:///:memory: is always empty" in line


@pytest.mark.parametrize("cmd", [("tail", "127.0.0.1:1"), ("positions",)])
def test_three_slashes_before_an_absolute_path_are_answered_with_four(tmp_path: Any, cmd: tuple[str, ...]) -> None:
    """``sqlite:///tmp/x.db`` names tmp/x.db in the current directory; one who meant /tmp/x.db was told only
    "no database at 'tmp/x.db'": now the directory it was looked in is named, and the URL of the file that exists."""
    from cli_run import ENV, FACTSTREAM

    meant = tmp_path / "w.db"
    meant.write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = str(meant).lstrip("/")
    out = subprocess.run([FACTSTREAM, *cmd, "--db", f"sqlite:///{relative}"], capture_output=True, text=True,
                         timeout=60, env=ENV, cwd=elsewhere)
    assert out.returncode == 2, out
    line = one_error_line(out, cmd[0])
    assert f"no database at '{relative}' in {elsewhere} ({cmd[0]} never creates one)" in line, line
    assert f"for the file {meant}, write sqlite:///{meant} (four slashes)" in line, line
    assert not (elsewhere / relative).exists() and list(elsewhere.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


@pytest.mark.parametrize("cmd", [
    ["events-demo", "--events", "500000"],
    ["demo", "--duration", "30", "--no-progress"],
])
def test_ctrl_c_stops_the_children_and_exits_130(cmd: list[str]) -> None:
    # Ctrl-C in a terminal signals the whole foreground process group: do exactly that.
    proc = start(*cmd, start_new_session=True)
    deadline = time.monotonic() + 30
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < 2:
        time.sleep(0.5)
        kids = [k for k in _children(proc.pid)]
    time.sleep(1.5)
    grandkids = [g for k in kids for g in _children(k)]
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert no_traceback(err) and "IndexError" not in err, err
    time.sleep(0.5)
    assert kids and not [k for k in kids + grandkids if _alive(k)]
    assert "logs kept" not in err


def test_ctrl_c_on_a_signal_to_the_parent_alone_stops_children() -> None:
    proc = start("events-demo", "--events", "500000")
    deadline = time.monotonic() + 30
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < 2:
        time.sleep(0.5)
        kids = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and no_traceback(err), err
    time.sleep(0.5)
    assert kids and not [k for k in kids if _alive(k)]


@pytest.mark.parametrize("cmd", [["demo", "--duration", "30"], ["events-demo", "--events", "500000"]])
def test_ctrl_c_in_a_terminal(cmd: list[str]) -> None:
    """A real ^C typed into a pseudo-terminal: the terminal signals the foreground process group."""
    import pty
    import select

    from cli_run import ENV, FACTSTREAM

    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.execve(FACTSTREAM, [FACTSTREAM, *cmd], ENV)
    output = b""

    def read_for(seconds: float) -> None:
        nonlocal output
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                output += chunk

    try:
        read_for(6)
        kids = _children(pid)
        os.write(fd, b"\x03")  # ^C
        read_for(30)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = output.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 130, text[-2000:]
    assert "Traceback" not in text and "IndexError" not in text, text[-2000:]
    time.sleep(0.5)
    assert kids and not [k for k in kids if _alive(k)]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_serve_ctrl_c_exits_130_and_sigterm_is_a_clean_stop(tmp_path: Any, sig: int, status: int) -> None:
    proc = start("serve", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--port", "0", "--status")
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first status line: it is listening
    assert line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert no_traceback(err), err


def test_a_logged_traceback_needs_vv_or_debug() -> None:
    """-v is more logging, not tracebacks: a record logged with its exception (py4j's failed calls,
    log.exception) ends with the exception's one line unless -vv/--debug (docs/cli.md)."""
    import logging

    from factstream.cli import RedactingFormatter

    try:
        raise ValueError("cannot reach postgresql://u:hunter2@h/x")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "query failed", None, __import__("sys").exc_info())
    quiet = RedactingFormatter("%(message)s", tracebacks=False).format(record)
    assert quiet == "query failed\n  ValueError: cannot reach postgresql://u:***@h/x", quiet
    record.exc_text = None
    full = RedactingFormatter("%(message)s", tracebacks=True).format(record)
    assert "Traceback" in full and "hunter2" not in full
