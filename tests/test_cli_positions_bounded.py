"""``positions --db`` reads a stream table above the lowest recorded position only, and stays right.

On a Synapse database a writer ahead of its ``stream_positions`` row can only
have rows above the lowest position recorded for that stream, so positions
reads those rows (an index range scan) and the table's top row, not the whole
table (a full scan of a 100M-row ``events`` took longer than --db-timeout).
These tests hold its figures against a full scan, on PostgreSQL and on
SQLite, and check on PostgreSQL's own counters that the big tables are no
longer scanned.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_run import cli
from conftest import synapse_python
from synapse_fixtures import SynapseDb, synapse_db, synapse_template  # noqa: F401
from test_cli_positions import SYNAPSE_SCHEMA

#: stream -> its (table, id column) pairs, as Synapse writes them ("-" : backfill's negative ids)
TABLES = {
    "events": [("events", "stream_ordering"), ("current_state_delta_stream", "stream_id"),
               ("ex_outlier_stream", "event_stream_ordering")],
    "backfill": [("events", "-stream_ordering")],
    "receipts": [("receipts_linearized", "stream_id")],
    "push_rules": [("push_rules_stream", "stream_id")],
    "to_device": [("device_inbox", "stream_id"), ("device_federation_outbox", "stream_id")],
}
#: wire name -> the name in stream_positions
RECORDED_AS = {"events": "events", "backfill": "backfill", "receipts": "receipts", "push_rules": "push_rules_stream",
               "to_device": "to_device"}

EVENT = ("INSERT INTO events (stream_ordering, topological_ordering, event_id, type, room_id, content, "
         "unrecognized_keys, processed, outlier, depth, origin_server_ts, received_ts, sender, contains_url, "
         "instance_name) VALUES (?, 1, ?, 'm.room.message', '!r:hs', '{}', '', ?, ?, 1, 0, 0, '@u:hs', ?, ?)")


class Homeserver:
    """A Synapse database (PostgreSQL or SQLite) and the URL positions reads it by."""

    def __init__(self, url: str, connect: Callable[[], Any], postgres: bool) -> None:
        self.url, self._connect, self.postgres = url, connect, postgres

    def run(self, sql: str, rows: list[tuple[Any, ...]] | None = None) -> list[Any]:
        """Execute ``sql`` (``?`` placeholders), for each of ``rows`` if given; committed; the result's rows."""
        if self.postgres:
            sql = sql.replace("?", "%s")
        conn = self._connect()
        try:
            cur = conn.cursor()
            if rows is None:
                cur.execute(sql)
            else:
                cur.executemany(sql, rows)
            out = cur.fetchall() if cur.description else []
            conn.commit()
            return out
        finally:
            conn.close()


@pytest.fixture(scope="module")
def sqlite_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty Synapse database on SQLite, its schema made by Synapse."""
    path = tmp_path_factory.mktemp("synapse-sqlite") / "homeserver.db"
    subprocess.run([synapse_python(), "-c", SYNAPSE_SCHEMA, str(path)], check=True, capture_output=True, timeout=300)
    return path


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite"])
def homeserver(request: pytest.FixtureRequest, tmp_path: Path, sqlite_schema: Path) -> Iterator[Homeserver]:
    if request.param == "sqlite":
        path = tmp_path / "homeserver.db"
        shutil.copy(sqlite_schema, path)
        yield Homeserver(f"sqlite:///{path}", lambda: sqlite3.connect(path), postgres=False)
        return
    import psycopg

    db: SynapseDb = request.getfixturevalue("synapse_db")
    yield Homeserver(db.dsn, lambda: psycopg.connect(db.dsn), postgres=True)


def fill(hs: Homeserver) -> None:
    """Writers ahead of, behind and below their recorded positions, and a stream Synapse never records.

    events: writers p1, p2, p3 (p3 recorded at 2000 though it wrote up to 2999),
    rows without instance_name (Synapse before multi-writer: master) and a
    retired writer whose rows all lie below every recorded position; backfill
    the same with negative ids and positions recorded as Synapse does (-250);
    receipts likewise; push_rules with no row above its one recorded position;
    to_device with no recorded position at all.
    """
    for table in ("stream_positions", "receipts_linearized", "push_rules_stream",
                  "device_inbox", "device_federation_outbox", "events"):
        hs.run(f"DELETE FROM {table}")
    events = [(i, f"$e{i}", True, False, False,
               "retired" if i <= 500 else None if 2001 <= i <= 2003 else f"p{i % 3 + 1}") for i in range(1, 3001)]
    events += [(-i, f"$b{i}", True, False, False, f"p{i % 2 + 1}") for i in range(1, 301)]
    hs.run(EVENT, events)
    hs.run("INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, instance_name) "
           "VALUES (?, '!r:hs', 'm.read', ?, '$e', '{}', ?)",
           [(i, f"@u{i}:hs", "gone" if i <= 10 else f"r{i % 2 + 1}") for i in range(1, 1001)])
    hs.run("INSERT INTO push_rules_stream (stream_id, event_stream_ordering, user_id, rule_id, op, instance_name) "
           "VALUES (?, 1, '@u:hs', ?, 'ADD', ?)",
           [(i, f"rule{i}", "old" if i <= 5 else "master") for i in range(1, 11)])
    hs.run("INSERT INTO device_inbox (user_id, device_id, stream_id, message_json, instance_name) "
           "VALUES ('@u:hs', 'D', ?, '{}', ?)", [(i, "w1" if i <= 40 else "w2") for i in range(1, 51)])
    hs.run("INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (?, ?, ?)", [
        ("events", "p1", 2990), ("events", "p2", 2995), ("events", "p3", 2000),
        ("backfill", "p1", -250), ("backfill", "p2", -300),
        ("receipts", "r1", 995), ("receipts", "r2", 1000),
        ("push_rules_stream", "master", 10),
    ])
    if hs.postgres:
        hs.run("ANALYZE")


def full_scan(hs: Homeserver, stream: str) -> dict[str, int]:
    """Writer -> highest id of the stream, every row read (what positions printed before)."""
    out: dict[str, int] = {}
    for table, col in TABLES[stream]:
        c = col.lstrip("-")
        agg, where = (f"-MIN({c})", f"{c} < 0") if col.startswith("-") else (f"MAX({c})", f"{c} > 0")
        for who, mx in hs.run(f"SELECT COALESCE(instance_name, 'master'), {agg} FROM {table} WHERE {where} GROUP BY 1"):
            out[who] = max(out.get(who, 0), int(mx))
    return out


def bound(hs: Homeserver, stream: str) -> int | None:
    """The lowest position recorded for the stream (a magnitude), None without any."""
    got = [abs(int(v)) for (v,) in hs.run(f"SELECT stream_id FROM stream_positions WHERE stream_name = "
                                           f"'{RECORDED_AS[stream]}'")]
    return min(got) if got else None


def positions(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What ``factstream positions --db URL --json`` prints, by (stream, writer)."""
    out = cli("positions", "--db", url, "--json")
    assert out.returncode == 0, out.stderr
    return {(r["stream"], r["writer"]): r for r in json.loads(out.stdout)}


def test_figures_above_the_bound_and_the_top_are_the_full_scans(homeserver: Homeserver) -> None:
    fill(homeserver)
    rows = positions(homeserver.url)
    for stream in TABLES:
        ref, low = full_scan(homeserver, stream), bound(homeserver, stream)
        assert ref, stream
        top = max(ref.values())
        for writer, mx in ref.items():
            if low is None or mx > low or mx == top:
                assert rows[(stream, writer)].get("max_stream_id") == mx, (stream, writer, mx, low)


def test_a_writer_recorded_behind_its_rows_is_shown_ahead(homeserver: Homeserver) -> None:
    fill(homeserver)
    rows = positions(homeserver.url)
    assert rows[("events", "p3")] == {"stream": "events", "writer": "p3", "recorded": 2000, "max_stream_id": 2999,
                                      "persisted_upto": 3000}
    assert rows[("events", "master")]["max_stream_id"] == 2003  # rows without instance_name, above the bound
    assert rows[("backfill", "p1")]["max_stream_id"] == 300 and rows[("backfill", "p2")]["max_stream_id"] == 299
    assert rows[("receipts", "r1")]["max_stream_id"] == 1000 and rows[("receipts", "r2")]["max_stream_id"] == 999


def test_a_stream_without_recorded_positions_is_read_whole(homeserver: Homeserver) -> None:
    fill(homeserver)
    rows = positions(homeserver.url)
    # to_device without stream_positions rows (as for caches, whose positions Synapse never records):
    # w1's rows all lie below w2's, and both are shown
    assert rows[("to_device", "w1")]["max_stream_id"] == 40 and rows[("to_device", "w2")]["max_stream_id"] == 50


def test_a_writer_whose_rows_all_lie_below_the_bound_is_not_given_a_max(homeserver: Homeserver) -> None:
    """The documented cost of the bound: nothing above it, nothing read of it (the stream's top row excepted)."""
    fill(homeserver)
    rows = positions(homeserver.url)
    assert ("events", "retired") not in rows and ("receipts", "gone") not in rows
    assert ("push_rules", "old") not in rows
    assert rows[("push_rules", "master")] == {"stream": "push_rules", "writer": "master", "recorded": 10,
                                              "max_stream_id": 10, "persisted_upto": 10}  # the top row, at the bound


@pytest.mark.postgres
def test_big_stream_tables_are_read_by_index_above_the_bound(synapse_db: SynapseDb) -> None:  # noqa: F811
    """PostgreSQL's own counters: no sequential scan of events or receipts_linearized, a few hundred rows fetched."""
    synapse_db.sql(
        "INSERT INTO events (stream_ordering, topological_ordering, event_id, type, room_id, content, "
        "unrecognized_keys, processed, outlier, depth, origin_server_ts, received_ts, sender, contains_url, "
        "instance_name) SELECT g, g, '$e' || g, 'm.room.message', '!r:hs', '{}', '', true, false, g, g, g, '@u:hs', "
        "false, 'p' || (g % 4 + 1) FROM generate_series(1, 100000) g",
        "INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, instance_name) "
        "SELECT 100 + g, '!r:hs', 'm.read', '@u' || g || ':hs', '$e', '{}', 'r' || (g % 2 + 1) "
        "FROM generate_series(1, 100000) g",
        "DELETE FROM stream_positions WHERE stream_name IN ('events', 'backfill', 'receipts')",
        "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES "
        "('events', 'p1', 99900), ('events', 'p2', 99950), ('events', 'p3', 99990), ('events', 'p4', 100000), "
        "('backfill', 'p1', -1), ('receipts', 'r1', 99980), ('receipts', 'r2', 100000)",
        "ANALYZE events", "ANALYZE receipts_linearized")
    counters = ("SELECT relname, seq_scan, idx_tup_fetch FROM pg_stat_user_tables "
                "WHERE relname IN ('events', 'receipts_linearized') ORDER BY 1")
    before = synapse_db.sql(counters)
    rows = positions(synapse_db.dsn)
    assert rows[("events", "p4")]["max_stream_id"] == 99999 and rows[("events", "p1")]["max_stream_id"] == 100000
    assert rows[("receipts", "r1")]["max_stream_id"] == 100100
    after = _settled(synapse_db, counters)
    for (table, seq0, idx0), (_, seq1, idx1) in zip(before, after, strict=True):
        assert seq1 == seq0, f"{table} was scanned whole ({seq1 - seq0} sequential scans)"
        assert (idx1 or 0) - (idx0 or 0) < 1000, f"{table}: {(idx1 or 0) - (idx0 or 0)} rows fetched"


def _settled(db: SynapseDb, counters: str) -> list[Any]:
    """``counters`` once positions' server process has ended (a backend reports its counters as it exits)."""
    deadline = time.monotonic() + 30
    while db.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                 "AND pid <> pg_backend_pid()")[0][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    return db.sql("SELECT pg_stat_clear_snapshot()", counters)


def test_backfill_positions_are_shown_as_magnitudes(homeserver: Homeserver) -> None:
    """Synapse records backfill as -250 / -300; 'recorded' showed those negatives beside positive max_stream_id."""
    fill(homeserver)
    rows = positions(homeserver.url)
    assert rows[("backfill", "p1")]["recorded"] == 250 and rows[("backfill", "p2")]["recorded"] == 300
    assert rows[("backfill", "p1")]["persisted_upto"] == 300  # from 250, ids -251..-300 follow without a gap
    text = cli("positions", "--db", homeserver.url)
    [line] = [ln.split() for ln in text.stdout.splitlines() if ln.startswith("backfill ") and " p1 " in ln]
    assert line[:4] == ["backfill", "p1", "250", "300"], line


def test_a_stale_low_row_no_longer_lowers_the_bound(homeserver: Homeserver) -> None:
    """A position left by a writer that is gone ('gone' at 1) made the bound 1: every row of events was read and
    'retired' (ids up to 500, below every real writer's position) came back; persisted up to stopped at 1's run.

    With the writers named (--instances), Synapse's rule sets that row aside (it deletes it at startup) and a
    note says which row and why; without them every row counts and a note says the writers are unknown.
    """
    fill(homeserver)
    homeserver.run("INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES ('events', 'gone', 1)")
    homeserver.run("DELETE FROM events WHERE stream_ordering = 1500")  # a gap between 'gone' and the real writers
    out = cli("positions", "--db", homeserver.url, "--instances", "master,p1,p2,p3", "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["stream"], r["writer"]): r for r in json.loads(out.stdout)}
    assert ("events", "retired") not in rows
    assert rows[("events", "gone")]["recorded"] == 1 and "'gone' is not among --instances" in rows[("events", "gone")]["stale"]
    assert rows[("events", "p3")]["persisted_upto"] == 3000  # from p3's 2000, ids follow up to the top
    assert "stale" not in rows[("events", "p1")]
    text = cli("positions", "--db", homeserver.url, "--instances", "master,p1,p2,p3")
    assert text.returncode == 0, text.stderr
    notes = [ln for ln in text.stdout.splitlines() if ln.startswith("# stale: events/gone")]
    assert notes == ["# stale: events/gone (recorded 1) set aside, not counted in persisted up to: 'gone' is not "
                     "among --instances; Synapse deletes this row when one of its processes starts"], text.stdout
    assert "events 3000" in text.stdout
    unjudged = positions(homeserver.url)  # no writers given: 'gone' counts, as for Synapse were it configured
    assert unjudged[("events", "retired")]["max_stream_id"] == 500 and "stale" not in unjudged[("events", "gone")]
    assert unjudged[("events", "gone")]["persisted_upto"] == 1499  # from 1, the run stops at the gap
    assert "# events: positions of gone, p1, p2, p3 all counted; give --config or --instances" in cli(
        "positions", "--db", homeserver.url).stdout
