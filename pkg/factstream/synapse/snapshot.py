"""Read, never write, the id state of a Synapse database: sequences, table tops, writer positions.

One read-only, repeatable-read transaction (PostgreSQL) or a read-only
connection (SQLite) so that the figures of one check belong together. The
queries are the ones every Synapse process runs at startup (the MAX/MIN of each
id column, the rows above the highest recorded position), so a check costs a
production database no more than starting one worker does.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from ..errors import FactstreamError
from ..redaction import redact_about, redact_url
from .streams import SYNAPSE_ID_STREAMS, SynapseIdStream

__all__ = ["CheckError", "SequenceState", "TableState", "RowsAbove", "StreamState", "DatabaseSnapshot",
           "connect", "take_snapshot", "engine_of", "url_problem", "require_synapse_schema"]


class CheckError(FactstreamError):
    """The database could not be checked (unreachable, not a Synapse database, ...)."""


@dataclass(frozen=True, slots=True)
class SequenceState:
    """A PostgreSQL sequence as ``SELECT last_value, is_called`` shows it."""

    name: str
    exists: bool
    last_value: int | None = None
    is_called: bool | None = None

    @property
    def last_issued(self) -> int | None:
        """The highest id the sequence has handed out (``last_value`` minus one when not yet called)."""
        if self.last_value is None:
            return None
        return self.last_value if self.is_called else self.last_value - 1


@dataclass(frozen=True, slots=True)
class TableState:
    """One of a stream's tables: whether it exists and its highest id (as a magnitude, 0 when empty)."""

    table: str
    exists: bool
    top: int = 0


@dataclass(frozen=True, slots=True)
class RowsAbove:
    """Rows of one writer whose ids lie above every recorded position (magnitudes)."""

    instance: str | None
    count: int
    lowest: int
    highest: int


@dataclass
class StreamState:
    """Everything a check knows about one stream.

    Ids are magnitudes: for backfill (ids -1, -2, ...) ``top`` 5 means id -5.
    ``positions`` keeps the values exactly as stored in ``stream_positions``.
    """

    stream: SynapseIdStream
    sequence: SequenceState | None
    tables: list[TableState]
    positions: dict[str, int] = field(default_factory=dict)
    rows_above: list[RowsAbove] = field(default_factory=list)

    @property
    def present(self) -> bool:
        """Whether this Synapse schema has the stream at all (some table or the sequence exists)."""
        return any(t.exists for t in self.tables) or bool(self.sequence and self.sequence.exists)

    @property
    def table_top(self) -> int:
        """The highest id in any of the stream's tables (magnitude)."""
        return max((t.top for t in self.tables if t.exists), default=0)

    def magnitude(self, stored: int) -> int:
        """A stored id as a magnitude (backfill stores negative ids)."""
        return stored if self.stream.positive else -stored

    @property
    def position_top(self) -> int | None:
        """The highest recorded writer position (magnitude), None when no writer recorded one."""
        return max((self.magnitude(v) for v in self.positions.values()), default=None)


@dataclass
class DatabaseSnapshot:
    """The streams of one database, with what identifies it."""

    url: str
    engine: str
    schema_version: int | None
    streams: list[StreamState]
    extra_positions: dict[str, dict[str, int]] = field(default_factory=dict)


def engine_of(url: str) -> str:
    """"postgresql" or "sqlite" for a database URL (CheckError saying how to write it otherwise)."""
    problem = url_problem(url)
    if problem:
        raise CheckError(problem)
    scheme = urlsplit(url).scheme.split("+")[0].lower()
    return "sqlite" if scheme == "sqlite" else "postgresql"


def url_problem(url: str) -> str | None:
    """What is wrong with how ``url`` is written (password masked), before anything connects; None if fine.

    A driver reading a malformed URL quotes the piece it trips on, and with an
    unencoded ``@`` or ``/`` in a password that piece is part of the password:
    such a URL is refused here, before the driver sees it, by
    :func:`~factstream.store.database.check_url`, so in the words every other
    command uses for it.
    """
    import difflib

    from ..store.database import DatabaseURLError, check_url

    head, sep, _ = url.partition("://")
    lowered = url.lower()
    if not sep and lowered.split(":", 1)[0] in ("postgresql", "postgres") and ":" in url:
        return (f"{redact_url(url)!r} is not a URL: write two slashes after the scheme: "
                "postgresql://user@host:port/dbname")
    if sep:
        scheme = head.split("+")[0].lower()
        if scheme not in ("postgresql", "postgres", "sqlite"):
            near = difflib.get_close_matches(scheme, ("postgresql", "postgres", "sqlite"), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}://?)" if near else ""
            return (f"unsupported database URL {redact_url(url)!r}{hint}: use "
                    "postgresql://user@host:port/dbname or sqlite:///path/homeserver.db")
    try:
        check_url(url)
    except DatabaseURLError as err:
        return str(err)
    return None


def _connect_timeout_given(url: str) -> bool:
    try:
        from psycopg.conninfo import conninfo_to_dict

        return "connect_timeout" in conninfo_to_dict(url)
    except Exception:  # libpq will say what is wrong with it
        return False


def connect(url: str, *, read_only: bool = True, origin: str | None = None) -> Any:
    """A DB-API connection to ``url`` (read-only unless asked), or CheckError with a redacted reason.

    ``origin`` says where the URL came from when the user did not type it (the
    config's database section): the message then names it and what to change.
    """
    engine = engine_of(url)
    via = f" ({origin})" if origin else ""
    try:
        if engine == "postgresql":
            import psycopg

            timeout: dict[str, Any] = {} if _connect_timeout_given(url) else {"connect_timeout": 10}
            conn = psycopg.connect(url, application_name="factstream-synapse-check", **timeout)
            if read_only:
                conn.read_only = True
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            return conn
        path = url.split("://", 1)[1]
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise CheckError("sqlite URL without a path: use sqlite:///path/to/homeserver.db")
        if not os.path.exists(path) or os.path.isdir(path):
            what = "is a directory, not a database file" if os.path.isdir(path) else "does not exist"
            relative = "" if os.path.isabs(path) else (
                f" (a relative path, read from the current directory {os.getcwd()}; Synapse reads it from its own "
                "working directory)")
            fix = "; pass --db sqlite:///ABSOLUTE/PATH" if origin else ""
            raise CheckError(f"SQLite database {path!r}{via} {what}{relative}{fix}")
        mode = "ro" if read_only else "rw"
        # opened and used in --db-timeout's worker threads (one at a time, never two at once)
        return sqlite3.connect(f"file:{quote(path)}?mode={mode}", uri=True, check_same_thread=False)
    except CheckError:
        raise
    except Exception as err:  # the driver's own error, which may quote the URL
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = ("; check host, port, user, password and dbname there, or pass --db URL" if origin else "")
        raise CheckError(f"cannot connect to {redact_url(url)}{via}: {redact_about(first, url)}{fix}") from None


def _one(cur: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    cur.execute(sql, params)
    row = cur.fetchone()
    return row


def _table_exists(cur: Any, engine: str, table: str) -> bool:
    if engine == "postgresql":
        return _one(cur, "SELECT to_regclass(%s) IS NOT NULL", (table,))[0] is True
    return bool(_one(cur, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))[0] > 0)


def _sequence(cur: Any, name: str) -> SequenceState:
    kind = _one(cur, "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (name,))
    if not kind or kind[0] != "S":
        return SequenceState(name, False)
    last_value, is_called = _one(cur, f'SELECT last_value, is_called FROM "{name}"')
    return SequenceState(name, True, int(last_value), bool(is_called))


def _stream_state(cur: Any, engine: str, stream: SynapseIdStream) -> StreamState:
    ph = "%s" if engine == "postgresql" else "?"
    sequence = _sequence(cur, stream.sequence) if engine == "postgresql" else None
    tables: list[TableState] = []
    for t in stream.tables:
        if not _table_exists(cur, engine, t.table):
            tables.append(TableState(t.table, False))
            continue
        if stream.positive:
            (top,) = _one(cur, f"SELECT MAX({t.id_column}) FROM {t.table}")
            tables.append(TableState(t.table, True, max(int(top or 0), 0)))
        else:
            (low,) = _one(cur, f"SELECT MIN({t.id_column}) FROM {t.table}")
            tables.append(TableState(t.table, True, max(-int(low or 0), 0)))
    state = StreamState(stream, sequence, tables)
    cur.execute(f"SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = {ph}", (stream.name,))
    state.positions = {str(inst): int(sid) for inst, sid in cur.fetchall()}
    bound = state.position_top
    if bound is not None:
        above: dict[str | None, list[int]] = {}
        for t, ts in zip(stream.tables, tables):
            if not ts.exists or ts.top <= bound:
                continue
            if stream.positive:
                sql = (f"SELECT {t.instance_column}, COUNT(*), MIN({t.id_column}), MAX({t.id_column}) "
                       f"FROM {t.table} WHERE {t.id_column} > {ph} GROUP BY {t.instance_column}")
                cur.execute(sql, (bound,))
                found = [(inst, int(n), int(lo), int(hi)) for inst, n, lo, hi in cur.fetchall()]
            else:
                sql = (f"SELECT {t.instance_column}, COUNT(*), -MAX({t.id_column}), -MIN({t.id_column}) "
                       f"FROM {t.table} WHERE {t.id_column} < {ph} GROUP BY {t.instance_column}")
                cur.execute(sql, (-bound,))
                found = [(inst, int(n), int(lo), int(hi)) for inst, n, lo, hi in cur.fetchall()]
            for inst, n, lo, hi in found:
                acc = above.setdefault(inst, [0, lo, hi])
                acc[0] += n
                acc[1] = min(acc[1], lo)
                acc[2] = max(acc[2], hi)
        state.rows_above = [RowsAbove(inst, n, lo, hi) for inst, (n, lo, hi) in
                            sorted(above.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))]
    return state


#: Tables every Synapse schema has had (since before its stream writers existed): without them
#: the database is not Synapse's (factstream's own database has a stream_positions table too).
SYNAPSE_MARKER_TABLES = ("schema_version", "stream_positions", "events", "event_json", "room_memberships")


def require_synapse_schema(cur: Any, engine: str, url: str, origin: str | None = None) -> None:
    """CheckError unless the database has Synapse's core tables: an empty table of streams is not health."""
    missing = [t for t in SYNAPSE_MARKER_TABLES if not _table_exists(cur, engine, t)]
    if missing:
        tables = f"no {', '.join(missing)} table{'s' if len(missing) > 1 else ''}"
        if origin:
            raise CheckError(f"{redact_url(url)} ({origin}) is not a Synapse database ({tables}): is that the "
                             "config Synapse runs with? Otherwise pass --db URL")
        raise CheckError(f"{redact_url(url)} is not a Synapse database ({tables}); point --db at the database "
                         "that the database section of Synapse's homeserver.yaml names")


def take_snapshot(conn: Any, url: str, origin: str | None = None) -> DatabaseSnapshot:
    """Read every stream's sequence, table tops and positions through ``conn`` (no writes)."""
    engine = engine_of(url)
    cur = conn.cursor()
    try:
        require_synapse_schema(cur, engine, url, origin)
        row = _one(cur, "SELECT version FROM schema_version")
        version = int(row[0]) if row else None
        streams = [_stream_state(cur, engine, s) for s in SYNAPSE_ID_STREAMS]
        known = {s.name for s in SYNAPSE_ID_STREAMS}
        cur.execute("SELECT stream_name, instance_name, stream_id FROM stream_positions")
        extra: dict[str, dict[str, int]] = {}
        for name, inst, sid in cur.fetchall():
            if name not in known:
                extra.setdefault(str(name), {})[str(inst)] = int(sid)
        return DatabaseSnapshot(url, engine, version, streams, extra)
    finally:
        cur.close()
        conn.rollback()
