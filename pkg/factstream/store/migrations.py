"""Versioned, idempotent schema per component.

Why: several components (stream ids, the event store, ...) each own tables
and must be able to evolve them. Each registers an ordered list of steps; the
position in the list is the version. :func:`migrate` applies the steps a
database has not seen yet, one component per transaction, and records the
version in ``schema_versions``. Running it again does nothing.

A step is one of:

* a SQL string (several statements may be separated by ``;``; do not put
  ``;`` inside string literals). Engine differences are written as tokens
  replaced before running: ``{serial_primary_key}`` (``BIGSERIAL PRIMARY KEY``
  on PostgreSQL, ``INTEGER PRIMARY KEY AUTOINCREMENT`` on SQLite),
  ``{bytes}`` (``BYTEA`` / ``BLOB``), ``{json}`` (``JSONB`` / ``TEXT``);
* a dict ``{"sqlite": sql, "postgres": sql}`` for steps that differ entirely;
* an async callable ``step(txn)`` for anything else.

Never edit or reorder a released step: append a new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Union

from .database import Database, Transaction

__all__ = ["Step", "register", "unregister", "registered", "migrate", "schema_version", "render"]

Step = Union[str, Mapping[str, str], Callable[[Transaction], Awaitable[None]]]

_REGISTRY: dict[str, list[Step]] = {}

_TOKENS: dict[str, dict[str, str]] = {
    "postgres": {
        "{serial_primary_key}": "BIGSERIAL PRIMARY KEY",
        "{bytes}": "BYTEA",
        "{json}": "JSONB",
    },
    "sqlite": {
        "{serial_primary_key}": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "{bytes}": "BLOB",
        "{json}": "TEXT",
    },
}

# Serialises concurrent migrate() calls from several processes on PostgreSQL
# (SQLite transactions are already exclusive: BEGIN IMMEDIATE).
_PG_LOCK_KEY = 0x66616374  # "fact"


def register(component: str, steps: Sequence[Step]) -> None:
    """Declare (or re-declare, e.g. on re-import) the schema steps of ``component``.

    Re-registering may only append steps: the versions a database has already
    applied must keep meaning the same thing.
    """
    if not component:
        raise ValueError("component name must not be empty")
    old = _REGISTRY.get(component)
    new = list(steps)
    if old is not None and new[: len(old)] != old and len(new) >= len(old):
        # callables re-created on reload compare unequal; only refuse changed SQL
        for a, b in zip(old, new):
            if isinstance(a, (str, dict)) and a != b:
                raise ValueError(
                    f"schema step of component {component!r} changed; append a new step instead of editing one"
                )
    _REGISTRY[component] = new


def unregister(component: str) -> None:
    """Forget ``component`` (tests use it to drop throw-away components)."""
    _REGISTRY.pop(component, None)


def registered() -> dict[str, int]:
    """Each registered component and its latest version."""
    return {name: len(steps) for name, steps in _REGISTRY.items()}


def render(sql: str, engine: str) -> list[str]:
    """The statements of one SQL step for ``engine``, tokens replaced."""
    for token, value in _TOKENS[engine].items():
        sql = sql.replace(token, value)
    return [part.strip() for part in sql.split(";") if part.strip()]


async def _ensure_versions_table(txn: Transaction) -> None:
    if txn.engine == "postgres":
        await txn.execute(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
    await txn.execute(
        "CREATE TABLE IF NOT EXISTS schema_versions ("
        " component TEXT NOT NULL PRIMARY KEY,"
        " version INTEGER NOT NULL)"
    )


async def schema_version(db: Database, component: str) -> int:
    """The version of ``component`` applied to ``db`` (0 if none)."""
    async with db.transaction() as txn:
        await _ensure_versions_table(txn)
        row = await txn.fetchone("SELECT version FROM schema_versions WHERE component = ?", (component,))
    return int(row[0]) if row else 0


async def _apply(txn: Transaction, step: Step) -> None:
    if isinstance(step, str):
        for stmt in render(step, txn.engine):
            await txn.execute(stmt)
    elif isinstance(step, Mapping):
        if txn.engine not in step:
            raise ValueError(f"migration step has no SQL for {txn.engine}: {sorted(step)}")
        for stmt in render(step[txn.engine], txn.engine):
            await txn.execute(stmt)
    else:
        await step(txn)


async def migrate(db: Database, components: Sequence[str] | None = None) -> dict[str, int]:
    """Apply the pending steps of every registered component (or just ``components``).

    Returns the version of each component afterwards. Each component is
    upgraded in its own transaction, so a failing step leaves that component at
    its previous version and the error propagates.
    """
    names = list(_REGISTRY) if components is None else list(components)
    versions: dict[str, int] = {}
    for name in names:
        if name not in _REGISTRY:
            raise KeyError(f"no schema registered for component {name!r}; import its module first")
        steps = _REGISTRY[name]
        async with db.transaction() as txn:
            await _ensure_versions_table(txn)
            row = await txn.fetchone("SELECT version FROM schema_versions WHERE component = ?", (name,))
            current = int(row[0]) if row else 0
            if current > len(steps):
                raise RuntimeError(
                    f"database has schema version {current} of {name!r} but this factstream knows only "
                    f"{len(steps)}; upgrade factstream (the database was migrated by a newer release)"
                )
            for step in steps[current:]:
                await _apply(txn, step)
            if current != len(steps):
                if row is None:
                    await txn.execute(
                        "INSERT INTO schema_versions (component, version) VALUES (?, ?)", (name, len(steps))
                    )
                else:
                    await txn.execute(
                        "UPDATE schema_versions SET version = ? WHERE component = ?", (len(steps), name)
                    )
            versions[name] = len(steps)
    return versions


# ----------------------------------------------------------------------------- streams

register(
    "streams",
    [
        # 1: each writer's last announced position per stream (a recovery hint;
        # the backing tables are the truth above the minimum of these).
        "CREATE TABLE IF NOT EXISTS stream_positions ("
        " stream_name TEXT NOT NULL,"
        " instance_name TEXT NOT NULL,"
        " stream_id BIGINT NOT NULL,"
        " PRIMARY KEY (stream_name, instance_name))",
        # 2: compact numeric ids of writer instances, used in multi-writer tokens.
        "CREATE TABLE IF NOT EXISTS instance_map ("
        " instance_id {serial_primary_key},"
        " instance_name TEXT NOT NULL UNIQUE)",
        # 3: SQLite writers: the highest id a counter may have handed out, written
        # before the ids are (PostgreSQL's sequences are this already), so a
        # writer that crashed never hands out an id again after restarting.
        "CREATE TABLE IF NOT EXISTS stream_id_blocks ("
        " stream_name TEXT NOT NULL PRIMARY KEY,"
        " reserved_upto BIGINT NOT NULL)",
    ],
)
