"""Throw-away Synapse databases for the ``factstream synapse`` tests, made by Synapse itself.

One template database per test session: Synapse (the oracle) creates its
schema and writes some traffic through its own stores; every test clones it
(``CREATE DATABASE ... TEMPLATE``), damages its copy the way Synapse's issue
tracker describes, and drops it afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_HOST, PG_PORT, PG_START, PG_USER, pg_dsn, require_service, synapse_python

HERE = Path(__file__).resolve().parent
ORACLE_SCRIPT = str(HERE / "synapse_db_oracle.py")
FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")


def factstream(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the installed ``factstream`` executable."""
    assert os.path.exists(FACTSTREAM), f"{FACTSTREAM} missing: run 'make install'"
    return subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=timeout)


def homeserver_config(directory: Path, dbname: str, server_name: str, **extra: Any) -> Path:
    """A homeserver config (as JSON, which is YAML too) for ``dbname``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "signing.key"
    if not key.exists():
        subprocess.run(
            [synapse_python(), "-c",
             "import sys; from signedjson.key import generate_signing_key, write_signing_keys; "
             "write_signing_keys(open(sys.argv[1], 'w'), [generate_signing_key('test')])", str(key)],
            check=True, timeout=60)
    config = {
        "server_name": server_name,
        "report_stats": False,
        "signing_key_path": str(key),
        "media_store_path": str(directory / "media"),
        "database": {"name": "psycopg2", "args": {
            "user": PG_USER, "host": PG_HOST, "port": PG_PORT, "dbname": dbname, "cp_min": 1, "cp_max": 3}},
        **extra,
    }
    path = directory / f"{dbname}.json"
    path.write_text(json.dumps(config, indent=1))
    return path


def oracle(mode: str, config: Path, timeout: float = 240) -> dict[str, Any]:
    """Run Synapse's own code on the database of ``config`` (see synapse_db_oracle.py)."""
    proc = subprocess.run([synapse_python(), ORACLE_SCRIPT, mode, str(config)], capture_output=True, text=True,
                          timeout=timeout, cwd="/")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"oracle {mode} printed nothing: {proc.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _create_db(name: str, template: str = "template0") -> None:
    import psycopg

    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE \"{template}\"")


def _drop_db(name: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def synapse_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The name of a database holding Synapse's schema and some traffic written by Synapse."""
    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    synapse_python()
    name = f"factstream_syntpl_{uuid.uuid4().hex[:10]}"
    _create_db(name)
    try:
        config = homeserver_config(tmp_path_factory.mktemp("synapse-template"), name, "check.test")
        result = oracle("prepare", config, timeout=600)
        assert result["ok"], result
        yield name
    finally:
        _drop_db(name)


@dataclass
class SynapseDb:
    """One test's copy of the template."""

    name: str
    dsn: str
    config: Path

    def sql(self, *statements: str) -> list[Any]:
        """Run statements (autocommit) as the damage a test inflicts; the last result's rows."""
        import psycopg

        rows: list[Any] = []
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for s in statements:
                cur = conn.execute(s)
                rows = cur.fetchall() if cur.description else []
        return rows

    def state(self) -> tuple[list[Any], list[Any]]:
        """Every sequence value and every stream_positions row, to prove nothing changed."""
        seqs = self.sql("SELECT sequencename, last_value, 0 FROM pg_sequences ORDER BY 1")
        pos = self.sql("SELECT stream_name, instance_name, stream_id FROM stream_positions ORDER BY 1, 2")
        return seqs, pos


@pytest.fixture
def synapse_db(synapse_template: str, tmp_path: Path) -> Iterator[SynapseDb]:
    """A fresh copy of the Synapse template database, dropped afterwards."""
    name = f"factstream_syn_{uuid.uuid4().hex[:10]}"
    _create_db(name, template=synapse_template)
    try:
        yield SynapseDb(name, pg_dsn(name), homeserver_config(tmp_path, name, "check.test"))
    finally:
        _drop_db(name)
