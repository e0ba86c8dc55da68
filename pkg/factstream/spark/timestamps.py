"""Archive timestamps -> Arrow ``ts``/``date`` columns, computed on the executors.

The executors hand Spark finished columns, so Spark adds no projection over
the parsed rows (a projection copies every row once more; see BENCHMARKS.md).
That means computing here what Spark's own casts would compute, exactly:

- ISO-8601 text (the archive prefix: ``YYYY-MM-DD[T ]hh:mm:ss[.,fraction][Z|+hh:mm|+hhmm]``)
  is what ``try_cast(text AS TIMESTAMP)`` gives: the fraction truncated to
  microseconds, no zone meaning the session time zone (a local time in a
  daylight-saving gap moves forward by the gap, in an overlap takes the
  earlier offset, as java.time does), an impossible date or offset null;
- redis MONITOR's unix seconds are ``timestamp_seconds(try_cast(text AS DECIMAL(20,6)))``:
  rounded half-up to microseconds, null past 14 integer digits;
- ``date`` is the session-time-zone date of ``ts`` (``to_date``).

One deliberate difference: an instant outside 0001-01-02 .. 9999-12-30 (UTC)
gives null. (Spark's ANSI mode fails the whole job on some of them, such as a
MONITOR time of 10^14 seconds; an archive line should never do that.)

tests/test_spark.py checks these against Spark's casts for several session
time zones.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import lru_cache

import pyarrow as pa

from .._compat import load

__all__ = ["TS_TYPE", "timestamp_columns", "timestamp_micros"]

#: Arrow type of ``ts`` (Spark reads it as TimestampType whatever the zone label).
TS_TYPE = pa.timestamp("us", tz="UTC")

_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|([+-])(\d{2}):?(\d{2}))?"
)
_UNIX = re.compile(r"\d+(?:\.\d+)?")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICRO = Decimal("0.000001")
_OFFSET_ZONE = re.compile(r"([+-])(\d{1,2})(?::?(\d{2}))?")


@lru_cache(maxsize=32)
def _zone(name: str) -> dt.tzinfo:
    """A Spark session time zone id as a tzinfo: a region id, UTC/Z, or a fixed offset."""
    if name in ("UTC", "Z", "GMT", "UT"):
        return dt.timezone.utc
    m = _OFFSET_ZONE.fullmatch(name.removeprefix("GMT").removeprefix("UTC"))
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return dt.timezone(sign * dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0)))
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def _micros(when: dt.datetime) -> int:
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_LOWEST = _micros(dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc))
_HIGHEST = _micros(dt.datetime(9999, 12, 30, tzinfo=dt.timezone.utc))


def _in_range(micros: int) -> int | None:
    return micros if _LOWEST <= micros < _HIGHEST else None


def timestamp_micros(text: str | None, zone: dt.tzinfo) -> int | None:
    """Microseconds since the epoch for one archive timestamp text, or None where Spark gives null."""
    if text is None:
        return None
    if _UNIX.fullmatch(text):
        try:
            seconds = Decimal(text).quantize(_MICRO, rounding=ROUND_HALF_UP)
        except InvalidOperation:
            return None
        if seconds.adjusted() >= 14:  # DECIMAL(20,6) holds 14 integer digits
            return None
        return _in_range(int(seconds * 1_000_000))
    m = _ISO.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    frac = m.group(7) or ""
    try:
        local = dt.datetime(year, month, day, hour, minute, second, int(frac[:6].ljust(6, "0")))
    except ValueError:
        return None
    if m.group(8) is None:
        # fold=0: in an overlap the earlier offset, in a gap the offset before
        # it (the same instant as java.time's "move forward by the gap")
        return _in_range(_micros(local.replace(tzinfo=zone)))
    if m.group(8) == "Z":
        return _in_range(_micros(local.replace(tzinfo=dt.timezone.utc)))
    hours, minutes = int(m.group(10)), int(m.group(11))
    if minutes > 59 or hours * 60 + minutes > 18 * 60:  # java.time.ZoneOffset's limits
        return None
    offset = dt.timedelta(hours=hours, minutes=minutes)
    return _in_range(_micros(local.replace(tzinfo=dt.timezone(-offset if m.group(9) == "-" else offset))))


def _date(micros: int, zone: dt.tzinfo) -> int:
    """Days since the epoch of the session-zone date of an instant (Spark's to_date)."""
    local = (_EPOCH + dt.timedelta(microseconds=micros)).astimezone(zone)
    return (local.date() - _EPOCH.date()).days


def timestamp_columns(ts_text: pa.Array, session_time_zone: str, impl: str | None = None) -> tuple[pa.Array, pa.Array]:
    """``ts`` and ``date`` arrays for a batch's timestamp texts (all-null texts cost nothing).

    In a fixed-offset session time zone (UTC, the default, or +hh:mm) the
    archive builder twin computes them (the compiled one in C, exactly as
    :func:`timestamp_micros` does, asking it only about non-ASCII text);
    region zones go row by row through :func:`timestamp_micros`.
    """
    n = len(ts_text)
    if ts_text.null_count == n:
        return pa.nulls(n, TS_TYPE), pa.nulls(n, pa.date32())
    zone = _zone(session_time_zone)
    if isinstance(zone, dt.timezone):
        offset = zone.utcoffset(None)
        micros, days = load("spark._archive", impl).timestamp_columns(
            ts_text, offset.days * 86_400 + offset.seconds, lambda text: timestamp_micros(text, zone)
        )
        return micros.cast(TS_TYPE), days.cast(pa.date32())
    micros_list = [timestamp_micros(t, zone) for t in ts_text.to_pylist()]
    day_list = [None if m is None else _date(m, zone) for m in micros_list]
    return pa.array(micros_list, pa.int64()).cast(TS_TYPE), pa.array(day_list, pa.date32())
