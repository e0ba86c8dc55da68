"""Diagnose a Synapse database snapshot: each inconsistency in plain words, its likely cause, its repair.

A finding never changes anything; its ``repair`` holds the SQL statements an
operator (or ``factstream synapse check --fix``) runs to mend it. Repairs only
move a sequence forward or a position up, or delete a row Synapse itself would
delete: an id that some writer already used is never handed out again.

Kinds (see docs/synapse.md for what to do about each):

* ``positions_ahead_of_sequence`` (error): a writer recorded a position the
  sequence never handed out. Synapse refuses to start. +32 exactly is the
  signature of a PostgreSQL failover (element-hq/synapse#18544).
* ``sequence_behind_table`` (error): rows exist with ids above the sequence;
  the next ids it hands out collide with them (#17274, and #19671 after a
  port from SQLite).
* ``stale_writer`` (warning): a position for an instance that is not
  configured to write the stream.
* ``rows_without_positions`` (warning): committed rows above every recorded
  position: written behind Synapse's back, or by a writer that died before
  recording its position.
* ``missing_sequence`` / ``missing_table`` (error): the schema is incomplete.
* ``writers_seen`` and ``not_in_schema`` (info): context, not problems.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .snapshot import DatabaseSnapshot, StreamState

__all__ = ["Finding", "diagnose", "FAILOVER_BATCH", "ERROR", "WARNING", "INFO"]

ERROR, WARNING, INFO = "error", "warning", "info"

#: PostgreSQL writes sequence values to the WAL 32 at a time (SEQ_LOG_VALS), so a
#: standby's copy of a sequence can be up to 32 values away from the primary's.
FAILOVER_BATCH = 32

#: A sequence at or below this value has handed out at most its first ids.
_FRESH_SEQUENCE = 2


@dataclass(frozen=True)
class Finding:
    """One inconsistency (or, with severity info, one fact worth showing)."""

    kind: str
    severity: str
    stream: str
    summary: str
    cause: str = ""
    repair: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict."""
        out = asdict(self)
        out["repair"] = list(self.repair)
        out["details"] = dict(self.details)
        return out


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _setval(sequence: str, target: int) -> str:
    return f"SELECT setval({_lit(sequence)}, GREATEST((SELECT last_value FROM {sequence}), {target}));"


def _sequence_findings(st: StreamState) -> list[Finding]:
    seq = st.sequence
    if seq is None or not seq.exists or seq.last_issued is None:
        return []
    name = st.stream.name
    issued = seq.last_issued
    table_top = st.table_top
    pos_top = st.position_top
    target = max(table_top, pos_top or 0)
    repair = (_setval(seq.name, target),)
    fresh = issued <= _FRESH_SEQUENCE
    # ALTER SEQUENCE ... RESTART WITH n (what synapse_port_db runs) leaves is_called false until the next nextval.
    restarted = seq.is_called is False
    found: list[Finding] = []
    if pos_top is not None and pos_top > issued:
        ahead = pos_top - issued
        over = sorted(w for w, v in st.positions.items() if st.magnitude(v) > issued)
        if ahead == FAILOVER_BATCH:
            cause = (f"exactly {FAILOVER_BATCH} ahead: the signature of a PostgreSQL failover or switchover "
                     f"(PostgreSQL logs sequence values {FAILOVER_BATCH} at a time, so the sequence came back "
                     "behind what writers had recorded; element-hq/synapse#18544)")
        elif fresh:
            cause = ("the sequence is still at its first values although writers recorded positions: a port from "
                     "SQLite that did not set this sequence (element-hq/synapse#19671)")
        elif ahead == 1 and restarted:
            cause = ("off by one, and the sequence was restarted and never used since: a port from SQLite that set "
                     "it one short (element-hq/synapse#19671)")
        else:
            cause = ("the sequence went back (restored from an older backup than stream_positions, or reset by "
                     "hand), or two id generators share this stream name")
        if st.stream.positive:
            effect = ("Synapse refuses to start "
                      "(\"Postgres sequence ... is inconsistent with associated stream position\")")
        else:  # Synapse's startup check compares the stored (negative) ids with the sequence: it never fires here
            effect = ("Synapse starts regardless (its startup check does not cover this count-down stream), so "
                      "nothing stops its writers handing out ids short of the recorded position")
        found.append(Finding(
            "positions_ahead_of_sequence", ERROR, name,
            f"stream_positions records {', '.join(f'{w}={st.positions[w]}' for w in over)} but sequence "
            f"{seq.name} has only handed out up to {issued} ({ahead} ahead); {effect}",
            cause, repair,
            {"sequence_last_issued": issued, "position_top": pos_top, "ahead": ahead, "writers": over}))
    if table_top > issued:
        behind = table_top - issued
        if fresh:
            cause = ("the sequence is still at its first values although the tables hold rows: a port from SQLite "
                     "that did not set this sequence (element-hq/synapse#19671)")
        elif behind == 1 and restarted:
            cause = ("off by one, and the sequence was restarted and never used since: a port from SQLite that set "
                     "it one short (element-hq/synapse#19671)")
        else:
            cause = ("rows were written without taking ids from the sequence, or the sequence was restored or reset "
                     "behind its table (element-hq/synapse#17274); Synapse moves the sequence up when a process "
                     "of this stream starts, but a running writer hands out ids that already exist")
        found.append(Finding(
            "sequence_behind_table", ERROR, name,
            f"sequence {seq.name} has handed out up to {issued} but its tables hold ids up to {table_top} "
            f"({behind} behind): the next ids it hands out already exist",
            cause, repair,
            {"sequence_last_issued": issued, "table_top": table_top, "behind": behind,
             "tables": {t.table: t.top for t in st.tables if t.exists and t.top > issued}}))
    return found


def _position_sql(st: StreamState, instance: str, magnitude: int, engine: str) -> str:
    stored = magnitude if st.stream.positive else -magnitude
    if engine == "postgresql":
        keep = "GREATEST" if st.stream.positive else "LEAST"
    else:
        keep = "MAX" if st.stream.positive else "MIN"
    return ("INSERT INTO stream_positions (stream_name, instance_name, stream_id) "
            f"VALUES ({_lit(st.stream.name)}, {_lit(instance)}, {stored}) "
            f"ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = {keep}(stream_positions.stream_id, EXCLUDED.stream_id);")


def _writer_findings(st: StreamState, writers: Collection[str] | None, instances: Collection[str] | None,
                     engine: str) -> list[Finding]:
    name = st.stream.name
    found: list[Finding] = []
    configured = writers if writers is not None else instances
    if configured is not None and st.stream.records_positions:
        for inst in sorted(st.positions):
            if inst in configured:
                continue
            what = "configured to write this stream" if writers is not None else "among the instances given"
            found.append(Finding(
                "stale_writer", WARNING, name,
                f"stream_positions has a row for {inst!r} (position {st.positions[inst]}), which is not {what}",
                "the instance was removed from stream_writers or renamed; Synapse drops such rows when a process of "
                "this stream starts, but tools and old workers still read it as a writer that stopped",
                (f"DELETE FROM stream_positions WHERE stream_name = {_lit(name)} AND instance_name = {_lit(inst)};",),
                {"instance": inst, "position": st.positions[inst]}))
    if st.positions and not st.stream.records_positions:
        found.append(Finding(
            "writers_seen", INFO, name,
            f"positions recorded for a stream Synapse keeps none for: {', '.join(sorted(st.positions))} "
            "(left by an older Synapse; harmless)"))
    elif st.positions and configured is None:
        found.append(Finding(
            "writers_seen", INFO, name,
            f"writers seen: {', '.join(f'{w}={v}' for w, v in sorted(st.positions.items()))} "
            "(give --config or --instances to check them against the configured writers)",
            details={"positions": dict(st.positions)}))
    if st.stream.records_positions and st.rows_above:
        for ra in st.rows_above:
            who = ra.instance if ra.instance is not None else "(no instance name)"
            is_writer = ra.instance is not None and (configured is None or ra.instance in configured)
            repair = (_position_sql(st, ra.instance, ra.highest, engine),) if is_writer and ra.instance is not None else ()
            cause = ("rows committed without the writer recording its position: inserted behind Synapse's back (a "
                     "script, a partial restore), or a writer that died between committing and recording")
            if not is_writer:
                cause += f"; {who} is not a writer of this stream, so no position can cover them: resync readers"
            found.append(Finding(
                "rows_without_positions", WARNING, name,
                f"{ra.count} row(s) by {who} with ids {ra.lowest}..{ra.highest} lie above every recorded position "
                f"(highest {st.position_top}): no writer's position covers them",
                cause, repair,
                {"instance": ra.instance, "count": ra.count, "lowest": ra.lowest, "highest": ra.highest,
                 "position_top": st.position_top}))
    return found


def _schema_findings(st: StreamState, engine: str) -> list[Finding] | None:
    name = st.stream.name
    if not st.present:
        return [Finding("not_in_schema", INFO, name, "not in this database's schema (an older Synapse)")]
    found: list[Finding] = []
    if engine == "postgresql" and st.sequence is not None and not st.sequence.exists:
        found.append(Finding("missing_sequence", ERROR, name, f"sequence {st.sequence.name} does not exist",
                             "an interrupted or hand-edited schema migration; Synapse cannot allocate ids for this stream",
                             ()))
    for t in st.tables:
        if not t.exists:
            found.append(Finding("missing_table", ERROR, name, f"table {t.table} does not exist",
                                 "an interrupted or hand-edited schema migration"))
    return found


def diagnose(snapshot: DatabaseSnapshot, *, stream_writers: Mapping[str, Collection[str]] | None = None,
             instances: Collection[str] | None = None) -> list[Finding]:
    """Every finding of ``snapshot``: errors first, then warnings, then info.

    ``stream_writers`` maps a stream name to its configured writers (from a
    Synapse config); ``instances`` is a flat list of every configured
    instance. With neither, stale writers cannot be told apart and the
    writers seen are reported instead.
    """
    out: list[Finding] = []
    for st in snapshot.streams:
        schema = _schema_findings(st, snapshot.engine)
        if schema and schema[0].kind == "not_in_schema":
            out.extend(schema)
            continue
        out.extend(schema or [])
        out.extend(_sequence_findings(st))
        writers = stream_writers.get(st.stream.name) if stream_writers is not None else None
        out.extend(_writer_findings(st, writers, instances, snapshot.engine))
    for name, positions in sorted(snapshot.extra_positions.items()):
        out.append(Finding("unknown_stream", INFO, name,
                           f"stream_positions has rows for a stream Synapse 1.163 does not define: "
                           f"{', '.join(f'{w}={v}' for w, v in sorted(positions.items()))}"))
    rank = {ERROR: 0, WARNING: 1, INFO: 2}
    return sorted(out, key=lambda f: rank[f.severity])
