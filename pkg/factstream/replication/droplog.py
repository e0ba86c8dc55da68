"""Counting and rate-limited logging of things a reader drops.

Nothing is ever dropped silently: every dropped row (or unparsable message)
goes through :meth:`DropLog.dropped`, which adds it to the
``factstream_dropped_rows{stream, why}`` counter and logs a WARNING, at most
one line per ``interval`` seconds. What the limit holds back is not lost
either: a timer on the running event loop prints ``N more suppressed`` once
the interval is over, even when nothing else is dropped afterwards (a burst
followed by silence still shows its full count).

The follower and the Redis carrier share this one logger, so a burst of bad
messages and a burst of stale rows read the same way in the logs.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .. import metrics

__all__ = ["DropLog", "DROP_REASONS"]

#: The reasons used by factstream itself (``why`` label of ``factstream_dropped_rows``).
DROP_REASONS: dict[str, str] = {
    "duplicate": "a fact that arrived live while a catch-up delivered it (the expected overlap; logged at INFO)",
    "stale": "a fact at or below the reader's position (already delivered, a replay, or a writer that went backwards)",
    "unknown_position": "rows of a writer the reader has no position for, following live only (start_position=None)",
    "broken_batch": "batch rows whose closing row never came (the connection carrying them closed)",
    "unbacked": "an RDATA beyond what the reader's database holds (forged, or a database behind the writer)",
    "bad_message": "a message that is not a valid replication command (Redis)",
}


class DropLog:
    """Count drops in Prometheus and log them at most once per ``interval`` seconds.

    ``dropped(why, n, stream, msg, *args)`` counts ``n`` under ``(stream,
    why)`` and logs ``msg % args`` at WARNING (``level`` overrides) unless a
    line went out less than ``interval`` seconds ago; held-back lines are
    counted and summarised (``N more suppressed``, at the highest level held
    back) by a timer when the interval ends, or by the next line, whichever
    is first. Without a
    running event loop the summary waits for the next line or :meth:`flush`.
    """

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self.logger = logger
        self.interval = interval
        #: Total rows counted per (stream, why) since creation (for tests and status).
        self.counts: dict[tuple[str, str], int] = {}
        self._counter = metrics.LabelledCounter(metrics.DROPPED_ROWS)
        self._next = 0.0
        self._held = 0
        self._held_rows = 0
        self._held_level = logging.NOTSET
        self._timer: asyncio.TimerHandle | None = None

    def dropped(self, why: str, n: int, stream: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
        """Count ``n`` dropped rows of ``stream`` for reason ``why`` and log ``msg % args`` (rate-limited)."""
        key = (stream, why)
        self._counter.inc(key, n)
        self.counts[key] = self.counts.get(key, 0) + n
        self.log(msg, *args, rows=n, level=level)

    def log(self, msg: str, *args: object, rows: int = 0, level: int = logging.WARNING) -> None:
        """Log ``msg % args`` unless rate-limited (then it is counted in the next summary)."""
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            self._held_rows += rows
            self._held_level = max(self._held_level, level)
            self._arm(self._next - now)
            return
        self._emit_summary()
        self._next = now + self.interval
        self.logger.log(level, msg, *args)

    def flush(self) -> None:
        """Print the pending ``N more suppressed`` summary now (if any)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._emit_summary()

    def _emit_summary(self) -> None:
        if not self._held:
            return
        held, rows, level = self._held, self._held_rows, self._held_level
        self._held = self._held_rows = 0
        self._held_level = logging.NOTSET
        if rows:
            self.logger.log(
                level, "%d more suppressed in the last %gs (%d rows); counted in factstream_dropped_rows",
                held, self.interval, rows,
            )
        else:
            self.logger.log(level, "%d more suppressed in the last %gs", held, self.interval)

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(max(delay, 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._held:
            self._emit_summary()
            # The summary is a line too: the next one waits a full interval.
            self._next = time.monotonic() + self.interval
