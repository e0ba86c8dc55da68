"""The watchdog's look into the database: rows above the wire's tokens, positions, audited ids.

Each probe is one short read-only transaction; its queries only touch rows
above the lowest token the wire announced for a stream (an index range scan),
so probing every few seconds stays cheap next to a busy Synapse.

A probe can be given up on from another thread (``synapse watch
--db-timeout``: its query cancelled, or its connection cut): ``watch``, given
each connection a probe uses, is how that thread finds it. A probe that failed
closes its own connection, so the next one connects afresh and nothing else
ever touches a connection a probe may still be using.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .snapshot import connect, require_synapse_schema
from .streams import SYNAPSE_ID_STREAMS, SynapseIdStream
from .watchdog import AUDITED_STREAMS, DbView

__all__ = ["DbProbe", "AUDIT_WINDOW"]

#: The audit looks at most this many ids back from a writer's token.
AUDIT_WINDOW = 100_000


class DbProbe:
    """Reads, per wire stream and writer, what the database holds above the wire's tokens."""

    def __init__(self, url: str, origin: str | None = None, watch: Callable[[Any], None] | None = None) -> None:
        self.url = url
        self.origin = origin  # where the URL came from when not --db (for messages)
        #: Handed every connection before it is used (the deadline's store.deadline.watch, which cancels or cuts it).
        self.watch = watch
        self._conn: Any = None
        self._floor: dict[str, int] = {}
        self.streams: list[SynapseIdStream] = [s for s in SYNAPSE_ID_STREAMS if s.wire and s.positive]

    def open(self) -> None:
        """Connect (CheckError with a redacted reason if the database cannot be reached or is not Synapse's)."""
        if self._conn is None:
            conn = connect(self.url, origin=self.origin)
            if self.watch is not None:
                self.watch(conn)
            try:
                cur = conn.cursor()
                require_synapse_schema(cur, "postgresql", self.url, self.origin)
                cur.close()
                conn.rollback()
            except BaseException:
                conn.close()
                raise
            self._conn = conn

    def close(self) -> None:
        """Disconnect."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def probe(self, tokens: Mapping[tuple[str, str], int],
              audit: Mapping[tuple[str, str], tuple[int, int]]) -> dict[tuple[str, str], DbView]:
        """(wire stream, writer) -> what the database holds, for every writer known on the wire or in the rows."""
        if self._conn is None:
            self.open()  # handed to ``watch`` there
        elif self.watch is not None:
            self.watch(self._conn)
        conn = self._conn
        try:
            return self._read(conn, tokens, audit)
        except BaseException:
            # Cancelled or cut at a deadline, or lost: not to be reused. Closed here, in the thread that used it.
            self._conn = None
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a connection cut or lost is closed as far as it can be
                pass
            raise

    def _read(self, conn: Any, tokens: Mapping[tuple[str, str], int],
              audit: Mapping[tuple[str, str], tuple[int, int]]) -> dict[tuple[str, str], DbView]:
        """:meth:`probe`'s queries, in one read-only transaction on ``conn``."""
        views: dict[tuple[str, str], DbView] = {}
        cur = conn.cursor()
        try:
            for s in self.streams:
                wire = s.wire
                assert wire is not None
                known = {w: t for (st, w), t in tokens.items() if st == wire}
                if wire not in self._floor:
                    self._floor[wire] = self._top(cur, s)
                bound = min(known.values(), default=self._floor[wire])
                tops: dict[str, int] = {}
                for t in s.tables:
                    cur.execute(f"SELECT {t.instance_column}, MAX({t.id_column}) FROM {t.table} "
                                f"WHERE {t.id_column} > %s GROUP BY {t.instance_column}", (bound,))
                    for inst, top in cur.fetchall():
                        if inst is not None:
                            tops[str(inst)] = max(tops.get(str(inst), 0), int(top))
                cur.execute("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = %s", (s.name,))
                positions = {str(i): int(v) for i, v in cur.fetchall()}
                # Read after the positions and after ``tokens`` were taken: a sequence only moves forward (outside
                # any transaction), so every token and position it issued is at or below what this reads.
                issued = self._issued(cur, s.sequence)
                for writer in set(known) | set(tops):
                    ids: tuple[int, ...] = ()
                    rng = audit.get((wire, writer))
                    if wire in AUDITED_STREAMS and rng is not None:
                        ids = self._ids(cur, s, writer, max(rng[0], rng[1] - AUDIT_WINDOW), rng[1])
                    top = tops.get(writer)
                    views[(wire, writer)] = DbView(top if top is not None and top > known.get(writer, bound) else None,
                                                   positions.get(writer), ids, sequence=s.sequence,
                                                   sequence_issued=issued, wire_token=known.get(writer))
        finally:
            cur.close()
            conn.rollback()  # the next probe sees a fresh snapshot
        return views

    @staticmethod
    def _issued(cur: Any, sequence: str) -> int | None:
        """The highest id ``sequence`` has handed out (None if this schema lacks it)."""
        cur.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (sequence,))
        row = cur.fetchone()
        if not row or row[0] != "S":
            return None
        cur.execute(f'SELECT last_value, is_called FROM "{sequence}"')
        last_value, is_called = cur.fetchone()
        return int(last_value) if is_called else int(last_value) - 1

    @staticmethod
    def _top(cur: Any, s: SynapseIdStream) -> int:
        top = 0
        for t in s.tables:
            cur.execute(f"SELECT MAX({t.id_column}) FROM {t.table}")
            (v,) = cur.fetchone()
            top = max(top, int(v or 0))
        return top

    @staticmethod
    def _ids(cur: Any, s: SynapseIdStream, writer: str, low: int, high: int) -> tuple[int, ...]:
        found: set[int] = set()
        for t in s.tables:
            cur.execute(f"SELECT {t.id_column} FROM {t.table} WHERE {t.instance_column} = %s "
                        f"AND {t.id_column} > %s AND {t.id_column} <= %s", (writer, low, high))
            found.update(int(v) for (v,) in cur.fetchall())
        return tuple(sorted(found))
