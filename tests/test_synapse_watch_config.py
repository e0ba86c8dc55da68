"""``factstream synapse watch --config`` / ``check --config`` with the config a deployment really runs with.

* A writer that ``stream_writers`` names but that is not running says nothing
  on the channel: without the config, a watch started after it died saw a
  healthy deployment. With ``--config`` it is ``writer_missing`` (instance and
  stream named), and a writer heard that the config does not name is
  ``writer_unconfigured``. ``--redis``/``--server-name`` come from the config.
* ``db lag`` no longer counts a ``stream_positions`` value beyond the sequence
  (``position_ahead``): it showed such a bogus position as lag.
* ``--config`` is repeatable and takes a directory, merged as Synapse merges
  its ``-c`` options (checked against Synapse's own config loader).

The live tests run a real Synapse (main process + worker1, both receipts
writers; tests/synapse_deployment.py) once for the module.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import REDIS_HOST, REDIS_PORT, pg_dsn, synapse_python
from synapse_deployment import PrivatePostgres, PrivateRedis, SynapseDeployment, free_port, running_deployment
from synapse_fixtures import (  # noqa: F401
    FACTSTREAM, SynapseDb, factstream, synapse_db, synapse_template)

REDIS = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


def last_report(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no report"
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def problems(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(p["kind"], p["stream"], p["writer"]) for p in report["problems"]}


def writer(report: dict[str, Any], stream: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] | None = next(
        (w for w in report["writers"] if (w["stream"], w["writer"]) == (stream, name)), None)
    assert found is not None, (stream, name, report["writers"])
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseDeployment]:
    with running_deployment(tmp_path_factory.mktemp("synapse-watch-config"), "factstream_synwc_") as dep:
        yield dep


def _configs(dep: SynapseDeployment) -> tuple[Path, Path]:
    """The deployment's shared config and the main process's own file (listeners)."""
    return dep.dir / "shared.json", dep.dir / "main.json"


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_watch_with_the_deployments_config(deployment: SynapseDeployment, tmp_path: Path) -> None:
    dep = deployment
    shared, main = _configs(dep)
    token = dep.register("alice")
    room = dep.create_room(token)
    dep.receipt(token, room, dep.send(token, room, "hello"))

    # 1. The files the main process runs with (-c shared -c main): Redis and channel from them, every writer the
    #    config names answers, none is extra. Healthy.
    ok = factstream("synapse", "watch", "-c", str(shared), "--config", str(main), "--duration", "3", "--interval", "1",
                    "--json", timeout=60)
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    report = last_report(ok.stdout)
    assert report["server_name"] == dep.server_name and report["healthy"] is True, report
    assert writer(report, "receipts", "worker1") and writer(report, "events", "master")

    # 2. A config that does not list worker1 as a receipts writer (not the one deployed): worker1 is heard on
    #    receipts all the same.
    stale = json.loads(shared.read_text())
    stale["stream_writers"] = {"receipts": ["master"]}
    other = tmp_path / "homeserver-not-deployed.json"
    other.write_text(json.dumps(stale))
    extra = factstream("synapse", "watch", "--config", str(other), "--duration", "3", "--interval", "1", "--json",
                       timeout=60)
    assert extra.returncode == 1, (extra.stdout, extra.stderr)
    report = last_report(extra.stdout)
    assert problems(report) == {("writer_unconfigured", "receipts", "worker1")}, report["problems"]
    summary = report["problems"][0]["summary"]
    assert "stream_writers.receipts" in summary and str(other) in summary and "stale worker" in summary, summary

    # 3. A stream_positions value beyond the sequence is position_ahead, not lag (it showed as db lag 1000+).
    dsn = pg_dsn(dep.dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(before,)] = conn.execute("SELECT stream_id FROM stream_positions WHERE stream_name = 'receipts' "
                                   "AND instance_name = 'master'").fetchall()
        conn.execute("UPDATE stream_positions SET stream_id = stream_id + 1000 WHERE stream_name = 'receipts' "
                     "AND instance_name = 'master'")
    try:
        lag = factstream("synapse", "watch", "-c", str(shared), "--db", dsn, "--duration", "3", "--interval", "1",
                         "--json", timeout=60)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE stream_positions SET stream_id = {before} WHERE stream_name = 'receipts' "
                         "AND instance_name = 'master'")
    report = last_report(lag.stdout)
    assert ("position_ahead", "receipts", "master") in problems(report), report["problems"]
    receipts = writer(report, "receipts", "master")
    assert receipts["db_position"] == before + 1000 and receipts["db_lag"] == 0, receipts

    # A mistyped channel with --db while Synapse writes: rows the database probe finds are not writers heard on the
    # wire, so the watch stays silent (it called this healthy, with every new row's writer listed as heard).
    typo = subprocess.Popen([FACTSTREAM, "synapse", "watch", "--redis", REDIS, "--server-name", "x" + dep.server_name,
                             "--db", dsn, "--duration", "4", "--interval", "1", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while typo.poll() is None:
        dep.receipt(token, room, dep.send(token, room, "while the watch listens on the wrong channel"))
        time.sleep(0.2)
    out, err = typo.communicate(timeout=20)
    assert typo.returncode == 1, (out, err)
    assert [p["kind"] for p in last_report(out)["problems"]] == ["silent"], last_report(out)

    # 4. worker1 dead before the watch starts, master idle. Without the config the watch cannot know worker1
    #    exists: healthy. With it: worker1 is missing from the receipts stream, and nothing else is wrong.
    proc = dep.procs["worker1"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    blind = factstream("synapse", "watch", "--redis", REDIS, "--server-name", dep.server_name, "--duration", "3",
                       "--json", timeout=60)
    assert blind.returncode == 0 and last_report(blind.stdout)["healthy"] is True, blind.stdout

    metrics_port = free_port()
    watch = subprocess.Popen([FACTSTREAM, "synapse", "watch", "-c", str(shared), "--interval", "1", "--json",
                              "--metrics-port", str(metrics_port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert watch.stdout is not None
        deadline = time.monotonic() + 30
        report = {}
        while time.monotonic() < deadline:
            line = watch.stdout.readline()
            assert line, f"watch exited: {watch.stderr.read() if watch.stderr else ''}"
            report = json.loads(line)
            if report["problems"]:
                break
        assert problems(report) == {("writer_missing", "receipts", "worker1")}, report["problems"]
        assert report["healthy"] is False
        summary = report["problems"][0]["summary"]
        assert summary.startswith("worker1 writes receipts (stream_writers.receipts of "), summary
        assert "not running" in summary and "start it" in summary, summary
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        assert 'factstream_synapse_writer_missing{stream="receipts",writer="worker1"} 1.0' in scraped, scraped
        assert "factstream_synapse_watch_healthy 0.0" in scraped
    finally:
        watch.terminate()
        _, err = watch.communicate(timeout=20)
    assert "Traceback" not in err, err

    # Human output names it too, and exits 1.
    text = factstream("synapse", "watch", "-c", str(shared), "--duration", "3", "--interval", "1", timeout=60)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "WRITER_MISSING receipts/worker1: worker1 writes receipts" in text.stdout, text.stdout


# ---------------------------------------------------------------------------------------------- database from config


def _with_database(dep: SynapseDeployment, path: Path, **changes: Any) -> Path:
    """The deployment's shared config with ``changes`` to its database args (None: the setting left out)."""
    cfg = json.loads((dep.dir / "shared.json").read_text())
    args = cfg["database"]["args"]
    for key, value in changes.items():
        if value is None:
            args.pop(key, None)
        else:
            args[key] = value
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_watch_takes_the_database_from_the_config(deployment: SynapseDeployment, tmp_path: Path) -> None:
    """Given only --config, the watch probes the database the config's database section names, as Synapse connects
    to it (TCP host, a Unix socket directory, no host at all); an explicit --db wins. Before: no database without
    --db, so a position edited beyond the sequence went unseen."""
    dep = deployment
    shared, main = _configs(dep)
    dsn = pg_dsn(dep.dbname)
    token = dep.register("dbcfg" + uuid.uuid4().hex[:8])
    room = dep.create_room(token)
    dep.receipt(token, room, dep.send(token, room, "a receipt, so that master records a receipts position"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(before,)] = conn.execute("SELECT stream_id FROM stream_positions WHERE stream_name = 'receipts' "
                                   "AND instance_name = 'master'").fetchall()
        [(sockets,)] = conn.execute("SHOW unix_socket_directories").fetchall()
        conn.execute("UPDATE stream_positions SET stream_id = stream_id + 1000 WHERE stream_name = 'receipts' "
                     "AND instance_name = 'master'")
    socket_dir = str(sockets).split(",")[0].strip()

    def watch_sees_it(*config: str) -> None:
        args = [a for c in config for a in ("-c", c)]
        proc = factstream("synapse", "watch", *args, "--duration", "3", "--interval", "1", "--json", timeout=60)
        assert proc.returncode == 1, (config, proc.stdout, proc.stderr)
        report = last_report(proc.stdout)
        assert ("position_ahead", "receipts", "master") in problems(report), (config, report["problems"])
        assert report["db_error"] is None and writer(report, "receipts", "master")["db_position"] == before + 1000

    try:
        # 1. The files the main process runs with, nothing else: their database section (host, port, user, dbname).
        watch_sees_it(str(shared), str(main))

        # 2. The same database through its Unix socket directory, and with no host at all (libpq's default socket,
        #    which is where Synapse's psycopg2 connects then); check reads the same database.
        variants = [(_with_database(dep, tmp_path / "socket.json", host=socket_dir), f"host={socket_dir}")]
        if socket_dir in ("/var/run/postgresql", "/run/postgresql", "/tmp"):
            variants.append((_with_database(dep, tmp_path / "no-host.json", host=None), "@/"))
        for config, shown in variants:
            watch_sees_it(str(config), str(main))
            check = factstream("synapse", "check", "-c", str(config), "--json")
            assert check.returncode == 1, (config, check.stdout, check.stderr)
            doc = json.loads(check.stdout)
            assert shown in doc["database"] and "localhost" not in doc["database"], doc["database"]
            found = [(f["kind"], f["stream"]) for f in doc["findings"] if f["severity"] == "error"]
            assert found == [("positions_ahead_of_sequence", "receipts")], doc["findings"]

        # 3. An explicit --db wins over the config's database section (here one that does not exist).
        elsewhere = _with_database(dep, tmp_path / "elsewhere.json", dbname=dep.dbname + "_nonexistent")
        gone = factstream("synapse", "watch", "-c", str(elsewhere), "--duration", "2", timeout=60)
        assert gone.returncode == 2 and gone.stdout == "", gone.stdout
        assert f"(the database section of {elsewhere})" in gone.stderr and "does not exist" in gone.stderr
        assert "pass --db URL" in gone.stderr and gone.stderr.count("\n") == 1, gone.stderr
        wins = factstream("synapse", "watch", "-c", str(elsewhere), "--db", dsn, "--duration", "3", "--interval", "1",
                          "--json", timeout=60)
        assert ("position_ahead", "receipts", "master") in problems(last_report(wins.stdout)), wins.stderr
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE stream_positions SET stream_id = {before} WHERE stream_name = 'receipts' "
                         "AND instance_name = 'master'")


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_a_wrong_password_in_the_configs_database_section(deployment: SynapseDeployment, tmp_path: Path) -> None:
    """A PostgreSQL that checks passwords: a wrong one in the config is exit 2 naming the config's database section,
    the right one gets through (to a database that is not Synapse's), and the password is in no output."""
    secret = "cfg-pw-" + uuid.uuid4().hex
    pg = PrivatePostgres(secret)
    pg.start()
    try:
        common = {"host": "127.0.0.1", "port": pg.port, "user": "postgres", "dbname": "postgres"}
        wrong = _with_database(deployment, tmp_path / "wrong.json", password="not-" + secret, **common)
        right = _with_database(deployment, tmp_path / "right.json", password=secret, **common)
        for args in (["watch", "--duration", "3", "--json"], ["watch", "--duration", "3"], ["check"],
                     ["check", "--json"]):
            proc = factstream("synapse", *args, "-c", str(wrong), timeout=60)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 2, (args, out)
            assert secret not in out and "***" in proc.stderr and "Traceback" not in out, (args, out)
            assert proc.stderr.count("\n") == 1, proc.stderr
            assert "password authentication failed for user \"postgres\"" in proc.stderr, proc.stderr
            assert f"(the database section of {wrong})" in proc.stderr and "pass --db URL" in proc.stderr
            if args[0] == "watch":
                assert "--no-db" in proc.stderr, proc.stderr
            else:
                assert json.loads(proc.stdout)["healthy"] is None if "--json" in args else proc.stdout == ""

            proc = factstream("synapse", *args, "-c", str(right), timeout=60)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 2 and secret not in out, (args, out)
            assert f"(the database section of {right}) is not a Synapse database" in proc.stderr, proc.stderr

        # --no-db: the wire alone, as before the config's database was read.
        alone = factstream("synapse", "watch", "-c", str(wrong), "--no-db", "--duration", "2", "--json", timeout=60)
        assert alone.returncode in (0, 1) and secret not in alone.stdout + alone.stderr, alone.stderr
        report = last_report(alone.stdout)
        assert report["redis_subscribed"] is True and report["db_error"] is None, report
        assert report["writers"] and all(w["db_position"] is None for w in report["writers"]), report["writers"]
    finally:
        pg.stop()


# ---------------------------------------------------------------------------------------------- Redis from config


def test_watch_takes_redis_and_server_name_from_the_config(tmp_path: Path) -> None:
    """The redis section (host, port, password or password_path) and server_name; no password in any output."""
    secret = "pw-" + uuid.uuid4().hex
    redis = PrivateRedis(secret)
    redis.start()
    try:
        server_name = f"cfg{uuid.uuid4().hex[:8]}.test"
        inline = tmp_path / "inline.json"
        inline.write_text(json.dumps({"server_name": server_name, "redis": {
            "enabled": True, "host": "127.0.0.1", "port": redis.port, "password": secret}}))
        (tmp_path / "redis.pw").write_text(secret + "\n")
        from_file = tmp_path / "from-file.json"
        from_file.write_text(json.dumps({"server_name": server_name, "redis": {
            "enabled": True, "host": "127.0.0.1", "port": redis.port, "password_path": str(tmp_path / "redis.pw")}}))
        for config in (inline, from_file):
            proc = factstream("synapse", "watch", "--config", str(config), "--duration", "2", "--json", timeout=60)
            assert secret not in proc.stdout + proc.stderr
            assert proc.returncode == 1, (proc.stdout, proc.stderr)
            report = last_report(proc.stdout)
            # Subscribed with the config's password; nobody writes on this channel: silent, naming the config.
            assert report["redis_subscribed"] is True and report["server_name"] == server_name, report
            assert [p["kind"] for p in report["problems"]] == ["silent"], report
            assert str(config) in report["problems"][0]["summary"] and "***" in report["problems"][0]["summary"]
        text = factstream("synapse", "watch", "--config", str(inline), "--duration", "1", timeout=60)
        assert f"{server_name} via redis://:***@127.0.0.1:{redis.port}/0" in text.stdout, text.stdout
        assert secret not in text.stdout + text.stderr

        # --redis and --server-name still win over the config.
        over = factstream("synapse", "watch", "--config", str(inline), "--server-name", "other.test", "--duration",
                          "1", "--json", timeout=60)
        assert last_report(over.stdout)["server_name"] == "other.test"
    finally:
        redis.stop()

    # What the config cannot give: one line, exit 2, naming what to pass.
    off = tmp_path / "no-redis.json"
    off.write_text(json.dumps({"server_name": "x.test", "redis": {"enabled": False}}))
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"server_name": "x.test", "redis": {"enabled": True, "password": secret,
                                                                 "password_path": "/nonexistent"}}))
    unnamed = tmp_path / "unnamed.json"
    unnamed.write_text(json.dumps({"redis": {"enabled": True}}))
    for args, words in (
        (["--config", str(off)], ["redis is not enabled", "--redis"]),
        (["--config", str(both)], ["password and password_path"]),
        (["--config", str(unnamed)], ["no server_name", "--server-name"]),
        (["--config", str(tmp_path / "missing.yaml")], ["cannot read Synapse config", "missing.yaml"]),
        ([], ["no Redis", "--redis", "--config"]),
        (["--redis", REDIS], ["no channel", "--server-name"]),
    ):
        proc = factstream("synapse", "watch", *args, "--duration", "1", timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert all(w in proc.stderr for w in words), (words, proc.stderr)
        assert secret not in proc.stderr


def test_redis_urls_for_sockets_and_tls(tmp_path: Path) -> None:
    """A unix socket and TLS, as the redis section names them (no live TLS Redis here: the URL only)."""
    from factstream.redaction import redact_url
    from factstream.synapse.config import load_config

    sock = tmp_path / "sock.json"
    sock.write_text(json.dumps({"redis": {"enabled": True, "path": "/run/redis/redis.sock", "password": "p@ss",
                                          "dbid": 2}}))
    url = load_config(str(sock)).redis_url
    assert url == "unix://:p%40ss@/run/redis/redis.sock?db=2" and redact_url(url) == "unix://:***@/run/redis/redis.sock?db=2"
    tls = tmp_path / "tls.json"
    tls.write_text(json.dumps({"redis": {"enabled": True, "host": "redis.internal", "port": 6380, "use_tls": True,
                                         "ca_file": "/etc/ca.pem", "ca_path": "/etc/ssl/certs"}}))
    assert load_config(str(tls)).redis_url == "rediss://redis.internal:6380/0?ssl_ca_certs=%2Fetc%2Fca.pem"
    assert "p@ss" not in repr(load_config(str(sock)))


# ---------------------------------------------------------------------------------------------- several config files


def _synapse_merge(paths: list[str]) -> dict[str, Any]:
    """The files and the merged config Synapse's own loader makes of ``-c`` ``paths``."""
    code = ("import sys, json\n"
            "from synapse.config._base import find_config_files, read_config_files\n"
            "files = find_config_files(sys.argv[1:])\n"
            "print(json.dumps({'files': files, 'config': read_config_files(files)}))\n")
    proc = subprocess.run([synapse_python(), "-c", code, *paths], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.mark.postgres
@pytest.mark.slow
def test_check_reads_several_files_and_a_directory_as_synapse_does(synapse_db: SynapseDb, tmp_path: Path) -> None:
    from factstream.synapse.config import load_config

    synapse_db.sql("INSERT INTO stream_positions VALUES ('receipts', 'worker1', 4)")  # worker1 writes receipts
    base = json.loads(synapse_db.config.read_text())  # server_name, database, ...
    writers = {"stream_writers": {"receipts": ["master", "worker1"]},
               "instance_map": {"main": {"host": "127.0.0.1", "port": 9093},
                                "worker1": {"host": "127.0.0.1", "port": 9094}}}
    (tmp_path / "homeserver.yaml").write_text(json.dumps(base))
    (tmp_path / "writers.yaml").write_text(json.dumps(writers))

    # Database from the first file, writers from the second: worker1 is configured, healthy.
    split = factstream("synapse", "check", "-c", str(tmp_path / "homeserver.yaml"),
                       "--config", str(tmp_path / "writers.yaml"), "--json")
    assert split.returncode == 0, split.stdout + split.stderr
    # The writers file alone has no database: nothing to check (what the last --config alone gave before).
    alone = factstream("synapse", "check", "--config", str(tmp_path / "writers.yaml"))
    assert alone.returncode == 2 and "no database" in alone.stderr, alone.stderr

    # A conf.d directory: its *.yaml files in sorted order, each replacing whole top-level sections.
    confd = tmp_path / "conf.d"
    (confd / "old").mkdir(parents=True)
    (confd / "10-homeserver.yaml").write_text(json.dumps(base))
    (confd / "20-writers.yaml").write_text(json.dumps(writers))
    (confd / "README.md").write_text("not config\n")
    (confd / "15-empty.yaml").write_text("")
    merged = factstream("synapse", "check", "-c", str(confd), "--json")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    for skipped in ("README.md", "old", "15-empty.yaml"):
        assert skipped in merged.stderr and "ignored" in merged.stderr, merged.stderr

    # A later file's stream_writers replaces the earlier one whole (Synapse merges top-level sections only):
    # receipts falls back to master, so worker1's position is now stale.
    (confd / "30-events.yaml").write_text(json.dumps({"stream_writers": {"events": ["master"]}}))
    stale = factstream("synapse", "check", "-c", str(confd), "--json")
    assert stale.returncode == 1, stale.stdout + stale.stderr
    findings = [f for f in json.loads(stale.stdout)["findings"] if f["severity"] != "info"]
    assert [(f["kind"], f["stream"]) for f in findings] == [("stale_writer", "receipts")], findings

    # The same files, the same order and the same merged sections as Synapse's own loader.
    paths = [str(tmp_path / "homeserver.yaml"), str(confd)]
    synapse = _synapse_merge(paths)
    ours = load_config(paths)
    assert list(ours.files) == synapse["files"]
    assert {k: tuple(v) for k, v in synapse["config"]["stream_writers"].items()} == dict(ours.stream_writers)
    assert synapse["config"]["server_name"] == ours.server_name
