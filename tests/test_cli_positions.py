"""``factstream positions`` tells the truth: never creates a database, knows Synapse's streams by wire
name, says when a database is empty or foreign, and asks live writers over TCP and Redis."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from typing import Any


from cli_run import ENV, FACTSTREAM, cli, no_traceback, serve, start, stop
from conftest import synapse_python

SYNAPSE_SCHEMA = """
import sqlite3, sys
from synapse.storage.engines import create_engine
from synapse.storage.prepare_database import prepare_database
from synapse.storage.database import LoggingDatabaseConnection
path = sys.argv[1]
engine = create_engine({"name": "sqlite3", "args": {"database": path}})
conn = LoggingDatabaseConnection(conn=sqlite3.connect(path), engine=engine, default_txn_name="schema", server_name="hs")
prepare_database(conn, engine, config=None)
conn.commit()
"""


def _insert_events(conn: sqlite3.Connection, orderings: tuple[int, ...], instance: str) -> None:
    """One Synapse events row per stream ordering (negative: backfilled), written by ``instance``."""
    conn.executemany(
        "INSERT INTO events (stream_ordering, topological_ordering, event_id, type, room_id, content, "
        "unrecognized_keys, processed, outlier, depth, origin_server_ts, received_ts, sender, contains_url, "
        "instance_name) VALUES (?, 1, ?, 'm.room.message', '!r:hs', '{}', '', 1, 0, 1, 0, 0, '@u:hs', 0, ?)",
        [(so, f"$e{so}", instance) for so in orderings])


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path: Any) -> None:
    missing = tmp_path / "typo.db"
    out = cli("positions", "--db", f"sqlite:///{missing}")
    assert out.returncode == 2 and str(missing) in out.stderr and "never creates" in out.stderr
    assert not missing.exists()


def test_no_arguments_creates_nothing(tmp_path: Any) -> None:
    out = subprocess.run([FACTSTREAM, "positions"], capture_output=True, text=True, timeout=30, env=ENV, cwd=tmp_path)
    assert out.returncode == 2 and "--db" in out.stderr and no_traceback(out.stderr)
    assert os.listdir(tmp_path) == []


def test_empty_and_foreign_databases_say_so(tmp_path: Any) -> None:
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    out = cli("positions", "--db", f"sqlite:///{empty}")
    assert out.returncode == 1 and "is empty" in out.stderr
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
    out = cli("positions", "--db", f"sqlite:///{foreign}")
    assert out.returncode == 1 and "not a factstream or Synapse database" in out.stderr


def test_a_synapse_database_by_wire_names_with_ids_from_its_own_tables(tmp_path: Any) -> None:
    db = tmp_path / "homeserver.db"
    subprocess.run([synapse_python(), "-c", SYNAPSE_SCHEMA, str(db)], check=True, capture_output=True, timeout=300)
    empty = cli("positions", "--db", f"sqlite:///{db}")
    assert empty.returncode == 0 and "no facts yet" in empty.stdout
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES "
                     "('device_lists_stream', 'master', 7), ('presence_stream', 'worker1', 3)")
        for sid in (5, 9):
            conn.execute("INSERT INTO device_lists_stream (stream_id, user_id, device_id, instance_name) "
                         "VALUES (?, '@u:hs', 'D', 'master')", (sid,))
        conn.execute("INSERT INTO user_signature_stream (stream_id, from_user_id, user_ids, instance_name) "
                     "VALUES (12, '@u:hs', '[]', 'master')")
        _insert_events(conn, (3, 10, -4, -2), "master")
    out = cli("positions", "--db", f"sqlite:///{db}", "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["stream"], r["writer"]): r for r in json.loads(out.stdout)}
    assert rows[("device_lists", "master")] == {"stream": "device_lists", "writer": "master", "recorded": 7,
                                                "max_stream_id": 12, "persisted_upto": 7}  # 8 is a gap
    assert rows[("presence", "worker1")]["recorded"] == 3
    assert rows[("events", "master")]["max_stream_id"] == 10
    assert rows[("backfill", "master")]["max_stream_id"] == 4
    streams = {s for s, _ in rows}
    for name in ("typing", "caches", "un_partial_stated_room", "un_partial_stated_event", "backfill", "push_rules"):
        assert name in streams
    assert not {"device_lists_stream", "presence_stream", "push_rules_stream"} & streams
    text = cli("positions", "--db", f"sqlite:///{db}")
    assert "typing" in text.stdout and "in memory" in text.stdout and "read at" in text.stdout


def test_live_positions_over_tcp_and_redis(tmp_path: Any, redis_url: str, channel_prefix: str) -> None:
    db_url = f"sqlite:///{tmp_path}/w.db"
    proc, port = serve(db_url, "--produce", "--duration", "1", "--seed", "2")
    try:
        time.sleep(2.5)
        out = cli("positions", "--db", db_url, "--connect", f"127.0.0.1:{port}", "--json", "--wait", "0.5")
        assert out.returncode == 0, out.stderr
        rows = {(r["stream"], r["writer"]): r for r in json.loads(out.stdout)}
        for stream in ("caches", "receipts", "to_device"):
            assert rows[(stream, "master")]["replication"] >= rows[(stream, "master")]["max_stream_id"]
        wrong = cli("positions", "--connect", f"127.0.0.1:{port}", "--server-name", "nope")
        assert wrong.returncode == 1 and "not 'nope'" in wrong.stderr
    finally:
        stop(proc)
    rdb = f"sqlite:///{tmp_path}/r.db"
    writer = start("serve", "--db", rdb, "--redis", redis_url, "--server-name", channel_prefix, "--status",
                   "--produce", "--duration", "1")
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            if json.loads(line)["event"] == "produced":
                break
        out = cli("positions", "--redis", redis_url, "--server-name", channel_prefix, "--json", "--wait", "1")
        assert out.returncode == 0, out.stderr
        got = {(r["stream"], r["writer"]): r["replication"] for r in json.loads(out.stdout)}
        assert {s for s, _ in got} == {"caches", "receipts", "to_device"} and all(v > 0 for v in got.values())
    finally:
        stop(writer)
    out = cli("positions", "--redis", redis_url)
    assert out.returncode == 2 and "--server-name" in out.stderr



def test_positions_waits_for_a_writer_that_is_still_starting_as_tail_does(tmp_path: Any) -> None:
    from cli_run import free_port

    db_url = f"sqlite:///{tmp_path}/w.db"
    port = free_port()
    asking = start("positions", "--connect", f"127.0.0.1:{port}", "--json", "--wait", "0.5", "--connect-timeout", "20")
    time.sleep(1.5)  # refused meanwhile: retried, not given up
    writer = start("serve", "--db", db_url, "--port", str(port), "--server-name", "hs1")
    try:
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 0, err
        assert {r["stream"] for r in json.loads(out)} == {"caches", "receipts", "to_device"}
    finally:
        stop(writer)
    never = cli("positions", "--connect", f"127.0.0.1:{free_port()}", "--connect-timeout", "1")
    assert never.returncode == 1 and "127.0.0.1" in never.stderr and no_traceback(never.stderr)


def test_options_positions_would_ignore_are_refused(tmp_path: Any) -> None:
    """--connect with --redis asked only Redis (a dead TCP port exited 0 unmentioned); TLS options and
    --server-name without what they apply to did nothing."""
    from cli_run import free_port

    secret = "pos-s3cret"
    both = cli("positions", "--connect", f"127.0.0.1:{free_port()}", "--redis", f"redis://:{secret}@127.0.0.1:1",
               "--server-name", "hs1", "--connect-timeout", "1")
    assert both.returncode == 2 and "--connect" in both.stderr and "--redis" in both.stderr and "not both" in both.stderr
    assert secret not in both.stdout + both.stderr and both.stdout == "" and no_traceback(both.stderr)
    db = f"sqlite:///{tmp_path}/absent.db"
    for extra, named in ((("--tls",), "--tls"), (("--insecure",), "--insecure"), (("--server-name", "hs1"), "--server-name"),
                         (("--wait", "3"), "--wait"), (("--connect-timeout", "3"), "--connect-timeout")):
        out = cli("positions", "--db", db, *extra)
        assert out.returncode == 2 and named in out.stderr and "--connect" in out.stderr, (extra, out.stderr)
    assert not (tmp_path / "absent.db").exists()


def test_a_database_that_does_not_answer_is_named_after_db_timeout(postgres_dsn: str) -> None:
    """A table locked by a migration (Synapse's schema updates take ACCESS EXCLUSIVE locks): the query waited as
    long as the lock was held, and positions with it, for ever. Now it is named after --db-timeout, exit 1."""
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE stream_positions (stream_name TEXT, instance_name TEXT, stream_id BIGINT)")
        conn.execute("INSERT INTO stream_positions VALUES ('events', 'master', 7)")
    migration = psycopg.connect(postgres_dsn)
    try:
        migration.execute("LOCK TABLE stream_positions IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        out = subprocess.run([FACTSTREAM, "positions", "--db", postgres_dsn, "--db-timeout", "2"],
                             capture_output=True, text=True, timeout=60, env=ENV)
        took = time.monotonic() - began
    finally:
        migration.rollback()
        migration.close()
    assert out.returncode == 1 and no_traceback(out.stderr), out.stderr
    assert "did not answer within 2 s" in out.stderr and "--db-timeout SECONDS" in out.stderr, out.stderr
    assert took < 15, took
    again = cli("positions", "--db", postgres_dsn)  # the lock gone: the query the timeout cancelled left nothing
    assert again.returncode == 0 and "events" in again.stdout and "7" in again.stdout, again.stdout + again.stderr
    refused = cli("positions", "--connect", "127.0.0.1:1", "--db-timeout", "2")
    assert refused.returncode == 2 and "--db-timeout applies to --db" in refused.stderr, refused.stderr


#: Synapse's own id generators on a homeserver config: the persisted-up-to position it computes at startup.
SYNAPSE_TOKENS = """
import json, logging, sys
import yaml
from twisted.internet import reactor
from synapse.config.homeserver import HomeServerConfig
from synapse.server import HomeServer
from synapse.storage import DataStore
logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
class Oracle(HomeServer):
    DATASTORE_CLASS = DataStore
config = HomeServerConfig()
config.parse_config_dict(yaml.safe_load(open(sys.argv[1])), "", "")
hs = Oracle(config.server.server_name, config=config, reactor=reactor)
hs.setup()
store = hs.get_datastores().main
print(json.dumps({"receipts": store._receipts_id_gen.get_current_token(),
                  "events": store._stream_id_gen.get_current_token(),
                  "backfill": -store._backfill_id_gen.get_current_token()}))
"""


def test_a_stale_row_is_set_aside_as_synapse_sets_it_aside(tmp_path: Any) -> None:
    """A receipts row of a worker no longer in stream_writers ('old_worker' at 3, below a gap at 11) made the
    stream look persisted up to 10 only; Synapse deletes that row at startup and starts from worker1's 20.
    positions --config now computes what Synapse's id generators compute in a process that does not write the
    stream (checked against Synapse's main process, which runs last as it deletes the row; worker1 writes events
    and receipts), and says which row it set aside and why."""
    from synapse_fixtures import homeserver_config

    db = tmp_path / "homeserver.db"
    subprocess.run([synapse_python(), "-c", SYNAPSE_SCHEMA, str(db)], check=True, capture_output=True, timeout=300)
    config = homeserver_config(tmp_path, "unused", "hs")
    raw = json.loads(config.read_text())
    raw["database"] = {"name": "sqlite3", "args": {"database": str(db)}}
    raw["stream_writers"] = {"events": ["worker1"], "receipts": ["worker1"]}
    raw["instance_map"] = {"main": {"host": "127.0.0.1", "port": 1}, "worker1": {"host": "127.0.0.1", "port": 2}}
    config.write_text(json.dumps(raw))
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES "
                     "('receipts', 'worker1', 20), ('receipts', 'old_worker', 3), ('backfill', 'worker1', -4)")
        conn.executemany("INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, "
                         "instance_name) VALUES (?, '!r:hs', 'm.read', ?, '$e', '{}', 'worker1')",
                         [(i, f"@u{i}:hs") for i in [*range(1, 11), *range(12, 23), 25]])
        _insert_events(conn, (3, 10, -1, -2, -3, -4, -5, -6, -8), "worker1")
    unjudged = cli("positions", "--db", f"sqlite:///{db}", "--json")
    assert unjudged.returncode == 0, unjudged.stderr
    rows = {(r["stream"], r["writer"]): r for r in json.loads(unjudged.stdout)}
    assert rows[("receipts", "old_worker")]["persisted_upto"] == 10 and "stale" not in rows[("receipts", "old_worker")]
    out = cli("positions", "--db", f"sqlite:///{db}", "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["stream"], r["writer"]): r for r in json.loads(out.stdout)}
    assert rows[("receipts", "old_worker")]["recorded"] == 3
    assert rows[("receipts", "old_worker")]["stale"].startswith(
        f"'old_worker' is not in stream_writers.receipts of {config} (worker1)")
    assert "stale" not in rows[("receipts", "worker1")]
    assert rows[("backfill", "worker1")]["recorded"] == 4  # Synapse's -4, as a magnitude like the other columns
    got = {s: rows[(s, "worker1")]["persisted_upto"] for s in ("receipts", "events", "backfill")}
    assert got == {"receipts": 22, "events": 10, "backfill": 6}
    text = cli("positions", "--db", f"sqlite:///{db}", "-c", str(config))
    assert text.returncode == 0 and "# stale: receipts/old_worker (recorded 3) set aside" in text.stdout, text.stdout
    assert "receipts 22" in text.stdout and "all counted" not in text.stdout
    oracle = subprocess.run([synapse_python(), "-c", SYNAPSE_TOKENS, str(config)], capture_output=True, text=True,
                            timeout=300)
    assert oracle.returncode == 0, oracle.stderr
    assert json.loads(oracle.stdout.strip().splitlines()[-1]) == got
    with sqlite3.connect(db) as conn:  # what Synapse did to the row positions set aside
        assert conn.execute("SELECT instance_name FROM stream_positions WHERE stream_name = 'receipts'").fetchall() \
            == [("worker1",)]


def test_writers_options_apply_to_a_synapse_database(tmp_path: Any) -> None:
    """--config/--instances judge a Synapse database's stream_positions rows: without --db, together, on a
    factstream database, or with a config Synapse refuses, they are refused (exit 2) rather than ignored."""
    config = tmp_path / "homeserver.yaml"
    config.write_text("server_name: hs\nstream_writers:\n  receipt: [master]\n")
    nodb = cli("positions", "--connect", "127.0.0.1:1", "--instances", "master")
    assert nodb.returncode == 2 and "--instances applies to --db" in nodb.stderr, nodb.stderr
    factstream_db = tmp_path / "w.db"
    with sqlite3.connect(factstream_db) as conn:
        conn.execute("CREATE TABLE stream_positions (stream_name TEXT, instance_name TEXT, stream_id BIGINT)")
        conn.execute("CREATE TABLE demo_receipts (stream_id INTEGER)")
    both = cli("positions", "--db", f"sqlite:///{factstream_db}", "--instances", "master", "-c", str(config))
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    ours = cli("positions", "--db", f"sqlite:///{factstream_db}", "--instances", "master")
    assert ours.returncode == 2 and "applies to a Synapse database" in ours.stderr and ours.stdout == "", ours.stderr
    refused = cli("positions", "--db", f"sqlite:///{factstream_db}", "--config", str(config))
    assert refused.returncode == 2 and "stream_writers.receipt" in refused.stderr, refused.stderr
    assert no_traceback(refused.stderr + ours.stderr + both.stderr + nodb.stderr)
