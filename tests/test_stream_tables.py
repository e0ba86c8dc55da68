"""Stream tables carried to another process as JSON (a Spark source's options,
``logs stream --tables FILE``): exact round trip, and a clear error for a bad
file; and what ``logs stream`` checks before it starts Spark."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_run import cli, no_traceback
from conftest import twin
from factstream.demo.tables import DEMO_TABLES
from factstream.replication.tables import StreamTable, _from_json, _to_json, tables_from_json, tables_to_json
from wire_strategies import json_values


def test_the_demo_tables_round_trip() -> None:
    back = tables_from_json(tables_to_json(DEMO_TABLES))
    assert list(back.values()) == list(DEMO_TABLES)
    assert back["to_device"].plain_columns == frozenset({"entity"})


def test_a_hand_written_list_needs_only_stream_table_and_columns() -> None:
    got = tables_from_json(json.dumps([{"stream": "s", "table": "t", "columns": ["a", "b"]}]))
    assert got == {"s": StreamTable("s", "t", ("a", "b"))}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ("[]", "non-empty JSON list"),
        ('{"stream": "s"}', "non-empty JSON list"),
        ('[{"stream": "s", "table": "t"}]', 'entry 0: needs "stream", "table" and "columns"'),
        ('[{"stream": "s", "table": "t", "columns": []}]', 'entry 0: "columns" must be'),
        ('[{"stream": "s", "table": "t", "columns": "a,b"}]', 'entry 0: "columns" must be'),
    ],
)
def test_a_bad_list_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        tables_from_json(text)
    assert says in str(err.value)


def test_logs_stream_rejects_a_bad_tables_file_before_starting_spark(tmp_path: Path) -> None:
    bad = tmp_path / "tables.json"
    bad.write_text('[{"stream": "caches", "table": "demo_caches"}]')
    proc = cli("logs", "stream", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--out", str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "ck"), "--tables", str(bad))
    assert proc.returncode == 2, proc
    assert f"--tables {bad}" in proc.stderr and 'needs "stream", "table" and "columns"' in proc.stderr
    assert no_traceback(proc.stderr + proc.stdout)


def test_logs_stream_from_a_database_on_a_spark_without_python_data_sources_says_what_to_do(tmp_path: Path) -> None:
    # pyspark 3.5 (allowed by the spark extra) has no pyspark.sql.datasource: hide it as 3.5 would lack it.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _No:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pyspark.sql.datasource':\n"
        "            raise ImportError('no Python data sources in this pyspark')\n"
        "sys.meta_path.insert(0, _No())\n"
    )
    proc = cli("logs", "stream", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--out", str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "ck"), PYTHONPATH=str(site))
    assert proc.returncode == 2, proc
    assert "needs pyspark 4" in proc.stderr and "--files DIR" in proc.stderr
    assert no_traceback(proc.stderr + proc.stdout)


# -- the column codec and the one-statement insert (serve --produce's hot path)

ODD_VALUES: list[Any] = [
    "plain", "é\u2028\"\\\n\x01", "", "\U0001f600", 0, -5, 10**30, 1.5, -0.0, 1e300, float("nan"), float("inf"),
    None, True, False, [1, "a", None], {"ts": 1.25, "x": [True, {}]}, {"k": {"a": []}}, [], {}, (1, 2),
    {1: 2, None: 3, 1.5: True},
]


@pytest.mark.parametrize("value", ODD_VALUES, ids=repr)
def test_the_column_codec_writes_and_reads_what_json_does(value: Any, wire_impl: ModuleType) -> None:
    text = json.dumps(value)
    assert wire_impl.column_text(value) == text
    assert _to_json(value) == text  # the active twin, as tables use it
    assert repr(_from_json(text)) == repr(json.loads(text))


@given(value=json_values | st.lists(st.floats(), max_size=3) | st.dictionaries(st.text(max_size=3), json_values, max_size=3))
@settings(max_examples=300, deadline=None)
def test_column_text_is_json_dumps_for_any_json_value(value: Any) -> None:
    for impl in ("py", "c"):
        assert twin("_wire", impl).column_text(value) == json.dumps(value)


def test_column_params_are_the_row_as_a_table_stores_it(wire_impl: ModuleType) -> None:
    params = wire_impl.ColumnParams("receipts", [True, False, True, True])
    row = ["!r:hs", "m.read", None, {"ts": 1764221234123, "é": [1.5, True]}]
    got = params.params(7, "master", row)
    assert got == (7, "master", '"!r:hs"', "m.read", "null", '{"ts": 1764221234123, "\\u00e9": [1.5, true]}')
    assert got[3] is row[1]  # a plain column is the field itself
    assert params.json_flags == (True, False, True, True) and params.table == "receipts"
    with pytest.raises(ValueError, match="row has 3 fields, table receipts has 4 columns"):
        params.params(8, "master", row[:3])
    with pytest.raises(TypeError):
        params.params(9, "master", ["a", "b", {1, 2}, None])
    assert params.params(10, "master", ("a", 1, 2, 3)) == (10, "master", '"a"', 1, "2", "3")


@pytest.mark.parametrize("text", ["", " 1", "1 ", "[1,", "nul", '"a', '"\\x"', "1.5.3", "{}x", "\x00", '"\x01"', "NaN"])
def test_the_column_codec_accepts_and_refuses_what_json_loads_does(text: str) -> None:
    try:
        expected: Any = ("value", repr(json.loads(text)))
    except json.JSONDecodeError as err:
        expected = ("error", str(err))
    try:
        got: Any = ("value", repr(_from_json(text)))
    except json.JSONDecodeError as err:
        got = ("error", str(err))
    assert got == expected


def test_the_column_codec_refuses_what_json_dumps_refuses(wire_impl: ModuleType) -> None:
    for bad in ({1, 2}, object(), {(1,): 2}):
        with pytest.raises(TypeError) as ours:
            wire_impl.column_text(bad)
        with pytest.raises(TypeError) as theirs:
            json.dumps(bad)
        assert str(ours.value) == str(theirs.value)


def test_rows_encode_and_decode_per_table_as_before() -> None:
    mixed = StreamTable("s", "t'x", ("a", "b", "c"), frozenset({"b"}))
    row = [{"k": [1]}, "bare", None]
    assert mixed.insert_params(7, "w", row) == (7, "w", '{"k": [1]}', "bare", "null")
    assert mixed.to_row(('{"k": [1]}', "bare", "null")) == mixed.row_decoder(('{"k": [1]}', "bare", "null")) == row
    assert mixed.row_decoder((None, None, None)) == [None, None, None]  # SQL NULL stays None
    with pytest.raises(ValueError, match="row has 2 fields, table t'x has 3 columns"):
        mixed.insert_params(7, "w", row[:2])


async def test_insert_rows_writes_a_transactions_rows_in_order(engine_db: Any) -> None:
    """One statement for many rows, on both engines; a token's rows read back in the order given."""
    from factstream.replication.tables import SQLITE_VALUES_PARAMETERS, create_tables

    table = next(t for t in DEMO_TABLES if t.stream == "receipts")
    await create_tables(engine_db, [table])
    n = 400  # several multi-row VALUES on SQLite (8 parameters a row)
    rows = [table.insert_params(2 + i // 3, "w1", [f"!r{i}:hs", "m.read", f"@u{i}:hs", f"$e{i}", None, {"i": i, "s": "é\"'%?"}])
            for i in range(n)]
    if engine_db.engine == "sqlite":
        per = SQLITE_VALUES_PARAMETERS // 8
        assert len(table.insert_rows("sqlite", rows[30:])) == -(-(n - 30) // per) > 1
    for chunk in (rows[:1], rows[1:30], rows[30:]):
        await engine_db.run_transaction(table.insert_rows(engine_db.engine, chunk))
    updates, upto, limited = await table.source(engine_db).get_updates("w1", 1, 200, 1000)
    assert (upto, limited) == (200, False)
    assert [(token, row[0], row[5]) for token, row in updates] == [
        (2 + i // 3, f"!r{i}:hs", {"i": i, "s": "é\"'%?"}) for i in range(n) if 2 + i // 3 <= 200
    ]
    last = 2 + (n - 1) // 3
    updates, upto, limited = await table.source(engine_db).get_updates("w1", last - 1, last, 1000)
    assert [row[0] for _, row in updates] == [f"!r{i}:hs" for i in range(n) if 2 + i // 3 == last]
    with pytest.raises(ValueError):
        table.insert_rows(engine_db.engine, [])


async def test_a_writer_can_wait_for_its_publisher_to_catch_up(tmp_path: Path) -> None:
    """Publisher.backlog / wait_backlog: what serve --produce paces itself by."""
    from factstream.replication import Publisher
    from factstream.replication.tables import create_tables, open_id_generators
    from factstream.store.database import connect

    table = next(t for t in DEMO_TABLES if t.stream == "to_device")
    db = await connect(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        await create_tables(db, [table])
        gen = (await open_id_generators(db, "master", [table]))["to_device"]
        pub = Publisher("master", page_limit=10)
        sent: list[Any] = []
        pub.add_sink(sent.extend)
        pub.add_stream("to_device", table.source(db), gen.current_token())
        gen.add_listener(pub.notify)
        assert pub.backlog() == 0
        await pub.wait_backlog(0)  # nothing to wait for
        async with gen.get_next_mult(50) as ids:
            await db.run_transaction(table.insert_rows(db.engine, [table.insert_params(i, "master", [f"@u{i}:hs"]) for i in ids]))
        assert pub.backlog() == 50  # notified, not yet read back and sent
        await asyncio.wait_for(pub.wait_backlog(25), 10)
        assert pub.backlog() <= 25 and len(sent) >= 25
        await asyncio.wait_for(pub.wait_backlog(0), 10)
        assert pub.backlog() == 0 and [c.token for c in sent] == list(ids)
        await gen.close()
        pub.close()
    finally:
        await db.close()
