"""``factstream synapse check`` on databases that Synapse itself created and wrote, then damaged.

Each test clones a database whose schema and rows come from Synapse 1.163
(the oracle), damages its copy the way Synapse's tracker describes
(element-hq/synapse#18544, #17274, #19671, stale writers, rows written behind
Synapse's back), and checks the diagnosis, the repair SQL and the repair:
after ``--fix`` Synapse's own startup (its id generators' consistency checks)
accepts the database again.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psycopg
import pytest

from synapse_fixtures import SynapseDb, factstream, homeserver_config, oracle, synapse_db, synapse_template  # noqa: F401

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

FAILOVER_STREAMS = {
    "account_data": "account_data_sequence",
    "receipts": "receipts_sequence",
    "push_rules_stream": "push_rules_stream_sequence",
    "presence_stream": "presence_stream_sequence",
}


def check_json(*args: str) -> tuple[int, dict[str, object]]:
    proc = factstream("synapse", "check", "--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def problems(doc: dict[str, object]) -> list[dict[str, object]]:
    findings = doc["findings"]
    assert isinstance(findings, list)
    return [f for f in findings if f["severity"] != "info"]


def test_a_database_synapse_wrote_is_healthy(synapse_db: SynapseDb) -> None:
    proc = factstream("synapse", "check", "--db", synapse_db.dsn)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "healthy: no inconsistencies" in proc.stdout
    assert "account_data_sequence" in proc.stdout and "master=10" in proc.stdout
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 0 and doc["healthy"] is True and problems(doc) == []
    streams = {s["stream"]: s for s in doc["streams"]}  # type: ignore[union-attr]
    assert streams["account_data"]["positions"] == {"master": 10}
    assert streams["account_data"]["sequence"]["last_issued"] == 10
    assert streams["receipts"]["tables"] == {"receipts_linearized": 4}
    assert streams["caches"]["positions"] == {}  # Synapse records no positions for the caches stream
    # The config's writers (the defaults: master) agree with what Synapse recorded.
    assert check_json("--config", str(synapse_db.config))[0] == 0


def test_failover_signature_positions_32_ahead_then_fix(synapse_db: SynapseDb) -> None:
    """#18544: after a switchover and back, four streams' positions are exactly 32 above their sequences."""
    synapse_db.sql(f"UPDATE stream_positions SET stream_id = stream_id + 32 WHERE stream_name IN "
                   f"({', '.join(repr(s) for s in FAILOVER_STREAMS)})")
    refused = oracle("startup", synapse_db.config)
    assert refused["ok"] is False and "inconsistent with associated stream position" in refused["error"]

    before = synapse_db.state()
    code, doc = check_json("--db", synapse_db.dsn)
    assert synapse_db.state() == before  # a check writes nothing
    assert code == 1 and doc["healthy"] is False
    found = {f["stream"]: f for f in problems(doc)}
    assert set(found) == set(FAILOVER_STREAMS)
    for stream, sequence in FAILOVER_STREAMS.items():
        f = found[stream]
        assert f["kind"] == "positions_ahead_of_sequence" and f["severity"] == "error"
        assert f["details"]["ahead"] == 32 and "18544" in f["cause"]
        top = f["details"]["position_top"]
        assert f["repair"] == [f"SELECT setval('{sequence}', GREATEST((SELECT last_value FROM {sequence}), {top}));"]

    text = factstream("synapse", "check", "--db", synapse_db.dsn)
    assert text.returncode == 1
    assert "ERROR account_data: positions_ahead_of_sequence" in text.stdout and "exactly 32 ahead" in text.stdout

    fixed = factstream("synapse", "check", "--db", synapse_db.dsn, "--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "applied 4 repair(s) in one transaction" in fixed.stdout
    assert "changed: sequence account_data_sequence last issued 10 -> 42" in fixed.stdout
    assert "healthy: no inconsistencies" in fixed.stdout.split("after the repair:")[1]
    assert oracle("startup", synapse_db.config) == {"ok": True}


def test_fix_refuses_while_a_session_is_connected(synapse_db: SynapseDb) -> None:
    synapse_db.sql("UPDATE stream_positions SET stream_id = stream_id + 32 WHERE stream_name = 'receipts'")
    with psycopg.connect(synapse_db.dsn, application_name="synapse-main") as other:
        other.execute("SELECT 1")
        before = synapse_db.state()
        proc = factstream("synapse", "check", "--db", synapse_db.dsn, "--fix")
        assert proc.returncode == 1
        assert "refusing to repair" in proc.stderr and "synapse-main" in proc.stderr and "--force" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert synapse_db.state() == before
        code, doc = check_json("--db", synapse_db.dsn, "--fix")
        assert code == 1 and doc["fixed"] == [] and len(doc["refused"]) >= 1
        forced = factstream("synapse", "check", "--db", synapse_db.dsn, "--fix", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
    assert synapse_db.sql("SELECT last_value FROM receipts_sequence") == [(36,)]


def test_sequence_behind_its_table_and_the_printed_sql_repairs_it(synapse_db: SynapseDb) -> None:
    """#17274: the sequence went back below ids that exist; the SQL we print, run by hand, mends it."""
    synapse_db.sql("DELETE FROM stream_positions WHERE stream_name = 'account_data'",
                   "SELECT setval('account_data_sequence', 6)")
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 1
    [f] = problems(doc)
    assert f["kind"] == "sequence_behind_table" and f["stream"] == "account_data"
    assert f["details"]["behind"] == 4 and f["details"]["table_top"] == 10 and "17274" in f["cause"]
    for sql in f["repair"]:  # the operator runs what we printed
        synapse_db.sql(sql)
    assert check_json("--db", synapse_db.dsn)[0] == 0
    assert synapse_db.sql("SELECT nextval('account_data_sequence')") == [(11,)]


def test_port_from_sqlite_leaves_the_sequence_at_its_start(synapse_db: SynapseDb) -> None:
    """#19671: a port that forgot a sequence: rows and positions, sequence still at 1."""
    synapse_db.sql("SELECT setval('push_rules_stream_sequence', 1)")
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 1
    kinds = {f["kind"]: f for f in problems(doc)}
    assert set(kinds) == {"positions_ahead_of_sequence", "sequence_behind_table"}
    assert all("19671" in f["cause"] and f["stream"] == "push_rules_stream" for f in kinds.values())
    code, doc = check_json("--db", synapse_db.dsn, "--fix")
    assert code == 0 and len(doc["fixed"]) == 1  # both findings share one statement
    assert doc["healthy"] is True
    assert oracle("startup", synapse_db.config) == {"ok": True}


def test_port_from_sqlite_off_by_one(synapse_db: SynapseDb) -> None:
    """#19671 again: the port restarted the sequence one short (RESTART WITH max instead of max + 1)."""
    synapse_db.sql("ALTER SEQUENCE receipts_sequence RESTART WITH 4")
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 1
    found = {f["kind"]: f for f in problems(doc)}
    assert set(found) == {"positions_ahead_of_sequence", "sequence_behind_table"}
    assert found["sequence_behind_table"]["details"]["behind"] == 1
    assert all("off by one" in f["cause"] and "19671" in f["cause"] for f in found.values())
    assert check_json("--db", synapse_db.dsn, "--fix")[0] == 0
    assert synapse_db.sql("SELECT nextval('receipts_sequence')") == [(5,)]


def test_synapse_refuses_once_but_moves_the_sequence_itself(synapse_db: SynapseDb) -> None:
    """What docs/synapse.md tells operators: on the #19671 shape Synapse's first start moves the sequence up
    to its table (and still refuses, comparing positions with the old value); the next start succeeds."""
    synapse_db.sql("SELECT setval('push_rules_stream_sequence', 1)")
    assert oracle("startup", synapse_db.config)["ok"] is False
    assert check_json("--db", synapse_db.dsn)[0] == 0
    assert oracle("startup", synapse_db.config) == {"ok": True}


def test_stale_writer_by_instances_and_by_config(synapse_db: SynapseDb) -> None:
    synapse_db.sql("INSERT INTO stream_positions VALUES ('receipts', 'old_worker', 3)")
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 0  # without the configured writers it cannot tell: it reports the writers seen
    seen = [f for f in doc["findings"] if f["kind"] == "writers_seen" and f["stream"] == "receipts"]
    assert seen and "old_worker=3" in seen[0]["summary"]
    for how in (["--instances", "master,worker1"], ["--config", str(synapse_db.config)]):
        code, doc = check_json("--db", synapse_db.dsn, *how)
        assert code == 1, how
        [f] = problems(doc)
        assert f["kind"] == "stale_writer" and f["details"]["instance"] == "old_worker"
        assert f["repair"] == ["DELETE FROM stream_positions WHERE stream_name = 'receipts' AND instance_name = 'old_worker';"]
    # homeserver.yaml as operators write it (block YAML, not JSON): PyYAML is a dependency, so it reads
    # (before, it was refused with "needs PyYAML" unless the user installed it).
    import yaml

    as_yaml = synapse_db.config.with_suffix(".yaml")
    as_yaml.write_text(yaml.safe_dump(json.loads(synapse_db.config.read_text()), default_flow_style=False))
    assert not as_yaml.read_text().lstrip().startswith("{")
    code, doc = check_json("--db", synapse_db.dsn, "--config", str(as_yaml))
    assert code == 1 and [f["kind"] for f in problems(doc)] == ["stale_writer"]
    fixed = factstream("synapse", "check", "--config", str(synapse_db.config), "--fix")  # database from the config
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "changed: stream_positions receipts/old_worker 3 -> -" in fixed.stdout
    assert synapse_db.sql("SELECT instance_name FROM stream_positions WHERE stream_name = 'receipts'") == [("master",)]


def test_rows_without_positions(synapse_db: SynapseDb) -> None:
    """A receipt inserted behind Synapse's back: its id comes from the sequence, but no position covers it."""
    synapse_db.sql(
        "INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, instance_name) "
        "VALUES (nextval('receipts_sequence'), '!r:check.test', 'm.read', '@x:check.test', '$x', '{}', 'master')")
    code, doc = check_json("--db", synapse_db.dsn)
    assert code == 1
    [f] = problems(doc)
    assert f["kind"] == "rows_without_positions" and f["stream"] == "receipts"
    assert (f["details"]["count"], f["details"]["lowest"], f["details"]["highest"]) == (1, 5, 5)
    code, doc = check_json("--db", synapse_db.dsn, "--fix")
    assert code == 0
    assert synapse_db.sql("SELECT stream_id FROM stream_positions WHERE stream_name = 'receipts'") == [(5,)]
    assert oracle("startup", synapse_db.config) == {"ok": True}


def test_could_not_check_is_one_line_exit_2_and_redacted(postgres_dsn: str) -> None:
    proc = factstream("synapse", "check", "--db", "postgresql://postgres:s3cret@127.0.0.1:1/synapse")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("factstream synapse check: cannot connect to postgresql://postgres:***@127.0.0.1:1/synapse")
    assert "s3cret" not in proc.stderr and proc.stderr.count("\n") == 1
    code, doc = check_json("--db", postgres_dsn)  # a database, but not Synapse's
    assert code == 2 and doc["healthy"] is None and "not a Synapse database" in str(doc["error"])
    for bad in (["--db", "mysql://x/y"], [], ["--config", "/nonexistent/homeserver.yaml"],
                ["--db", postgres_dsn, "--force"]):
        proc = factstream("synapse", "check", *bad)
        assert proc.returncode == 2, bad
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_single_process_synapse_on_sqlite(tmp_path: Path) -> None:
    """SQLite (a single-process Synapse): no sequences, but the writer checks and their repairs apply."""
    config = homeserver_config(tmp_path, "unused", "sqlite.test")
    raw = json.loads(config.read_text())
    db = tmp_path / "homeserver.db"
    raw["database"] = {"name": "sqlite3", "args": {"database": str(db)}}
    config.write_text(json.dumps(raw))
    assert oracle("prepare", config)["ok"] is True
    code, doc = check_json("--config", str(config))
    assert code == 0 and doc["engine"] == "sqlite", doc
    streams = {s["stream"]: s for s in doc["streams"]}  # type: ignore[union-attr]
    assert streams["account_data"]["positions"] == {"master": 10} and streams["account_data"]["sequence"] is None
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO stream_positions VALUES ('receipts', 'old_worker', 3)")
        conn.execute("INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, "
                     "instance_name) VALUES (7, '!r:sqlite.test', 'm.read', '@x:sqlite.test', '$x', '{}', 'master')")
    code, doc = check_json("--db", f"sqlite:///{db}", "--instances", "master")
    assert code == 1
    assert sorted(f["kind"] for f in problems(doc)) == ["rows_without_positions", "stale_writer"]
    code, doc = check_json("--db", f"sqlite:///{db}", "--instances", "master", "--fix")
    assert code == 0, doc
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'receipts'"
                            ).fetchall() == [("master", 7)]
    assert oracle("startup", config) == {"ok": True}
