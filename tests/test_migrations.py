"""factstream.store.migrations: versioned, idempotent, per component, on both engines."""

from __future__ import annotations

import uuid

from typing import Any

import pytest

from factstream.store import migrations
from factstream.store.database import Database, Transaction



@pytest.fixture
def db(engine_db: Any) -> Any:
    """An empty database of each engine (conftest's engine_db)."""
    return engine_db


@pytest.fixture(autouse=True)
def forget_test_components() -> object:
    """Throw-away components must not leak into other tests' migrate(db)."""
    before = set(migrations.registered())
    yield None
    for name in set(migrations.registered()) - before:
        migrations.unregister(name)


async def test_streams_schema_twice_is_idempotent(db: Database) -> None:
    first = await migrations.migrate(db, ["streams"])
    assert first == {"streams": 3}
    assert await migrations.migrate(db, ["streams"]) == {"streams": 3}
    await migrations.migrate(db)  # every registered component, twice
    await migrations.migrate(db)
    assert await migrations.schema_version(db, "streams") == 3
    await db.execute("INSERT INTO stream_positions VALUES (?, ?, ?)", ("events", "master", 5))
    await db.execute("INSERT INTO instance_map (instance_name) VALUES (?)", ("w1",))
    await db.execute("INSERT INTO instance_map (instance_name) VALUES (?)", ("w2",))
    assert await db.fetchall("SELECT instance_id, instance_name FROM instance_map ORDER BY instance_id") == [
        (1, "w1"),
        (2, "w2"),
    ]


async def test_component_upgrade_applies_only_new_steps(db: Database) -> None:
    name = f"test_{uuid.uuid4().hex[:8]}"
    calls: list[str] = []

    async def fill(txn: Transaction) -> None:
        calls.append(txn.engine)
        await txn.execute(f"INSERT INTO {name} (payload) VALUES (?)", (b"x",))

    migrations.register(name, [f"CREATE TABLE {name} (id {{serial_primary_key}}, payload {{bytes}})"])
    assert (await migrations.migrate(db, [name]))[name] == 1
    migrations.register(
        name,
        [
            f"CREATE TABLE {name} (id {{serial_primary_key}}, payload {{bytes}})",
            fill,
            {"sqlite": f"CREATE INDEX {name}_i ON {name} (payload)", "postgres": f"CREATE INDEX {name}_i ON {name} (payload)"},
        ],
    )
    assert (await migrations.migrate(db, [name]))[name] == 3
    assert (await migrations.migrate(db, [name]))[name] == 3
    assert calls == [db.engine]
    assert await db.fetchall(f"SELECT id FROM {name}") == [(1,)]


async def test_failed_step_leaves_previous_version(db: Database) -> None:
    name = f"test_{uuid.uuid4().hex[:8]}"
    migrations.register(name, [f"CREATE TABLE {name} (id INTEGER)", "THIS IS NOT SQL"])
    with pytest.raises(Exception):
        await migrations.migrate(db, [name])
    assert await migrations.schema_version(db, name) == 0


async def test_newer_database_is_refused(db: Database) -> None:
    name = f"test_{uuid.uuid4().hex[:8]}"
    migrations.register(name, [f"CREATE TABLE {name} (id INTEGER)"])
    await migrations.migrate(db, [name])
    await db.execute("UPDATE schema_versions SET version = 7 WHERE component = ?", (name,))
    with pytest.raises(RuntimeError, match="upgrade factstream"):
        await migrations.migrate(db, [name])


def test_editing_a_released_step_is_refused() -> None:
    name = f"test_{uuid.uuid4().hex[:8]}"
    migrations.register(name, ["CREATE TABLE a (id INTEGER)"])
    with pytest.raises(ValueError, match="append a new step"):
        migrations.register(name, ["CREATE TABLE b (id INTEGER)", "SELECT 1"])


async def test_unknown_component(db: Database) -> None:
    with pytest.raises(KeyError, match="import its module"):
        await migrations.migrate(db, ["no-such-component"])
