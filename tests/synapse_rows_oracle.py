"""Stream rows as Synapse itself types and sends them (test-only oracle).

Runs under a Python that has matrix-synapse installed (``.venv-synapse``), as
a JSON-lines bridge: one request per stdin line, one reply per stdout line.
Only Synapse's public stream and command API is called; nothing of Synapse is
copied here.

``{"schema": true}`` answers ``{"schema": {...}}``: every stream of
``STREAMS_MAP`` with its row type's fields in wire order (attrs field order),
each with a small type vocabulary the tests turn into value generators:
``str``, ``str?``, ``int``, ``bool``, ``list[str]``, ``list?`` (JSON list or
null), ``object`` (JSON object), ``set[str]?`` (a frozenset on the reader, a
list on the wire, or null), ``user_id`` (a user id string) or
``{"enum": [values]}``; anything else is reported as ``unknown: <type>`` so a
new field type fails loudly instead of going untested. The events stream has
no row type of its own: its kinds (``ev``, ``state``, ``state-all``) are
listed under ``event_kinds`` and its wrapper row under ``events_row``.

``{"rows": [{"stream", "kind", "instance", "token", "values"}, ...]}``
answers ``{"rows": [...]}``, one entry per request row, either
``{"ok": false, "error": ..}`` or ``{"ok": true, "line": .., "row": ..,
"parsed": .., "roundtrip": ..}``:

- the typed row is built with Synapse's own class from ``values`` (the events
  stream: the kind's class wrapped in ``EventsStreamRow``);
- the wire row is that typed row's fields in attrs order, which is the tuple
  Synapse's update functions hand to the replication streamer; the events
  stream sends ``(kind, fields)``. A frozenset field (profile_updates'
  ``affected_fields``) goes out as ``list(frozenset)``, as Synapse's update
  function does, so its order and duplicates are Synapse's, not the request's;
- ``line`` is ``"RDATA " + RdataCommand(stream, instance, token, row).to_line()``,
  the bytes Synapse writes (``token`` null is a ``batch`` row);
- ``row`` is the row Synapse reads back from that line, ``parsed`` the fields
  of ``Stream.parse_row`` on it (frozensets as ``{"frozenset": sorted list}``)
  and ``roundtrip`` whether that equals the typed row built first.
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from typing import Any

import attr
from synapse.replication.tcp.commands import RdataCommand, parse_command_from_line
from synapse.replication.tcp.streams import STREAMS_MAP
from synapse.replication.tcp.streams.events import EventsStream, EventsStreamRow, TypeToRow
from synapse.types import UserID

_SIMPLE = {str: "str", int: "int", bool: "bool", dict: "object", UserID: "user_id"}


def type_kind(tp: Any) -> Any:
    """Our small type vocabulary for one attrs field annotation."""
    if tp in _SIMPLE:
        return _SIMPLE[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [member.value for member in tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        return "object"
    if origin is list and args == (str,):
        return "list[str]"
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        (inner,) = [a for a in args if a is not type(None)]
        if inner is str:
            return "str?"
        if typing.get_origin(inner) is list:
            return "list?"
        if typing.get_origin(inner) is frozenset and typing.get_args(inner) == (str,):
            return "set[str]?"
    return f"unknown: {tp!r}"


def describe_fields(cls: type) -> list[list[Any]]:
    """``[[name, kind], ...]`` of an attrs class, in wire (attrs) order."""
    hints = typing.get_type_hints(cls)
    return [[a.name, type_kind(hints.get(a.name, a.type))] for a in attr.fields(cls)]


def schema() -> dict[str, Any]:
    streams: dict[str, Any] = {}
    for name, stream in STREAMS_MAP.items():
        row_type = stream.ROW_TYPE
        streams[name] = {
            "row_type": None if row_type is None else row_type.__qualname__,
            "fields": None if row_type is None else describe_fields(row_type),
        }
    return {
        "streams": streams,
        "event_kinds": {
            kind: {"row_type": cls.__qualname__, "fields": describe_fields(cls)} for kind, cls in TypeToRow.items()
        },
        "events_row": {
            "row_type": EventsStreamRow.__qualname__,
            "fields": [a.name for a in attr.fields(EventsStreamRow)],
        },
    }


def wire_value(value: Any) -> Any:
    # The reader turns this list back into a frozenset (attrs converter).
    return list(value) if isinstance(value, frozenset) else value


def wire_fields(typed: Any) -> tuple[Any, ...]:
    return tuple(wire_value(getattr(typed, a.name)) for a in attr.fields(type(typed)))


def json_fields(typed: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in attr.fields(type(typed)):
        value = getattr(typed, a.name)
        out[a.name] = {"frozenset": sorted(value)} if isinstance(value, frozenset) else value
    return out


def build(item: dict[str, Any]) -> dict[str, Any]:
    try:
        stream = STREAMS_MAP[item["stream"]]
        values = item["values"]
        if stream is EventsStream:
            data = TypeToRow[item["kind"]](*values)
            typed: Any = EventsStreamRow(data.TypeId, data)
            row: Any = (typed.type, wire_fields(data))
        else:
            typed = stream.ROW_TYPE(*values)
            row = wire_fields(typed)
        line = "RDATA " + RdataCommand(stream.NAME, item["instance"], item["token"], row).to_line()
        back_cmd = parse_command_from_line(line)
        back = stream.parse_row(back_cmd.row)
        if stream is EventsStream:
            parsed: dict[str, Any] = {"type": back.type, "data": json_fields(back.data)}
        else:
            parsed = json_fields(back)
        return {"ok": True, "line": line, "row": back_cmd.row, "parsed": parsed, "roundtrip": back == typed}
    except Exception as err:  # noqa: BLE001 - any failure is an answer
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def main() -> None:
    for raw in sys.stdin:
        req = json.loads(raw)
        out: dict[str, Any] = {}
        if req.get("schema"):
            out["schema"] = schema()
        if "rows" in req:
            out["rows"] = [build(item) for item in req["rows"]]
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
