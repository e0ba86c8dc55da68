"""argparse types for the CLI's numeric options.

A value outside what an option can mean (a negative timeout, port 99999, a
rollback share of 2) is a usage error naming the option, at once: taken as
given it used to hang a command, spin a keepalive loop, bind another port
than the one asked for, or end in a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["duration", "fraction", "number", "port", "size_bytes", "whole_number"]


def _fail(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _integer(text: str, what: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise _fail(f"expected {what}, got {text!r}") from None


def whole_number(least: int = 0, hint: str = "") -> Callable[[str], int]:
    """An integer of at least ``least`` (``hint`` follows the complaint about a smaller one)."""

    def parse(text: str) -> int:
        value = _integer(text, "a whole number")
        if value < least:
            raise _fail(f"must be at least {least}, got {value}{hint}")
        return value

    return parse


def number(least: float = 0.0) -> Callable[[str], float]:
    """A finite number of at least ``least``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _fail(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise _fail(f"expected a finite number, got {text!r}")
        if value < least:
            raise _fail(f"must be at least {least:g}, got {text.strip()}")
        return value

    return parse


def duration(zero: str = "") -> Callable[[str], float]:
    """Seconds: ``90``, ``1.5``, ``90s``, ``15m``, ``1h``, ``1d``. More than 0, or 0 where ``zero`` says what it means."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def parse(text: str) -> float:
        t = text.strip().lower()
        try:
            value = float(t[:-1]) * units[t[-1]] if t[-1:] in units else float(t)
        except ValueError:
            raise _fail(f"expected a duration like 30, 30s, 15m or 1h, got {text!r}") from None
        if not math.isfinite(value):
            raise _fail(f"expected a finite duration, got {text!r}")
        if value < 0 or (value == 0 and not zero):
            raise _fail(f"must be more than 0{' (or 0: ' + zero + ')' if zero else ''}, got {text.strip()}")
        return value

    return parse


def fraction(text: str) -> float:
    """A share of the whole: 0 or more, less than 1 (all of them would leave nothing)."""
    value = number(0.0)(text)
    if value >= 1:
        raise _fail(f"must be a share below 1 (0.1 is one in ten), got {text.strip()}")
    return value


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    value = _integer(text, "a port number")
    if not 0 <= value <= 65535:
        raise _fail(f"a port is 0-65535 (0 picks a free one), got {value}")
    return value


def size_bytes(text: str) -> int:
    """Bytes: ``100``, ``64k``, ``16M``, ``1G`` (``KiB``/``MB`` spellings too); more than 0."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = units.get(t[-1:], 1)
    try:
        amount = float(t[:-1] if t[-1:] in units else t)
    except ValueError:
        raise _fail(f"expected a size like 64M or 500k, got {text!r}") from None
    if not math.isfinite(amount) or int(amount * mult) < 1:
        raise _fail(f"must be positive, got {text!r}")
    return int(amount * mult)
