"""``factstream synapse check`` / ``watch`` as a user meets them: wrong database, wrong channel, wrong options.

Fast companions of test_synapse_check.py and test_synapse_watch.py (which run
Synapse itself): the installed executable against the real Redis and
PostgreSQL, with a factstream ``serve --redis`` as the writer that answers a
watch's REPLICATE the way a Synapse writer does. A check must never call a
database healthy that is not Synapse's; a watch must never call a channel
healthy on which no writer spoke, must stop on time, and must name the option
a user has to change.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli, free_port, no_traceback, start, stop

def reports(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def watch(redis: str, server_name: str, *extra: str, timeout: float = 30) -> tuple[int, str, str, float]:
    """Run ``synapse watch`` to completion: (exit status, stdout, stderr, seconds it ran)."""
    began = time.monotonic()
    proc = cli("synapse", "watch", "--redis", redis, "--server-name", server_name, *extra, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began


@pytest.fixture
def redis_writer(redis_url: str, channel_prefix: str, tmp_path: Path) -> Iterator[str]:
    """A factstream writer on the channel ``channel_prefix``, subscribed (so it answers REPLICATE)."""
    proc = start("serve", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--redis", redis_url,
                 "--server-name", channel_prefix, "--status")
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"serve exited: {stop(proc)[1]}"
            if json.loads(line).get("subscribed") is True:
                break
        else:
            raise AssertionError("serve never subscribed to Redis")
        yield channel_prefix
    finally:
        stop(proc)


@pytest.mark.redis
def test_watch_on_a_channel_no_writer_speaks_is_silent_not_healthy(redis_url: str, channel_prefix: str) -> None:
    """A mistyped --server-name: Redis answers, nobody else does. Before: "healthy": true and exit 0."""
    code, out, err, _ = watch(redis_url, channel_prefix, "--interval", "1", "--duration", "2.5", "--json")
    assert code == 1, (out, err)
    docs = reports(out)
    assert docs and all(d["healthy"] is False for d in docs), docs
    assert docs[0]["redis_subscribed"] is True and docs[0]["problems"] == []  # 1 s in: still waiting for answers
    problems = docs[-1]["problems"]
    assert isinstance(problems, list) and len(problems) == 1, problems
    silent: dict[str, str] = problems[0]
    assert silent["kind"] == "silent" and channel_prefix in silent["summary"]
    assert "--server-name" in silent["summary"] and "server_name in homeserver.yaml" in silent["summary"]
    assert err.count("nothing heard from any writer") == 1 and no_traceback(err), err  # said once on stderr too

    code, out, err, _ = watch(redis_url, channel_prefix, "--interval", "1", "--duration", "1")
    assert code == 1 and "SILENT: nothing heard from any writer" in out, (out, err)
    assert "healthy" not in out.splitlines()[0], out


@pytest.mark.redis
def test_watch_a_writer_answers_is_healthy_and_duration_is_honoured(redis_url: str, redis_writer: str) -> None:
    """--duration 2 with the default --interval 5: one report at 2 s, not at 5 s."""
    code, out, err, took = watch(redis_url, redis_writer, "--duration", "2", "--json")
    assert code == 0, (out, err)
    [doc] = reports(out)
    assert doc["healthy"] is True and doc["problems"] == [] and doc["writers"], doc
    assert 2 <= took < 3.5, took


@pytest.mark.redis
def test_watch_that_never_reaches_redis_could_not_watch(redis_url: str, channel_prefix: str) -> None:
    """Redis refused for the whole --duration: exit 2 (could not watch), as the help says; not 1 (unhealthy)."""
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    # refused port; refused credentials: the last line says which, not only "see the errors above"
    for url, why in ((dead, "last error: ConnectionError"), (redis_url.replace("redis://", "redis://:s3cret@"),
                                                              "last error: AuthenticationError")):
        code, out, err, took = watch(url, channel_prefix, "--interval", "1", "--duration", "1.5", "--json")
        assert code == 2, (url, out, err)
        last = err.splitlines()[-1]
        assert last.startswith("factstream synapse watch: could not watch: never subscribed to "), err
        assert why in last, last
        assert "s3cret" not in out + err and no_traceback(err)
        assert took < 3.5, took


@pytest.mark.redis
def test_watch_names_the_option_to_change(redis_url: str, channel_prefix: str) -> None:
    base = ("synapse", "watch", "--redis", redis_url, "--server-name", channel_prefix, "--duration", "1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli(*base, "--metrics-port", str(port))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"factstream synapse watch: --metrics-port {port}: ") and "in use" in proc.stderr
    for host in ("nohost.invalid", "192.0.2.1"):  # no such name; not an address of this machine
        proc = cli(*base, "--metrics-port", "0", "--metrics-host", host)
        assert proc.returncode == 2, (host, proc.stderr)
        assert proc.stderr.startswith(f"factstream synapse watch: --metrics-host '{host}': "), proc.stderr
    for db in ("/var/lib/synapse/homeserver.db", "sqlite:///homeserver.db"):
        proc = cli(*base, "--db", db)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "--db" in proc.stderr and "postgresql://" in proc.stderr and "sqlite:///" not in proc.stderr


@pytest.mark.redis
def test_watch_says_where_metrics_on_port_0_are(redis_url: str, channel_prefix: str) -> None:
    proc = start("synapse", "watch", "--redis", redis_url, "--server-name", channel_prefix, "--metrics-port", "0")
    try:
        assert proc.stderr is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stderr.readline() if proc.stderr else ""), daemon=True).start()
        try:
            line = lines.get(timeout=15)
        except queue.Empty:
            raise AssertionError("watch said nothing about where its metrics are") from None
        prefix = "factstream synapse watch: Prometheus metrics on "
        assert line.startswith(prefix), line
        with urllib.request.urlopen(line[len(prefix):].strip(), timeout=10) as r:
            assert "factstream_synapse_watch_redis_up" in r.read().decode()
    finally:
        stop(proc)


@pytest.mark.redis
@pytest.mark.postgres
def test_watch_refuses_a_database_that_is_not_synapses(redis_url: str, channel_prefix: str, postgres_dsn: str) -> None:
    proc = cli("synapse", "watch", "--redis", redis_url, "--server-name", channel_prefix, "--db", postgres_dsn,
               "--duration", "1")
    assert proc.returncode == 2 and "is not a Synapse database" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_check_refuses_a_factstream_database(tmp_path: Path) -> None:
    """factstream's own database has a stream_positions table too. Before: "healthy: no inconsistencies", exit 0."""
    db = f"sqlite:///{tmp_path / 'factstream.db'}"
    proc = start("serve", "--db", db, "--port", "0", "--status")
    assert proc.stdout is not None and json.loads(proc.stdout.readline())["event"] == "listening"
    stop(proc)
    check = cli("synapse", "check", "--db", db)
    assert check.returncode == 2 and check.stdout == "", check.stdout
    assert check.stderr.startswith(f"factstream synapse check: {db} is not a Synapse database (no schema_version, ")
    assert check.stderr.count("\n") == 1 and "homeserver.yaml" in check.stderr
    check = cli("synapse", "check", "--db", db, "--json")
    assert check.returncode == 2 and json.loads(check.stdout)["healthy"] is None


# ---------------------------------------------------------------------------------------------- a new operator's mistakes

SECRET = "Cfg-s3cret-n0t-shown"


def one_line_exit_2(proc: Any, *words: str) -> None:
    """Could not check/watch: one line on stderr holding ``words``, no traceback, no password."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, (proc.args, out)
    assert proc.stderr.count("\n") == 1 and no_traceback(proc.stderr), proc.stderr
    assert all(w in proc.stderr for w in words), (words, proc.stderr)
    assert SECRET not in out, out


def test_config_mistakes_name_the_file_and_what_to_do(tmp_path: Path) -> None:
    """A path that does not exist, a directory without *.yaml, broken YAML, no redis or database section."""
    yml = tmp_path / "conf.d"
    yml.mkdir()
    (yml / "homeserver.yml").write_text("server_name: x.test\n")  # Synapse reads only *.yaml from a directory
    broken = tmp_path / "broken.yaml"
    broken.write_text(f'server_name: x.test\nredis:\n  enabled: true\n  password: "{SECRET}\n')  # no closing quote
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text("server_name: x.test\nredis:\n\tenabled: true\n")
    bare = tmp_path / "bare.yaml"
    bare.write_text("server_name: x.test\n")
    watch_only = ("--redis", "redis://127.0.0.1:1/0", "--server-name", "x.test", "--duration", "1")
    for command in (["watch", "--duration", "1"], ["check"]):
        one_line_exit_2(cli("synapse", *command, "-c", str(tmp_path / "homeserver.yaml")),
                        "cannot read Synapse config", "No such file", "check the path")
        one_line_exit_2(cli("synapse", *command, "-c", str(yml)),
                        f"no Synapse config file in {yml}", "it holds homeserver.yml", "give homeserver.yaml itself")
        one_line_exit_2(cli("synapse", *command, "-c", str(broken)),
                        f"{broken} line 5, column 1: not valid YAML", "quoted scalar that starts at line 4, column 13",
                        "fix the file")
        one_line_exit_2(cli("synapse", *command, "-c", str(tabbed)),
                        f"{tabbed} line 3, column 1: not valid YAML", "YAML indents with spaces only")
    one_line_exit_2(cli("synapse", "watch", "-c", str(bare), "--duration", "1"),
                    f"{bare} has no redis section", "pass --redis URL", "-c the file that holds the redis section")
    one_line_exit_2(cli("synapse", "check", "-c", str(bare)), f"{bare}: no database section", "pass --db URL")
    # With --redis and --db given, neither section is needed.
    assert "no redis section" not in cli("synapse", "watch", "-c", str(bare), *watch_only).stderr


@pytest.mark.parametrize(("typed", "words"), [
    # an unencoded '@' or '/' in the password: the driver quoted the rest of it as a host or port name; said in
    # check_url's words, as every other command says it
    (f"postgresql://postgres:pw@{SECRET}@127.0.0.1:1/synapse",
     ["holds a character that ends it early", "'@' as %40", "postgres:***@"]),
    (f"postgresql://postgres:{SECRET}/x@127.0.0.1:1/synapse",
     ["ends it early", "percent-encode '/', '?' and '#' in the password (%2F, %3F, %23), and '@' as %40"]),
    # one slash: psycopg read it as a key=value string ('missing "=" after ...')
    ("postgresql:/postgres@127.0.0.1:1/synapse", ["is not a URL", "two slashes", "postgresql://user@host"]),
])
def test_db_url_typos_are_named_before_anything_connects(typed: str, words: list[str]) -> None:
    one_line_exit_2(cli("synapse", "check", "--db", typed), *words)
    one_line_exit_2(cli("synapse", "watch", "--redis", "redis://127.0.0.1:1/0", "--server-name", "x.test",
                        "--db", typed, "--duration", "1"), "--db: ", *words)


def test_check_suggests_the_scheme_meant() -> None:
    one_line_exit_2(cli("synapse", "check", "--db", "postgresq://postgres@127.0.0.1:1/synapse"),
                    "unsupported database URL", "did you mean postgresql://?")


@pytest.mark.redis
def test_watch_config_without_a_postgresql_database_says_it_watches_the_wire_only(
        redis_url: str, channel_prefix: str, tmp_path: Path) -> None:
    """A SQLite database (a single process) or none in the config: a note, and the wire alone; a database
    section Synapse refuses is exit 2. Before: silently no database checks, or the refused section ignored."""
    from urllib.parse import urlsplit

    redis = urlsplit(redis_url)
    base = {"server_name": channel_prefix, "redis": {"enabled": True, "host": redis.hostname, "port": redis.port}}
    for name, database, words in (
        ("sqlite", {"name": "sqlite3", "args": {"database": str(tmp_path / "homeserver.db")}},
         ["names a SQLite database", "watching the wire only"]),
        ("none", None, ["has no database section", "do not run", "pass --db URL"]),
    ):
        config = tmp_path / f"{name}.yaml"
        config.write_text(json.dumps({**base, **({"database": database} if database else {})}))
        proc = cli("synapse", "watch", "-c", str(config), "--duration", "1.5", "--json", timeout=30)
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)  # silent: nobody writes on this channel
        assert reports(proc.stdout)[-1]["redis_subscribed"] is True
        note = proc.stderr.splitlines()[0]
        assert note.startswith(f"factstream synapse watch: note: {config}"), proc.stderr
        assert all(w in note for w in words), (words, note)
        assert "database checks (frozen, unpublished, sequence_behind_wire, position_ahead and db lag)" in note
    refused = tmp_path / "mysql.yaml"
    refused.write_text(json.dumps({**base, "database": {"name": "mysql", "args": {"password": SECRET}}}))
    one_line_exit_2(cli("synapse", "watch", "-c", str(refused), "--duration", "1"),
                    "database.name is 'mysql'", "Synapse supports psycopg2 (PostgreSQL) or sqlite3", "--no-db")
    one_line_exit_2(cli("synapse", "check", "-c", str(refused)), "database.name is 'mysql'")
