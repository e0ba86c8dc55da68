"""Selector: the active implementation of the wire codec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._compat import load

if TYPE_CHECKING:
    from ._wire_py import (
        DEFAULT_MAX_LINE_LENGTH,
        ColumnParams,
        LineDecoder,
        column_text,
        encode,
        encode_lines,
        encode_redis_publish,
        parse_line,
    )
else:
    _impl = load("_wire")
    parse_line = _impl.parse_line
    encode = _impl.encode
    encode_lines = _impl.encode_lines
    encode_redis_publish = _impl.encode_redis_publish
    LineDecoder = _impl.LineDecoder
    DEFAULT_MAX_LINE_LENGTH = _impl.DEFAULT_MAX_LINE_LENGTH
    column_text = _impl.column_text
    ColumnParams = _impl.ColumnParams

__all__ = [
    "parse_line", "encode", "encode_lines", "encode_redis_publish", "LineDecoder", "DEFAULT_MAX_LINE_LENGTH",
    "column_text", "ColumnParams",
]
