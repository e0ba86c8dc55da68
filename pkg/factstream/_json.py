"""JSON exactly as Synapse writes and reads it on the replication wire.

Compact separators, ``ensure_ascii`` (lowercase ``\\uXXXX``, surrogate pairs
for astral characters), key order kept, NaN and Infinity refused both ways.
Both codec twins use :func:`dumps` as the reference encoder; the compiled twin
only takes a faster route to the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps", "loads", "MAX_DEPTH"]

#: Deepest JSON nesting either twin accepts (the stdlib's own limit depends on
#: the caller's stack; a fixed limit makes both twins agree).
MAX_DEPTH = 512


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _default(obj: Any) -> Any:
    # Synapse encodes its frozen dicts as plain objects; any read-only mapping
    # deserves the same treatment.
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), default=_default)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)

dumps = _ENCODER.encode
"""Encode ``obj`` as Synapse does (raises ``ValueError``/``TypeError``)."""


def nesting_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting in JSON ``text``, ignoring brackets in strings."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth -= 1
    return deepest


def loads(text: str) -> Any:
    """Decode ``text`` as Synapse does, refusing nesting deeper than MAX_DEPTH."""
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return _DECODER.decode(text)
