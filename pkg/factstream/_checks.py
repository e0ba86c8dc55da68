"""Checks of constructor options, shared by every public class that takes them.

An option that cannot work (a page of 0 rows, a timeout of 0, a backoff of
-1 s) is refused when the object is made, with a ValueError or TypeError
naming the option, the values it takes and the value given, instead of a
spin, a hang or a retry loop much later. NaN and infinities fail every
range check here (``not 0 < nan``).
"""

from __future__ import annotations

import math
from numbers import Real

__all__ = ["whole", "seconds", "port", "backoff", "text"]


def whole(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bool, float and str are refused, not rounded."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"{minimum}-{maximum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def seconds(name: str, value: object, *, zero: bool = False) -> float:
    """A finite duration in seconds, > 0 (or >= 0 with ``zero=True``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ValueError(f"{name} must be {'>= 0' if zero else '> 0'} seconds, got {value}")
    return v


def port(name: str, value: object) -> int:
    """A TCP port, 0-65535 (0: any free one, where the caller listens)."""
    return whole(name, value, 0, 65535)


def backoff(initial: object, maximum: object, prefix: str = "backoff") -> tuple[float, float]:
    """A reconnect backoff's first and longest wait: 0 < initial <= maximum (a 0 wait retries in a busy loop)."""
    first = seconds(f"{prefix}_initial", initial)
    longest = seconds(f"{prefix}_max", maximum)
    if first > longest:
        raise ValueError(f"{prefix}_initial ({initial}) must not be above {prefix}_max ({maximum})")
    return first, longest


def text(name: str, value: object, *, empty: bool = False) -> str:
    """A str option (an instance or stream name...): not None, not bytes, not empty unless allowed."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not value and not empty:
        raise ValueError(f"{name} must not be empty")
    return value
