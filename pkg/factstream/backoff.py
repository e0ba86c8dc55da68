"""Waiting before retrying something that is down, and saying so once per outage.

:func:`backoff_delay` is the one backoff of the package (the Redis carrier's
reconnects, a writer whose database went away, the publisher's fetches).
:class:`Outage` turns a run of failures into two log lines, one when the
outage starts and one when it ends, instead of a line (or a traceback) per
attempt; the text of an error goes through :func:`~factstream.redaction.redact_text`
so a URL in a driver's message never shows its password.
"""

from __future__ import annotations

import logging
import random
import time

from .redaction import redact_text

__all__ = ["backoff_delay", "Outage"]


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (0-based).

    Exponential from ``initial`` capped at ``maximum``, with jitter over the
    upper half so that many instances restarted together do not reconnect in
    lockstep, yet never retry faster than half the nominal delay.
    """
    ceiling = min(maximum, initial * (2 ** min(attempt, 62)))
    return (rng or random).uniform(ceiling / 2, ceiling)


class Outage:
    """One dependency's failures: one log line when it goes away, one when it is back.

    ``delay = outage.failed(err)`` records a failed attempt (logging only the
    first of an outage) and returns how long to wait before the next one;
    ``outage.recovered()`` ends the outage (logging how long it lasted, if one
    was going on). ``count`` says how many outages there were.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        initial: float = 0.1,
        maximum: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.logger = logger
        self.what = what
        self.initial = initial
        self.maximum = maximum
        self._rng = rng or random.Random()
        #: failed attempts in the current outage (0: no outage going on)
        self.attempts = 0
        #: outages so far
        self.count = 0
        self._since = 0.0

    @property
    def ongoing(self) -> bool:
        """True between the first failure and the recovery."""
        return self.attempts > 0

    def failed(self, err: BaseException) -> float:
        """Record a failed attempt; returns the seconds to wait before the next one."""
        if self.attempts == 0:
            self.count += 1
            self._since = time.monotonic()
            self.logger.error(
                "%s unavailable (%s: %s); retrying with backoff up to %gs, serving what does not need it meanwhile",
                self.what, type(err).__name__, redact_text(str(err)).strip().replace("\n", " "), self.maximum,
            )
        delay = backoff_delay(self.attempts, self.initial, self.maximum, self._rng)
        self.attempts += 1
        return delay

    def recovered(self) -> None:
        """The dependency works again: log the end of the outage, if there was one."""
        if self.attempts:
            self.logger.warning(
                "%s is back after %.1fs and %d failed attempts", self.what, time.monotonic() - self._since,
                self.attempts,
            )
            self.attempts = 0
