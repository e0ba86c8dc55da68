"""How a check reads: a stream table and its findings for a terminal, or one JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..redaction import redact_url
from .doctor import ERROR, INFO, WARNING, Finding
from .snapshot import DatabaseSnapshot, StreamState
from .streams import SYNAPSE_VERSION

__all__ = ["is_healthy", "stream_json", "check_json", "render_text"]


def is_healthy(findings: Sequence[Finding]) -> bool:
    """True when nothing but info was found."""
    return all(f.severity == INFO for f in findings)


def stream_json(st: StreamState) -> dict[str, Any]:
    """One stream's figures as a JSON-ready dict (ids as stored; ``*_top`` as magnitudes)."""
    seq = st.sequence
    return {
        "stream": st.stream.name,
        "wire": st.stream.wire,
        "positive": st.stream.positive,
        "sequence": None if seq is None else {
            "name": seq.name, "exists": seq.exists, "last_value": seq.last_value,
            "is_called": seq.is_called, "last_issued": seq.last_issued},
        "tables": {t.table: (t.top if t.exists else None) for t in st.tables},
        "table_top": st.table_top,
        "positions": dict(sorted(st.positions.items())),
        "position_top": st.position_top,
    }


def check_json(snapshot: DatabaseSnapshot, findings: Sequence[Finding]) -> dict[str, Any]:
    """The whole check as one JSON-ready dict."""
    return {
        "database": redact_url(snapshot.url),
        "engine": snapshot.engine,
        "schema_version": snapshot.schema_version,
        "synapse_streams_of": SYNAPSE_VERSION,
        "healthy": is_healthy(findings),
        "errors": sum(f.severity == ERROR for f in findings),
        "warnings": sum(f.severity == WARNING for f in findings),
        "streams": [stream_json(st) for st in snapshot.streams if st.present],
        "findings": [f.as_json() for f in findings],
    }


def _positions_text(st: StreamState) -> str:
    if not st.positions:
        return "-" if st.stream.records_positions else "(not recorded)"
    return " ".join(f"{w}={v}" for w, v in sorted(st.positions.items()))


def render_text(snapshot: DatabaseSnapshot, findings: Sequence[Finding], *, show_table: bool = True) -> str:
    """The check for a human: what was read, then each finding with cause and repair."""
    lines: list[str] = []
    engine = "PostgreSQL" if snapshot.engine == "postgresql" else "SQLite"
    schema = f", schema {snapshot.schema_version}" if snapshot.schema_version is not None else ""
    lines.append(f"Synapse database {redact_url(snapshot.url)} ({engine}{schema}; streams as Synapse {SYNAPSE_VERSION} defines them)")
    if show_table:
        lines.append("")
        lines.append(f"{'stream':<31} {'sequence':<40} {'issued':>8} {'table top':>10}  positions")
        for st in snapshot.streams:
            if not st.present:
                continue
            seq = st.sequence
            seq_name = "-" if seq is None else (seq.name if seq.exists else f"{seq.name} (missing)")
            issued = "-" if seq is None or seq.last_issued is None else str(seq.last_issued)
            sign = "" if st.stream.positive else "-"
            top = f"{sign}{st.table_top}" if st.table_top else "0"
            lines.append(f"{st.stream.name:<31} {seq_name:<40} {issued:>8} {top:>10}  {_positions_text(st)}")
    problems = [f for f in findings if f.severity != INFO]
    notes = [f for f in findings if f.severity == INFO and f.kind != "not_in_schema"]
    lines.append("")
    for f in problems:
        lines.append(f"{f.severity.upper()} {f.stream}: {f.kind}")
        lines.append(f"  {f.summary}")
        if f.cause:
            lines.append(f"  likely cause: {f.cause}")
        if f.repair:
            lines.append("  repair:")
            lines.extend(f"    {sql}" for sql in f.repair)
        else:
            lines.append("  repair: no SQL (see docs/synapse.md)")
        lines.append("")
    for f in notes:
        lines.append(f"note {f.stream}: {f.summary}")
    if notes:
        lines.append("")
    if not problems:
        lines.append("healthy: no inconsistencies")
    else:
        errors = sum(f.severity == ERROR for f in problems)
        warnings = len(problems) - errors
        lines.append(f"{errors} error(s), {warnings} warning(s): stop Synapse (all processes) and run the repairs above, "
                     "or run this check again with --fix")
    return "\n".join(lines)
