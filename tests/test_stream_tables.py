"""Stream tables carried to another process as JSON (a Spark source's options,
``logs stream --tables FILE``): exact round trip, and a clear error for a bad
file; and what ``logs stream`` checks before it starts Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_run import cli, no_traceback
from factstream.demo.tables import DEMO_TABLES
from factstream.replication.tables import StreamTable, tables_from_json, tables_to_json


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
