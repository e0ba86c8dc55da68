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
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def x(unix: float) -> float:
        return float(mdates.date2num(dt.datetime.fromtimestamp(unix, dt.timezone.utc)))  # type: ignore[no-untyped-call]

    bucket = int(report["bucket_seconds"])
    first = min(min(v) for v in lines.values())
    last = max(max(v) for v in lines.values())
    buckets = list(range(first, last + 1, bucket))
    covered = report.get("last_bucket_seconds")
    partial = covered is not None and covered < bucket and (last_ts := report.get("last_ts")) is not None and (
        int(_when(last_ts).timestamp()) // bucket * bucket == last
    )
    xs = [x(b) for b in buckets]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    try:
        # The partial last bucket: its rate over the part covered, at least a second, as the report's peak
        # takes it (over 0.1 s, one row drew as 10 rows/s where the report said 1).
        scale = bucket / min(float(bucket), max(1.0, float(covered))) if partial and covered is not None else 1.0

        def rate_at(label: str, b: int) -> float:
            value = lines.get(label, {}).get(b, 0.0)
            return value * scale if partial and b == last else value

        end = x(last + bucket)
        for label in sorted(lines):
            ys = [rate_at(label, b) for b in buckets]
            full = len(ys) - 1 if partial and len(ys) > 1 else len(ys)
            # Each bucket is a step over its whole width: an outage starts and ends where it did.
            edge = xs[full] if full < len(xs) else end
            (drawn,) = ax.plot(
                xs[:full] + [edge], ys[:full] + ys[full - 1:full], label=label, linewidth=1.2,
                drawstyle="steps-post", marker=None,
            )
            if full < 50:
                ax.plot(xs[:full], ys[:full], linestyle="", marker=".", color=drawn.get_color())
            if full < len(ys):
                ax.plot(
                    [xs[-2], xs[-1], end], [ys[-2], ys[-1], ys[-1]], drawstyle="steps-post",
                    linestyle=":", color=drawn.get_color(), linewidth=1.2,
                )
        marks = report.get("marks", {})
        for kind, marker, color in (("gap", "x", "red"), ("backwards", "v", "purple")):
            points = [m for m in marks.get("sequence", []) if m["kind"] == kind and m["ts"]]
            if not points:
                continue
            seen = set()
            mx: list[float] = []
            my: list[float] = []
            for m in points:
                b = int(_when(m["ts"]).timestamp()) // bucket * bucket
                label = f"{m['stream']} / {m['writer']}" if by_writer else m["stream"]
                if (label, b) in seen:
                    continue  # one mark per line and bucket; the legend counts them all
                seen.add((label, b))
                mx.append(x(b + bucket / 2))
                my.append(rate_at(label, b))
            total = len(points)
            more = "+" if total >= 1000 else ""
            name = "gaps (tokens skipped)" if kind == "gap" else "tokens went backwards"
            ax.scatter(mx, my, s=36, zorder=5, label=f"{name}: {total}{more}", marker=marker, color=color)
        holes = marks.get("holes", [])
        for i, hole in enumerate(holes):
            ax.axvspan(
                x(_when(hole["from"]).timestamp()), x(_when(hole["to"]).timestamp()) if hole["to"] else end,
                color="grey", alpha=0.25, label="recorder disconnected" if i == 0 else None,
            )
        if log_scale:
            # zeros stay visible, unlike a plain log scale; below one row per bucket it is linear
            ax.set_yscale("symlog", linthresh=1.0 / bucket)
        else:
            top = max(max(rate_at(label, b) for b in buckets) for label in lines)
            ax.set_ylim(bottom=0, top=top * 1.15 or 1.0)  # headroom for the marks
        ax.set_title(title)
        what = f"time (UTC, {bucket} s buckets"
        what += "; dotted: last bucket, partly covered)" if partial else ")"
        ax.set_xlabel(what)
        ax.set_ylabel("RDATA rows per second" + (" (symlog)" if log_scale else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0.0)  # off the data
        ax.xaxis_date(tz=dt.timezone.utc)
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return len(lines)
