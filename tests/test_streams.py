"""The stream registry and Synapse's row types."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from factstream import wire
from factstream.errors import ProtocolError
from factstream.streams import (
    SYNAPSE_STREAMS,
    AllStateRow,
    CachesRow,
    CurrentStateRow,
    EventRow,
    EventsRow,
    StreamDefinition,
    TypingRow,
    UnknownStreamError,
    default_registry,
)
from factstream.streams.rows import Row

from conftest import synapse_python


ORACLE = r"""
import json, attr
from synapse.replication.tcp.streams import STREAMS_MAP
from synapse.replication.tcp.streams.events import TypeToRow
out = {}
for name, cls in STREAMS_MAP.items():
    out[name] = [a.name for a in attr.fields(cls.ROW_TYPE)] if cls.ROW_TYPE is not None else None
out["events"] = {k: [a.name for a in attr.fields(v)] for k, v in TypeToRow.items()}
print(json.dumps(out))
"""


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_every_synapse_stream_is_registered_with_its_fields_in_wire_order() -> None:
    oracle = json.loads(subprocess.run([synapse_python(), "-c", ORACLE], check=True, capture_output=True, text=True).stdout)
    reg = default_registry()
    assert set(oracle) == set(reg.names())
    for name, fields in oracle.items():
        if name == "events":
            continue
        assert _fields(reg.get(name).row_type) == fields, name
    assert {k: _fields(v) for k, v in (("ev", EventRow), ("state", CurrentStateRow), ("state-all", AllStateRow))} == oracle["events"]


SYNAPSE_LINES = [
    'RDATA caches master 550953771 ["get_user_by_id",["@bob:example.com"],1550574873251]',
    'RDATA caches master 550953772 ["get_user_by_id",null,1550574873252]',
    'RDATA events master 14 ["ev",["$149019767112vOHxz:localhost:8823","!AFDCvgApUmpdfVjIXm:localhost:8823",'
    '"m.room.guest_access","",null,null,null,false,false]]',
    'RDATA events master 15 ["state",["!r:hs","m.room.member","@a:hs","$e:hs"]]',
    'RDATA events master 16 ["state-all",["!r:hs"]]',
    'RDATA typing master 3 ["!room:hs",["@a:hs","@b:hs"]]',
    'RDATA receipts master 7 ["!r:hs","m.read","@a:hs","$e:hs",null,{"ts":1}]',
    'RDATA presence master 9 ["@a:hs","online",1,2,3,null,true]',
    'RDATA account_data master 4 ["@a:hs",null,"m.push_rules"]',
    'RDATA device_lists master 5 ["@a:hs",false,true]',
    'RDATA to_device master 6 ["@a:hs"]',
    'RDATA backfill master -3 ["$e:hs","!r:hs","m.room.message",null,null,null]',
    'RDATA federation master 2 ["k",{"x":1}]',
    'RDATA profile_updates master 8 ["@a:hs","update",["displayname"]]',
    'RDATA un_partial_stated_event master 2 ["$e:hs",true]',
    'RDATA quarantined_media master 2 ["hs","abc",true]',
]


@pytest.mark.parametrize("line", SYNAPSE_LINES)
def test_a_synapse_line_decodes_into_a_typed_row_and_back_byte_for_byte(line: str) -> None:
    cmd = wire.parse_line(line)
    reg = default_registry()
    row = reg.parse_row(cmd.stream_name, cmd.row)
    assert isinstance(row, reg.get(cmd.stream_name).row_type)
    again = wire.RdataCommand(cmd.stream_name, cmd.instance_name, cmd.token, row.to_wire())
    assert wire.encode(again).decode() == line


def test_events_row_kinds() -> None:
    reg = default_registry()
    row = reg.parse_row("events", ["state", ["!r:hs", "m.room.name", "", None]])
    assert row == EventsRow("state", CurrentStateRow("!r:hs", "m.room.name", "", None))
    assert EventsRow.of(AllStateRow("!r:hs")).to_wire() == ["state-all", ["!r:hs"]]
    with pytest.raises(ProtocolError, match="kind 'nope' is unknown"):
        reg.parse_row("events", ["nope", []])


def test_caches_row_fields() -> None:
    row = CachesRow.from_wire(["get_user_by_id", ["@bob:hs"], 5])
    assert (row.cache_func, row.keys, row.invalidation_ts) == ("get_user_by_id", ["@bob:hs"], 5)


def test_unknown_stream_is_reported_with_the_known_names() -> None:
    reg = default_registry()
    with pytest.raises(UnknownStreamError, match="unknown stream 'nope'.*caches"):
        reg.parse_row("nope", [])


def test_malformed_rows_raise_protocol_errors() -> None:
    reg = default_registry()
    with pytest.raises(ProtocolError, match="typing row must have 2 fields, got 1"):
        reg.parse_row("typing", ["!r"])
    with pytest.raises(ProtocolError, match="must be a JSON array"):
        reg.parse_row("typing", {"room_id": "!r"})


def test_register_a_custom_stream_and_refuse_duplicates() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class MyRow(Row):
        STREAM = "mine"
        a: int
        b: str

    reg = default_registry()
    reg.register(StreamDefinition("mine", MyRow))
    assert reg.parse_row("mine", [1, "x"]) == MyRow(1, "x")
    with pytest.raises(ValueError, match="already registered"):
        reg.register(StreamDefinition("mine", MyRow))
    assert "mine" not in default_registry()


def test_in_memory_streams_are_flagged() -> None:
    flagged = {d.name for d in SYNAPSE_STREAMS if d.in_memory}
    assert flagged == {"typing", "presence_federation", "federation"}
    assert TypingRow.STREAM == "typing"
