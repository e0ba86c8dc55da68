"""``tail --format``: kcat-style output templates for rows, compiled once, filled from wire bytes.

Placeholders: ``%s`` stream, ``%w`` writer, ``%t`` token, ``%r`` the row as
JSON (as it travelled), ``%l`` the whole wire line (``RDATA ...``), ``%T``
the time the line arrived (ISO-8601 UTC), ``%{field}`` one field of the typed
row (Synapse's field names, e.g. ``%{user_id}``; only this one decodes the
row), ``%%`` a percent sign; ``\\n``, ``\\t`` and ``\\\\`` are escapes. A
template without a line break gets one appended.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from .. import _json

__all__ = ["RowFormat", "FormatError", "DEFAULT_FORMAT", "row_fields", "template"]

DEFAULT_FORMAT = "%s %w %t %r\\n"

_TOKEN = re.compile(r"%\{([A-Za-z_][A-Za-z0-9_]*)\}|(%\{[^}]*\}?)|%(.)|\\(.)|([^%\\]+)|([%\\])", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "r": "\r"}
_FIELDS = {"s": "stream", "w": "writer", "t": "token", "r": "row", "l": "line", "T": "time", "%": None}

Piece = Callable[[bytes, bytes, bytes, bytes, bytes, bytes], bytes]


class FormatError(ValueError):
    """A template with an unknown placeholder, field or escape, a malformed one, or nothing at all."""


def row_fields() -> list[str]:
    """Every field name a typed row of a known stream has: what ``%{field}`` may name."""
    from ..streams.registry import SYNAPSE_STREAMS

    return sorted({f.name for d in SYNAPSE_STREAMS for f in dataclasses.fields(d.row_type)})  # type: ignore[arg-type]


def _unknown_field(name: str) -> FormatError:
    import difflib

    known = row_fields()
    close = difflib.get_close_matches(name, known, 1)
    hint = f" (did you mean %{{{close[0]}}}?)" if close else ""
    return FormatError(f"unknown row field %{{{name}}}{hint}; the row fields are: {', '.join(known)}")


def template(text: str) -> str:
    """argparse type for --format: the template, checked now so that a mistake is a usage error, not blank output."""
    import argparse

    try:
        RowFormat(text)
    except FormatError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


class RowFormat:
    """A compiled template: :meth:`render` gives the output bytes for one row."""

    def __init__(self, template: str, *, json_output: bool = False, timestamps: bool = False) -> None:
        self.json_output = json_output
        self.template = template
        self.fields: list[str] = []  # typed row fields asked for (%{name})
        self.parts: list[tuple[str, bytes]] = []  # (kind, literal)
        if json_output:
            self.needs_time = timestamps
            self.default = False
            return
        self.default = False
        if timestamps:
            template = "%T " + template
        if not template:
            raise FormatError(f"the template is empty: give one such as '{DEFAULT_FORMAT}', or leave --format out")
        known = set(row_fields())
        for m in _TOKEN.finditer(template):
            field, bad, code, esc, lit, lone = m.groups()
            if bad is not None:
                raise FormatError(f"malformed placeholder '{bad}': a row field is written %{{name}} "
                                  "(letters, digits and _), e.g. %{user_id}")
            if lone is not None:
                what = "%% for a percent sign" if lone == "%" else "\\\\ for a backslash"
                raise FormatError(f"the template ends with a lone '{lone}': write {what}, or a placeholder "
                                  "(%s stream, %w writer, %t token, %r row, %l line, %T time, %{field})")
            if field is not None:
                if field not in known:
                    raise _unknown_field(field)
                self.fields.append(field)
                self.parts.append(("field:" + field, b""))
            elif code is not None:
                if code not in _FIELDS:
                    raise FormatError(f"unknown placeholder %{code} (known: %s stream, %w writer, "
                                      "%t token, %r row, %l line, %T time, %{field}, %%)")
                self.parts.append(("lit", b"%") if code == "%" else (_FIELDS[code] or "", b""))
            elif esc is not None:
                if esc not in _ESCAPES:
                    raise FormatError(f"unknown escape \\{esc} (known: \\n \\t \\r \\\\)")
                self.parts.append(("lit", _ESCAPES[esc].encode()))
            else:
                self.parts.append(("lit", lit.encode()))
        if not self.parts or not self.parts[-1][1].endswith(b"\n"):
            self.parts.append(("lit", b"\n"))
        self.needs_time = any(kind == "time" for kind, _ in self.parts)
        self.default = template == DEFAULT_FORMAT

    @property
    def typed(self) -> bool:
        """True when the template asks for fields of the typed row."""
        return bool(self.fields)

    def render(self, stream: bytes, writer: bytes, token: bytes, row: bytes, stamp: bytes = b"") -> bytes:
        """The output for one row (all inputs are wire bytes; ``stamp`` the arrival time)."""
        if self.json_output:
            head = b'{"time":"' + stamp + b'",' if self.needs_time else b"{"
            return (head + b'"stream":' + _name(stream) + b',"writer":' + _name(writer) + b',"token":' + token
                    + b',"row":' + row + b"}\n")
        out = []
        typed: Any = _UNSET
        for kind, lit in self.parts:
            if kind == "lit":
                out.append(lit)
            elif kind == "stream":
                out.append(stream)
            elif kind == "writer":
                out.append(writer)
            elif kind == "token":
                out.append(token)
            elif kind == "row":
                out.append(row)
            elif kind == "line":
                out.append(b"RDATA " + stream + b" " + writer + b" " + token + b" " + row)
            elif kind == "time":
                out.append(stamp)
            else:
                if typed is _UNSET:
                    typed = _typed_row(stream, row)
                value = getattr(typed, kind[6:], "")
                out.append(value.encode() if isinstance(value, str) else _json.dumps(value).encode())
        return b"".join(out)


_NAMES: dict[bytes, bytes] = {}


def _name(word: bytes) -> bytes:
    got = _NAMES.get(word)
    if got is None:
        got = _NAMES[word] = json.dumps(word.decode("utf-8", "replace")).encode()
    return got


_UNSET: Any = object()
_REGISTRY: list[Any] = []


def _typed_row(stream: bytes, row: bytes) -> Any:
    """The typed row (fields by Synapse's names); None when the stream or row is unknown/malformed."""
    if not _REGISTRY:
        from ..streams.registry import default_registry

        _REGISTRY.append(default_registry())
    try:
        return _REGISTRY[0].parse_row(stream.decode(), _json.loads(row.decode()))
    except Exception:  # noqa: BLE001 - an unknown stream or malformed row just has no fields
        return None
