"""A PNG of replication throughput over time (matplotlib, no display needed).

Drawn so that trouble shows: every bucket from the first to the last is a
point (an outage is a drop to zero, not a sloping line), gaps and backwards
tokens are marked where they happened, a recorder's disconnect holes are
shaded, and the last bucket, when the archive covers only part of it, is
drawn at the rate over the part covered (dotted), not as a dip.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

__all__ = ["NoTimestamps", "render_chart"]


class NoTimestamps(ValueError):
    """The report has no timestamped RDATA lines: there is nothing to draw over time."""


def _when(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _series(report: dict[str, Any], by_writer: bool) -> dict[str, dict[int, float]]:
    """Rows/s per line of the chart (stream, or stream/writer), keyed by bucket start (unix seconds)."""
    lines: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for s in report["streams"]:
        label = f"{s['stream']} / {s['writer']}" if by_writer else s["stream"]
        for when, rate in s["rows_per_second"]["series"]:
            lines[label][int(_when(when).timestamp())] += rate
    return lines


def render_chart(
    report: dict[str, Any],
    path: str,
    *,
    title: str = "Replication rows per second",
    by_writer: bool = False,
    log_scale: bool = False,
) -> int:
    """Draw rows/s per stream (summed over writers, or per writer) from a report; returns the lines drawn.

    Raises NoTimestamps (and writes nothing) when no RDATA line has a timestamp.
    """
    lines = _series(report, by_writer)
    if not lines:
        raise NoTimestamps("no RDATA line has a timestamp, so there is no rate over time to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bucket = int(report["bucket_seconds"])
    first = min(min(v) for v in lines.values())
    last = max(max(v) for v in lines.values())
    buckets = list(range(first, last + 1, bucket))
    covered = report.get("last_bucket_seconds")
    partial = covered is not None and covered < bucket and (last_ts := report.get("last_ts")) is not None and (
        int(_when(last_ts).timestamp()) // bucket * bucket == last
    )
    xs = [dt.datetime.fromtimestamp(b, dt.timezone.utc) for b in buckets]
    fig, ax = plt.subplots(figsize=(11, 5), dpi=100)
    try:
        ys_by_label: dict[str, list[float]] = {}
        for label in sorted(lines):
            ys = [lines[label].get(b, 0.0) for b in buckets]
            ys_by_label[label] = ys
            full = len(ys) - 1 if partial and len(ys) > 1 else len(ys)
            # Each point is the rate over its whole bucket: steps show where an outage starts and ends.
            (drawn,) = ax.plot(
                xs[:full], ys[:full], label=label, linewidth=1.2, drawstyle="steps-post",  # type: ignore[arg-type]
                marker="." if full < 50 else None,
            )
            if partial and len(ys) > 1 and covered:
                rate = ys[-1] * bucket / covered  # rows seen in the part of the bucket the archive covers
                ax.plot(xs[-2:], [ys[-2], rate], linestyle=":", color=drawn.get_color(), linewidth=1.2)  # type: ignore[arg-type]
        marks = report.get("marks", {})
        for kind, style in (("gap", dict(marker="x", color="red")), ("backwards", dict(marker="v", color="purple"))):
            points = [m for m in marks.get("sequence", []) if m["kind"] == kind and m["ts"]]
            if not points:
                continue
            mx, my = [], []
            for m in points:
                b = int(_when(m["ts"]).timestamp()) // bucket * bucket
                label = f"{m['stream']} / {m['writer']}" if by_writer else m["stream"]
                mx.append(dt.datetime.fromtimestamp(b, dt.timezone.utc))
                my.append(lines.get(label, {}).get(b, 0.0))
            total = sum(1 for m in marks.get("sequence", []) if m["kind"] == kind)
            name = "gap (tokens skipped)" if kind == "gap" else "token went backwards"
            ax.scatter(mx, my, s=36, zorder=5, label=f"{name}: {total}", **style)  # type: ignore[arg-type]
        holes = marks.get("holes", [])
        end = dt.datetime.fromtimestamp(last + bucket, dt.timezone.utc)
        for i, hole in enumerate(holes):
            ax.axvspan(
                _when(hole["from"]), _when(hole["to"]) if hole["to"] else end,  # type: ignore[arg-type]
                color="grey", alpha=0.25, label="recorder disconnected" if i == 0 else None,
            )
        if log_scale:
            ax.set_yscale("symlog", linthresh=1.0)  # zeros stay visible, unlike a plain log scale
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(title)
        what = f"time (UTC, {bucket} s buckets"
        what += "; dotted: last bucket, partly covered)" if partial else ")"
        ax.set_xlabel(what)
        ax.set_ylabel("RDATA rows per second" + (" (symlog)" if log_scale else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="small", ncol=2)
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return len(lines)
