"""A PNG of replication throughput per stream over time (matplotlib, no display needed)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

__all__ = ["render_chart"]


def render_chart(report: dict[str, Any], path: str, *, title: str = "Replication rows per second") -> int:
    """Draw rows/s per stream (summed over writers) from a report; returns the number of streams drawn.

    Streams without timestamps have no series and are left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_stream: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in report["streams"]:
        for when, rate in s["rows_per_second"]["series"]:
            per_stream[s["stream"]][when] += rate
    fig, ax = plt.subplots(figsize=(11, 5), dpi=100)
    try:
        for stream in sorted(per_stream):
            points = sorted(per_stream[stream].items())
            xs = [dt.datetime.fromisoformat(w.replace("Z", "+00:00")) for w, _ in points]
            ax.plot(
                xs,  # type: ignore[arg-type]  # matplotlib's stubs omit datetime x values, which it plots natively
                [r for _, r in points], label=stream, linewidth=1.2, marker="." if len(xs) < 50 else None,
            )
        ax.set_title(title)
        ax.set_xlabel(f"time (UTC, {report['bucket_seconds']} s buckets)")
        ax.set_ylabel("RDATA rows per second")
        ax.grid(True, alpha=0.3)
        if per_stream:
            ax.legend(loc="upper left", fontsize="small", ncol=2)
        else:
            ax.text(0.5, 0.5, "no timestamped RDATA lines", ha="center", va="center", transform=ax.transAxes)
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return len(per_stream)
