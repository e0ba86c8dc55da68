"""Apply the repairs of a check, all in one transaction, and only with Synapse stopped.

A repair that runs under a live writer races it (a writer that allocated an id
from the old sequence, or records a position right after we move it), so
:func:`connected_sessions` lists every other session on the database and the
caller refuses to repair while there is one, unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .doctor import Finding

__all__ = ["Session", "connected_sessions", "apply_repairs", "repair_statements"]


@dataclass(frozen=True, slots=True)
class Session:
    """Another connection to the same database (pg_stat_activity)."""

    pid: int
    user: str
    application: str
    client: str
    state: str

    def describe(self) -> str:
        """One line naming the session."""
        app = f" application {self.application!r}" if self.application else ""
        return f"pid {self.pid} user {self.user}{app} from {self.client or 'local socket'} ({self.state or 'idle'})"


def connected_sessions(conn: Any, engine: str) -> list[Session]:
    """Client sessions on this database other than ``conn`` itself (always empty for SQLite)."""
    if engine != "postgresql":
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pid, usename, application_name, COALESCE(host(client_addr), ''), COALESCE(state, '') "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' ORDER BY pid"
        )
        rows = cur.fetchall()
    conn.rollback()
    return [Session(int(p), str(u or ""), str(a or ""), str(c), str(s)) for p, u, a, c, s in rows]


def repair_statements(findings: Iterable[Finding]) -> list[tuple[Finding, str]]:
    """Each distinct repair statement, with the first finding that asked for it, in order."""
    seen: set[str] = set()
    out: list[tuple[Finding, str]] = []
    for f in findings:
        for sql in f.repair:
            if sql not in seen:
                seen.add(sql)
                out.append((f, sql))
    return out


def apply_repairs(conn: Any, statements: list[tuple[Finding, str]]) -> list[dict[str, Any]]:
    """Run ``statements`` in one transaction (all or nothing); what each changed, for the report."""
    done: list[dict[str, Any]] = []
    cur = conn.cursor()  # sqlite3 cursors are no context managers
    try:
        for finding, sql in statements:
            cur.execute(sql)
            changed = cur.fetchone()[0] if cur.description else cur.rowcount
            done.append({"stream": finding.stream, "kind": finding.kind, "sql": sql, "result": changed})
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        cur.close()
    return done
