"""``factstream synapse check`` and ``watch`` through the incidents an operator of a real deployment meets.

* a homeserver config Synapse itself refuses (a mistyped ``stream_writers``
  entry, a writer missing from ``instance_map``): ``check --config`` must say
  so (exit 2) instead of judging positions against a config Synapse never
  runs with (a typo'd entry falls back to master and made real writers look
  stale, with a DELETE of their position as the "repair");
* backfill positions ahead of their sequence: Synapse starts regardless, so
  the diagnosis must not claim it refuses to;
* on a live deployment (main process + worker, its own Redis server): the
  sequence set back under running writers (rows committed and never seen:
  ``sequence_behind_wire``), a position edited ahead of the sequence
  (``position_ahead``, not "frozen"), and Redis stopped then restarted
  (``redis_down``, without frozen/writer_behind guesses, then healthy again).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import PG_HOST, PG_PORT, PG_START, pg_dsn, require_service, synapse_python
from synapse_deployment import PrivateRedis, SynapseDeployment, Watch, free_port
from synapse_fixtures import (  # noqa: F401
    FACTSTREAM, SynapseDb, _create_db, _drop_db, factstream, oracle, synapse_db, synapse_template)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


# ---------------------------------------------------------------------------------------------- check --config


def _synapse_config_error(config: Path) -> str:
    """What Synapse's own config parser says about ``config`` ('' when it accepts it)."""
    code = ("import sys, yaml\n"
            "from synapse.config.homeserver import HomeServerConfig\n"
            "raw = yaml.safe_load(open(sys.argv[1]))\n"
            "try:\n"
            "    HomeServerConfig().parse_config_dict(raw, '', '')\n"
            "except Exception as err:\n"
            "    print(type(err).__name__, err)\n")
    proc = subprocess.run([synapse_python(), "-c", code, str(config)], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def _variant(base: Path, name: str, **changes: Any) -> Path:
    cfg = json.loads(base.read_text())
    cfg.update(changes)
    path = base.with_name(name)
    path.write_text(json.dumps(cfg))
    return path


def test_check_refuses_a_config_synapse_refuses(synapse_db: SynapseDb) -> None:
    # worker1 really writes receipts: it has recorded a position.
    synapse_db.sql("INSERT INTO stream_positions VALUES ('receipts', 'worker1', 4)")
    instance_map = {"main": {"host": "127.0.0.1", "port": 9093}, "worker1": {"host": "127.0.0.1", "port": 9094}}
    good = _variant(synapse_db.config, "good.json", instance_map=instance_map,
                    stream_writers={"receipts": ["master", "worker1"]})
    assert _synapse_config_error(good) == ""
    proc = factstream("synapse", "check", "--config", str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    typo = _variant(synapse_db.config, "typo.json", instance_map=instance_map,
                    stream_writers={"receipt": ["master", "worker1"]})
    unmapped = _variant(synapse_db.config, "unmapped.json", instance_map={"main": instance_map["main"]},
                        stream_writers={"receipts": ["master", "worker1"]})
    for config, names in ((typo, ["stream_writers.receipt", "'receipts'"]),
                          (unmapped, ["'worker1'", "instance_map", "stream_writers.receipts"])):
        assert _synapse_config_error(config) != "", f"Synapse accepts {config.name}"
        proc = factstream("synapse", "check", "--config", str(config))
        assert proc.returncode == 2, (config.name, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout == "" and "DELETE" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert all(n in proc.stderr for n in names) and "refuses to start" in proc.stderr, proc.stderr
        doc = json.loads(factstream("synapse", "check", "--config", str(config), "--json").stdout)
        assert doc["healthy"] is None and "stream_writers" in doc["error"], doc


def test_backfill_positions_ahead_are_not_said_to_stop_synapse(synapse_db: SynapseDb) -> None:
    """Synapse's startup check compares the stored (negative) backfill ids with the sequence: it never fires."""
    [(issued,)] = synapse_db.sql("SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END "
                                 "FROM events_backfill_stream_seq")
    synapse_db.sql(f"INSERT INTO stream_positions VALUES ('backfill', 'master', {-(issued + 5)})")
    proc = factstream("synapse", "check", "--db", synapse_db.dsn, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [finding] = [f for f in json.loads(proc.stdout)["findings"] if f["stream"] == "backfill" and f["severity"] != "info"]
    assert finding["kind"] == "positions_ahead_of_sequence" and finding["details"]["ahead"] == 5, finding
    assert oracle("startup", synapse_db.config)["ok"] is True  # Synapse starts
    assert "refuses to start" not in finding["summary"] and "starts regardless" in finding["summary"], finding


# ---------------------------------------------------------------------------------------------- live deployment


class PrivateRedisDeployment(SynapseDeployment):
    """The fixtures' deployment, pointed at a private Redis."""

    def __init__(self, directory: Path, dbname: str, redis_port: int) -> None:
        super().__init__(directory, dbname)
        self.redis_port = redis_port

    def _write_configs(self) -> tuple[Path, Path, Path]:
        shared, main, worker = super()._write_configs()
        cfg = json.loads(shared.read_text())
        cfg["redis"] = {"enabled": True, "host": "127.0.0.1", "port": self.redis_port}
        shared.write_text(json.dumps(cfg, indent=1))
        return shared, main, worker


def kinds(report: dict[str, Any], stream: str | None = None) -> set[str]:
    return {p["kind"] for p in report["problems"] if stream is None or p["stream"] == stream}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[PrivateRedisDeployment, PrivateRedis]]:
    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    redis = PrivateRedis()
    redis.start()
    name = f"factstream_syninc_{uuid.uuid4().hex[:10]}"
    _create_db(name)
    dep = PrivateRedisDeployment(tmp_path / "synapse", name, redis.port)
    try:
        dep.start()
        yield dep, redis
    finally:
        dep.stop()
        redis.stop()
        _drop_db(name)


def test_watch_names_database_and_redis_incidents(live: tuple[PrivateRedisDeployment, PrivateRedis]) -> None:
    dep, redis = live
    dsn = pg_dsn(dep.dbname)
    token = dep.register("alice")
    room = dep.create_room(token)
    for i in range(4):
        dep.receipt(token, room, dep.send(token, room, f"hello {i}"))
    redis_url = f"redis://127.0.0.1:{redis.port}/0"
    watch = Watch("--redis", redis_url, "--server-name", dep.server_name, "--db", dsn, "--json",
                  "--interval", "1", "--frozen-after", "3")

    def sql(statement: str) -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchone() if cur.description else None

    try:
        report = watch.wait_for("a healthy deployment", lambda r: r["healthy"] and any(
            w["stream"] == "receipts" and w["writer"] == "worker1" for w in r["writers"]))
        top = max(w["token"] for w in report["writers"] if w["stream"] == "receipts")

        # 1. The receipts sequence set back under the running writers: their next receipts get ids every reader
        #    has passed. Named at once, as one problem per writer (not also as a position ahead).
        sql("SELECT setval('receipts_sequence', 2)")
        report = watch.wait_for("the sequence behind the wire",
                                lambda r: "sequence_behind_wire" in kinds(r, "receipts"), timeout=20)
        found = [p for p in report["problems"] if p["kind"] == "sequence_behind_wire"]
        assert {p["writer"] for p in found} == {"master", "worker1"}, found
        assert f"receipts_sequence has handed out only up to 2 but master already announced receipts token {top}" \
            in next(p["summary"] for p in found if p["writer"] == "master")
        assert "check --fix" in found[0]["summary"]
        assert kinds(report) == {"sequence_behind_wire"}, report["problems"]
        sql(f"SELECT setval('receipts_sequence', {top})")
        watch.wait_for("the sequence repaired", lambda r: r["healthy"], timeout=20)

        # 2. A position edited ahead of the sequence: no rows wait for the wire, so not "frozen".
        sql(f"UPDATE stream_positions SET stream_id = {top + 1000} WHERE stream_name = 'receipts' "
            "AND instance_name = 'master'")
        report = watch.wait_for("a position ahead", lambda r: "position_ahead" in kinds(r, "receipts"), timeout=20)
        assert f"records master at {top + 1000}" in report["problems"][0]["summary"], report["problems"]
        for _ in range(5):  # longer than --frozen-after
            report = watch.wait_for("another report", lambda r: True)
            assert kinds(report) == {"position_ahead"}, report["problems"]
        sql(f"UPDATE stream_positions SET stream_id = {top} WHERE stream_name = 'receipts' AND instance_name = 'master'")
        watch.wait_for("the position repaired", lambda r: r["healthy"], timeout=20)

        # 3. Redis stopped: the one problem is Redis, with why; nothing is judged from the silence it causes.
        redis.stop()
        report = watch.wait_for("Redis down", lambda r: not r["redis_subscribed"] and "redis_down" in kinds(r))
        for _ in range(5):  # longer than --frozen-after
            report = watch.wait_for("another report", lambda r: True)
            assert kinds(report) == {"redis_down"} and report["healthy"] is False, report["problems"]
        summary = report["problems"][0]["summary"]
        assert redis_url in summary and "Connection refused" in summary, summary
        redis.start()
        watch.wait_for("the recovery", lambda r: r["healthy"] and r["redis_subscribed"], timeout=60)
    finally:
        err = watch.stop()
    assert "Traceback" not in err, err
