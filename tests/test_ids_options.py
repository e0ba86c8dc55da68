"""Arguments of create_id_generator and IdGenerator are checked up front, with errors that say what to pass.

Before, ``writers="master"`` became six writers m, a, s, t, e, r; ``stream_name=None`` wrote rows with a NULL
stream name on SQLite; ``backwards="no"`` handed out negative ids; ``get_next_txn(db)`` was an AttributeError.
"""

from __future__ import annotations

import pytest

from factstream.ids import IdGenerator, IdGeneratorError, PositionTracker, create_id_generator
from factstream.store.database import Database
from factstream.store.migrations import migrate
from test_ids import TABLES, db, make  # noqa: F401 - the facts table fixture and the generator maker


BAD = [
    ({"writers": "master"}, TypeError, "writers must be a sequence of instance names"),
    ({"writers": None}, TypeError, "writers must be a sequence"),
    ({"writers": [1]}, TypeError, "each writer must be a str"),
    ({"writers": ["master", ""]}, ValueError, "each writer must not be empty"),
    ({"writers": ()}, IdGeneratorError, "needs at least one writer"),
    ({"stream_name": None}, TypeError, "stream_name must be a str"),
    ({"stream_name": 5}, TypeError, "stream_name must be a str"),
    ({"stream_name": ""}, ValueError, "stream_name must not be empty"),
    ({"instance_name": None}, TypeError, "instance_name must be a str"),
    ({"instance_name": b"master"}, TypeError, "instance_name must be a str"),
    ({"backwards": "no"}, TypeError, "backwards must be True or False"),
    ({"backwards": 1}, TypeError, "backwards must be True or False"),
    ({"sequence_name": "x; drop table facts"}, IdGeneratorError, "not a plain SQL identifier"),
    ({"sequence_name": 5}, TypeError, "sequence_name must be a str"),
    ({"tables": [("facts", "instance_name", None)]}, TypeError, "the id column must be a name"),
    ({"tables": [(None, "instance_name", "stream_id")]}, TypeError, "the table must be a name"),
    ({"tables": [("facts", 5, "stream_id")]}, TypeError, "the instance column must be a name"),
    ({"tables": [("facts", "instance name", "stream_id")]}, IdGeneratorError, "not a plain SQL identifier"),
    ({"tables": "facts"}, TypeError, "tables must be a list of"),
    ({"tables": ["abc"]}, IdGeneratorError, "must be .table, instance_column"),
    ({"tables": ("facts", "instance_name", "stream_id")}, IdGeneratorError, "must be .table, instance_column"),
]


async def test_bad_arguments_are_refused_before_anything_is_written(db: Database) -> None:
    await migrate(db, ["streams"])
    for kw, error, message in BAD:
        with pytest.raises(error, match=message):
            await make(db, **kw)
    # nothing reached the database: no stream was recorded, no sequence made
    assert await db.fetchall("SELECT stream_name FROM stream_positions") == []
    if db.engine == "postgres":
        sequences = "SELECT relname FROM pg_class WHERE relkind = 'S' AND relname LIKE '%stream_seq'"
        assert await db.fetchall(sequences) == []
    with pytest.raises(TypeError, match="takes the Database from connect"):
        await make(db.url)
    # still fine afterwards, with the good form of each
    gen = await make(db, writers=["master"], backwards=False, sequence_name="events_seq")
    assert gen.writers == ("master",) and gen.is_writer
    # sequence_name is for PostgreSQL; SQLite has no sequences and says so by having none
    assert gen.sequence_name == ("events_seq" if db.engine == "postgres" else None)
    await gen.close()


async def test_bad_calls_on_a_generator_say_what_to_pass(db: Database) -> None:
    gen = await make(db)
    for not_a_txn in (db, None, "txn"):
        with pytest.raises(TypeError, match=r"pass the transaction from db\.transaction\(\)"):
            await gen.get_next_txn(not_a_txn)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"pass the transaction from db\.transaction\(\)"):
            await gen.get_next_mult_txn(not_a_txn, 2)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="position must be a whole number"):
        await gen.wait_for("master", "99", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="position must be"):
        await gen.wait_for("master", -3, 1)  # a backwards stream's positions are positive too
    with pytest.raises(TypeError, match="instance_name must be a str"):
        await gen.wait_for(5, 2, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        await gen.wait_for("master", 99, -1)
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        await gen.wait_for("master", 99, "1")  # type: ignore[arg-type]

    for not_callable in (None, 5, "print"):
        with pytest.raises(TypeError, match="a listener must be callable"):
            gen.add_listener(not_callable)  # type: ignore[arg-type]
    seen: list[int] = []

    def listener(stream: str, writer: str, old: int, new: int) -> None:
        seen.append(new)

    with pytest.raises(ValueError, match="is not a listener"):
        gen.remove_listener(listener)
    gen.add_listener(listener)
    async with gen.get_next() as sid:
        pass
    assert seen == [sid]  # the refused listeners were never added: nothing was logged as failing
    gen.remove_listener(listener)
    with pytest.raises(ValueError, match="already removed"):
        gen.remove_listener(listener)
    async with gen.get_next():
        pass
    assert seen == [sid]
    await gen.close()


def test_tracker_and_generator_check_their_own_arguments() -> None:
    with pytest.raises(TypeError, match="writers must be a sequence"):
        PositionTracker("s", "m", "master", {})
    with pytest.raises(TypeError, match="instance_name must be a str"):
        PositionTracker("s", None, ("master",), {})  # type: ignore[arg-type]
    tracker = PositionTracker("s", "master", ("master",), {})
    with pytest.raises(TypeError, match="backwards must be True or False"):
        IdGenerator(None, tracker, backwards="no", sequence_name=None, counter=None)  # type: ignore[arg-type]
