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


def test_a_stream_the_writer_does_not_have_is_named(writer: tuple[str, int]) -> None:
    """--stream with a typo used to wait silently forever. With --db the tables are known: a usage
    error at once. Without, the writer's POSITIONs say which streams it has: a warning, and it goes on."""
    db_url, port = writer
    out = cli("tail", f"127.0.0.1:{port}", "--db", db_url, "--stream", "cache", "--count", "1")
    assert out.returncode == 2 and no_traceback(out.stderr), out
    assert out.stderr.strip() == ("factstream tail: no stream cache in the writer's tables (its streams: caches, "
                                  "receipts, to_device)")
    proc = start("tail", f"127.0.0.1:{port}", "--stream", "cache")
    warned: list[str] = []

    def read() -> None:
        for line in proc.stderr or ():
            warned.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not any("announced" in line for line in warned) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 130
    reader.join(10)
    for fh in (proc.stdout, proc.stderr):
        if fh is not None:
            fh.close()
    err = "".join(warned)
    assert no_traceback(err), err
    assert ("the streams the server announced are caches, receipts, to_device; --stream cache is not among them "
            "(nothing is shown for it)") in err, err
    ok = start("tail", f"127.0.0.1:{port}", "--stream", "caches", "--count", "50")
    out_ok, err_ok = ok.communicate(timeout=60)
    assert ok.returncode == 0 and len(out_ok.splitlines()) == 50 and "WARNING" not in err_ok, err_ok


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
    assert "factstream tail: the server reported: server stopping" in err  # a tail that stops says it plainly
    assert "dropped this tail" not in err, err  # the writer said it was stopping: no guess that it dropped us
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
    # What the writer said as it stopped is one of those timed WARNINGs (it was a bare line among them).
    assert any("the server reported: server stopping" in line for line in warnings), err
    assert "factstream tail: the server reported" not in err


def test_a_db_follower_dropped_for_falling_behind_catches_up_and_misses_nothing(tmp_path: Any) -> None:
    """`tail --db` stopped (SIGSTOP) while the writer produces at full speed falls behind, and stays
    stopped until the writer says it dropped it. That is not a failure: it warns, reconnects, catches up
    from the database and goes on printing the table's rows, each once, in order, then exits 0 on
    SIGTERM. (It used to exit 1 as if the writer were gone; CI met that on a slow machine.)"""
    db_url = f"sqlite:///{tmp_path}/r.db"
    proc, port = serve(db_url, "--produce", "--rate", "0", "--max-buffered", "100")
    follower = start("tail", f"127.0.0.1:{port}", "--db", db_url, "--from-start", "--stream", "caches",
                     "--server-name", "hs1")
    lines: list[str] = []
    writer_log: list[str] = []
    tail_log: list[str] = []
    dropped, warned = threading.Event(), threading.Event()

    def read(fh: Any, into: list[str], event: threading.Event | None = None, mark: str = "") -> None:
        for line in fh or ():  # read on, or a full pipe would stop the process
            into.append(line)
            if event is not None and mark in line:
                event.set()

    threads = [threading.Thread(target=read, args=(follower.stdout, lines), daemon=True),
               threading.Thread(target=read, args=(follower.stderr, tail_log, warned, " lost "), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, writer_log, dropped, "fell behind"), daemon=True),
               threading.Thread(target=read, args=(proc.stdout, []), daemon=True)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:  # rows come once it is connected
            time.sleep(0.05)
        follower.send_signal(signal.SIGSTOP)
        was_dropped = dropped.wait(60)
        follower.send_signal(signal.SIGCONT)
        assert was_dropped, "".join(writer_log)
        assert warned.wait(30), "".join(tail_log)
        time.sleep(1)
        assert follower.poll() is None, "".join(tail_log)  # dropped, and following on
        at_least = len(_table_rows(db_url, "caches"))
        deadline = time.monotonic() + 120
        while len(lines) < at_least and follower.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(15) == 0, "".join(tail_log)
    finally:
        _wind_up(follower, proc, threads)
    held = _table_rows(db_url, "caches")
    got = [(int(line.split(" ")[2]), line.split(" ", 3)[3].rstrip("\n")) for line in lines]
    assert len(got) >= at_least > 10_000 and got == held[: len(got)], (len(got), at_least, len(held))
    err = "".join(tail_log)
    lost = [line for line in tail_log if " lost " in line]
    assert all("reconnecting, and catching up from the database" in line for line in lost), err
    assert "factstream tail:" not in err and no_traceback(err), err  # no failure line


def test_a_writer_s_fell_behind_error_is_shown_with_what_to_do() -> None:
    """A peer that greets, sends a row, says ERROR client fell behind and closes: the tail prints the row,
    the reason and the hint once (not again when it finds the connection closed), and exits 1."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        def peer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"SERVER hs1\nRDATA caches master 7 [\"x\",null,1]\n"
                             b"ERROR client fell behind: more than 100 commands buffered\n")
                conn.recv(1 << 16)  # its NAME and REPLICATE, then close

        t = threading.Thread(target=peer, daemon=True)
        t.start()
        out = cli("tail", f"127.0.0.1:{port}", "--connect-timeout", "5")
        t.join(10)
    assert out.returncode == 1 and out.stdout == 'caches master 7 ["x",null,1]\n', out
    err = out.stderr
    assert "the server reported: client fell behind: more than 100 commands buffered" in err, err
    assert err.count("With --db DATABASE_URL") == 1 and "closed the connection" in err and no_traceback(err), err


def test_a_tail_without_db_dropped_for_falling_behind_says_why_and_what_to_do(tmp_path: Any) -> None:
    """A plain tail stopped (SIGSTOP) while the writer produces at full speed is dropped; on SIGCONT it
    prints what it had, says how not to lose rows next time (--db), and exits 1."""
    proc, port = serve(f"sqlite:///{tmp_path}/r.db", "--produce", "--rate", "0", "--max-buffered", "100")
    plain = start("tail", f"127.0.0.1:{port}", "--server-name", "hs1")
    writer_log: list[str] = []
    dropped = threading.Event()

    def read_writer() -> None:
        for line in proc.stderr or ():
            writer_log.append(line)
            if "fell behind" in line:
                dropped.set()

    reader = threading.Thread(target=read_writer, daemon=True)
    reader.start()
    try:
        time.sleep(1.5)
        plain.send_signal(signal.SIGSTOP)
        was_dropped = dropped.wait(60)
        plain.send_signal(signal.SIGCONT)
        assert was_dropped, "".join(writer_log)
        out, err = plain.communicate(timeout=60)
    finally:
        _wind_up(plain, proc, [reader])
    assert plain.returncode == 1 and out, err
    # The writer's ERROR waits behind the rows the tail had not read; it is read when the tail drains them
    # within the writer's grace period. Either way the tail says what to do.
    assert "closed the connection" in err and err.count("With --db DATABASE_URL") == 1, err
    assert no_traceback(err), err


def _wind_up(tail: subprocess.Popen[str], writer: subprocess.Popen[str], readers: list[threading.Thread]) -> None:
    """End a (maybe SIGSTOPped) tail and its writer, then close their pipes once the reader threads are done."""
    tail.send_signal(signal.SIGCONT)
    if tail.poll() is None:
        tail.kill()
    writer.terminate()
    writer.wait(15)
    for t in readers:
        t.join(10)
    for fh in (tail.stdout, tail.stderr, writer.stdout, writer.stderr):
        if fh is not None:
            fh.close()


def _table_rows(db_url: str, stream: str) -> list[tuple[int, str]]:
    """(token, compact JSON row) of every row a demo stream table holds, in token order."""
    import asyncio

    from factstream.demo.tables import DEMO_TABLES
    from factstream.store.database import connect

    async def read() -> list[tuple[int, str]]:
        db = await connect(db_url)
        try:
            (table,) = [t for t in DEMO_TABLES if t.stream == stream]
            rows, _, _ = await table.source(db).get_updates("master", 0, 1 << 62, 1 << 30)
            return [(int(token), json.dumps(row, separators=(",", ":"))) for token, row in rows]
        finally:
            await db.close()

    return asyncio.run(read())


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


@pytest.mark.parametrize("json_output", [False, True])
@pytest.mark.parametrize("filtered", [False, True])
def test_a_read_handed_over_after_the_count_prints_nothing(json_output: bool, filtered: bool) -> None:
    """``tail --count 3 --json`` printed 4 rows now and then: the reader task can hand over one more read
    before it is cancelled, and the per-row path then printed its first row before checking the room left."""
    import argparse
    import asyncio
    import io

    from factstream.cli.tail import DEFAULT_FORMAT, Output, RawTail
    from factstream.cli.tailformat import RowFormat

    async def run() -> tuple[int, bytes]:  # the filter's watch keeps a timer on the running loop
        sink = io.BytesIO()
        output = Output(RowFormat(DEFAULT_FORMAT, json_output=json_output), 3, sink)
        args = argparse.Namespace(streams=["caches"] if filtered else None, writers=None, retry=0)
        tail = RawTail(args, output)
        lines = b"".join(b'RDATA caches master %d ["k",null,%d]\n' % (i, i) for i in range(1, 6))
        cut = lines.index(b"RDATA caches master 4")
        tail.chunk(lines[:cut])  # three rows: the count is reached
        assert output.full and output.seen == 3 and len(sink.getvalue().splitlines()) == 3
        tail.chunk(lines[cut:])  # the read taken before the reader was cancelled
        return output.seen, sink.getvalue()

    seen, printed = asyncio.run(run())
    assert seen == 3 and len(printed.splitlines()) == 3, printed
