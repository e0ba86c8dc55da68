"""Every stream's rows against Synapse itself: a line Synapse writes decodes into our typed row.

Synapse (``.venv-synapse``, test-only oracle; ``FACTSTREAM_SYNAPSE_PYTHON``
may point elsewhere) runs behind ``synapse_rows_oracle.py``, one bridge
process for this module. For each stream of Synapse's ``STREAMS_MAP`` (and
each kind of the events stream) we check that our registry knows it, that our
row type has Synapse's field names in Synapse's order, and that for generated
field values (typed as Synapse annotates them) the RDATA line Synapse writes
parses with ``wire.parse_line`` + ``registry.parse_row`` into our typed row
with exactly those values, and that our row re-encodes to the same bytes,
both when decoded from Synapse's line and when built by us from the values.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SynapseBridge
from factstream.commands import RdataCommand
from factstream.streams import EVENT_ROW_KINDS, EventsRow, default_registry
from factstream.streams.rows import Row
from wire_strategies import any_text, int64, json_values, word

BRIDGE = Path(__file__).resolve().parent / "synapse_rows_oracle.py"
REGISTRY = default_registry()

#: (stream, events kind) cases: every kind of the events stream, then every other stream we ship.
CASES: list[tuple[str, str | None]] = [("events", kind) for kind in EVENT_ROW_KINDS] + [
    (d.name, None) for d in REGISTRY if d.name != "events"
]

#: Cases where our row (pkg/factstream/streams/rows.py) is known to disagree with
#: Synapse's, with the reason; each runs as xfail(strict=True) until rows.py is fixed.
KNOWN_MISMATCHES: dict[tuple[str, str | None], str] = {}

#: Synapse field kinds (see synapse_rows_oracle.py) whose typed value is a
#: frozenset: the wire carries ``list(frozenset)``, so order and duplicates are Synapse's.
SET_KINDS = frozenset({"set[str]?"})


def _is_set(ftype: Any) -> bool:
    return isinstance(ftype, str) and ftype in SET_KINDS


def _case_id(stream: str, kind: str | None) -> str:
    return f"{stream}/{kind}" if kind else stream


PARAMS = [
    pytest.param(
        stream,
        kind,
        id=_case_id(stream, kind),
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISMATCHES[(stream, kind)])]
        if (stream, kind) in KNOWN_MISMATCHES
        else [],
    )
    for stream, kind in CASES
]


# ------------------------------------------------------------------- the oracle


class RowsOracle(SynapseBridge):
    """The rows bridge; ``schema()`` is asked once."""

    def __init__(self) -> None:
        super().__init__(str(BRIDGE))
        self._schema: dict[str, Any] | None = None

    def schema(self) -> dict[str, Any]:
        """Synapse's streams, row types and fields (wire order), asked once."""
        if self._schema is None:
            self._schema = self.ask({"schema": True})["schema"]
        return self._schema


@pytest.fixture(scope="module")
def oracle() -> Iterator[RowsOracle]:
    o = RowsOracle()
    yield o
    o.close()


@pytest.fixture(scope="module")
def schema(oracle: RowsOracle) -> dict[str, Any]:
    """Synapse's streams, row types and fields (wire order), from the bridge."""
    return oracle.schema()


def _their_fields(schema: dict[str, Any], stream: str, kind: str | None) -> list[tuple[str, Any]]:
    spec = schema["event_kinds"][kind] if kind else schema["streams"][stream]
    return [(name, ftype) for name, ftype in spec["fields"]]


def _our_row_type(stream: str, kind: str | None) -> type[Row]:
    return EVENT_ROW_KINDS[kind] if kind else REGISTRY.get(stream).row_type


def _names(row_type: type[Row]) -> list[str]:
    return [f.name for f in dataclasses.fields(row_type)]  # type: ignore[arg-type]


# ------------------------------------------------------------- streams, fields


def test_registry_knows_every_synapse_stream(schema: dict[str, Any]) -> None:
    theirs = set(schema["streams"])
    missing = sorted(theirs - set(REGISTRY.names()))
    assert not missing, f"Synapse streams our default registry lacks: {missing}"
    extra = sorted(set(REGISTRY.names()) - theirs)
    assert not extra, f"streams we ship that Synapse 1.163 does not have: {extra}"
    # Every Synapse stream is a case here: events through its kinds, the rest directly.
    without_row_type = sorted(name for name, spec in schema["streams"].items() if spec["fields"] is None)
    assert without_row_type == ["events"]
    assert sorted(schema["event_kinds"]) == sorted(EVENT_ROW_KINDS)
    assert {s for s, _ in CASES} == theirs


def test_events_row_wraps_kind_and_data_like_synapse(schema: dict[str, Any]) -> None:
    assert _names(EventsRow) == schema["events_row"]["fields"]
    assert REGISTRY.get("events").row_type is EventsRow


@pytest.mark.parametrize(("stream", "kind"), PARAMS)
def test_row_fields_match_synapse_row_type_in_wire_order(schema: dict[str, Any], stream: str, kind: str | None) -> None:
    theirs = [name for name, _ in _their_fields(schema, stream, kind)]
    assert _names(_our_row_type(stream, kind)) == theirs


# ------------------------------------------------------------------ the rows

_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "str": any_text,
    "user_id": any_text,
    "str?": st.none() | any_text,
    "int": int64,
    "bool": st.booleans(),
    "list[str]": st.lists(any_text, max_size=5),
    "list?": st.none() | st.lists(json_values, max_size=5),
    "object": st.dictionaries(any_text, json_values, max_size=5),
    "set[str]?": st.none()
    | st.lists(st.sampled_from(["displayname", "avatar_url", "m.tz", "\u00e9"]) | any_text, max_size=5),
}

# One hand-picked value per field kind, non-ASCII wherever text goes.
_SAMPLE_VALUES: dict[str, list[Any]] = {
    "str": ["caf\u00e9 \U0001f600 \u2028"],
    "user_id": ["@\u00e9l\u00e8ve:h\u00f4te.example"],
    "str?": [None, "\u65e5\u672c"],
    "int": [-(2**63), 2**63 - 1],
    "bool": [True, False],
    "list[str]": [[], ["@a:h", "@\u00fc:h"]],
    "list?": [None, ["k\u00e9y", 1, None, True, {"a": [1.5]}]],
    "object": [{}, {"ts": 1, "\u00e9": {"nested": [None, False]}, "z": "a"}],
    "set[str]?": [None, ["displayname"]],
}


def _field_strategy(ftype: Any) -> st.SearchStrategy[Any]:
    if isinstance(ftype, dict) and "enum" in ftype:
        return st.sampled_from(ftype["enum"])
    if ftype not in _FIELD_VALUES:
        pytest.fail(f"Synapse row field type {ftype!r} has no value strategy; add one to _FIELD_VALUES")
    return _FIELD_VALUES[ftype]


def _sample(ftype: Any, i: int) -> Any:
    if isinstance(ftype, dict) and "enum" in ftype:
        return ftype["enum"][i % len(ftype["enum"])]
    choices = _SAMPLE_VALUES[ftype]
    return choices[i % len(choices)]


def _same(a: Any, b: Any) -> bool:
    """Equal as values and as JSON (so 1, 1.0 and True stay apart)."""
    return bool(a == b) and json.dumps(a) == json.dumps(b)


def _check_rows(
    wire: ModuleType,
    oracle: RowsOracle,
    stream: str,
    kind: str | None,
    rows: list[tuple[str, int | None, list[Any]]],
) -> None:
    """Ask Synapse to write ``rows`` (instance, token, field values) and check our side of each line."""
    fields = _their_fields(oracle.schema(), stream, kind)
    request = [
        {"stream": stream, "kind": kind, "instance": instance, "token": token, "values": values}
        for instance, token, values in rows
    ]
    answers = oracle.ask({"rows": request})["rows"]
    for (instance, token, values), theirs in zip(rows, answers, strict=True):
        assert theirs["ok"], f"Synapse refused {stream} row {values!r}: {theirs['error']}"
        assert theirs["roundtrip"], f"Synapse does not read back its own {stream} row {values!r}"
        line = theirs["line"].encode("utf-8", "surrogatepass")
        cmd = wire.parse_line(line)
        assert isinstance(cmd, RdataCommand), line
        assert (cmd.stream_name, cmd.instance_name, cmd.token) == (stream, instance, token)

        typed = REGISTRY.parse_row(stream, cmd.row)
        assert type(typed) is REGISTRY.get(stream).row_type
        their_wire = theirs["row"]
        their_parsed = theirs["parsed"]
        if kind is not None:
            assert isinstance(typed, EventsRow)
            assert typed.type == kind == their_parsed["type"]
            inner: Row = typed.data
            their_wire, their_parsed = their_wire[1], their_parsed["data"]
        else:
            inner = typed
        assert type(inner) is _our_row_type(stream, kind)

        for i, ((name, ftype), sent) in enumerate(zip(fields, values, strict=True)):
            got = getattr(inner, name)
            if _is_set(ftype):
                # Synapse's row holds a frozenset; what it wrote is list(frozenset), which we keep as received.
                assert _same(got, their_wire[i]), (stream, name, got, their_wire[i])
                want = None if sent is None else sorted(set(sent))
                assert (None if got is None else sorted(set(got))) == want, (stream, name)
                assert (None if got is None else sorted(set(got))) == (
                    None if their_parsed[name] is None else their_parsed[name]["frozenset"]
                ), (stream, name)
            else:
                assert _same(got, sent), (stream, name, got, sent)
                assert _same(got, their_parsed[name]), (stream, name, got, their_parsed[name])

        # Reader direction: our typed row re-encodes to Synapse's bytes.
        assert wire.encode(RdataCommand(stream, instance, token, typed.to_wire())) == line, line
        # Writer direction: our row built from the same values writes Synapse's bytes
        # (frozenset fields take the order Synapse wrote them in).
        ours_values = [their_wire[i] if _is_set(ftype) else v for i, ((_, ftype), v) in enumerate(zip(fields, values))]
        built = _our_row_type(stream, kind)(*ours_values)
        row = EventsRow.of(built) if kind is not None else built
        assert wire.encode(RdataCommand(stream, instance, token, row.to_wire())) == line, line


@pytest.mark.parametrize(("stream", "kind"), PARAMS)
def test_sample_rows_from_synapse_decode_and_reencode(
    wire_impl: ModuleType, oracle: RowsOracle, schema: dict[str, Any], stream: str, kind: str | None
) -> None:
    fields = _their_fields(schema, stream, kind)
    rows = [
        ("master", 1, [_sample(ftype, 0) for _, ftype in fields]),
        ("event_persister-\u00e9", None, [_sample(ftype, 1) for _, ftype in fields]),
        ("w2", 2**63 - 1, [_sample(ftype, 1) for _, ftype in fields]),
    ]
    _check_rows(wire_impl, oracle, stream, kind, rows)


@pytest.mark.parametrize(("stream", "kind"), PARAMS)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_generated_rows_from_synapse_decode_and_reencode(
    wire_impl: ModuleType, oracle: RowsOracle, stream: str, kind: str | None, data: st.DataObject
) -> None:
    fields = _their_fields(oracle.schema(), stream, kind)
    values = st.tuples(*[_field_strategy(ftype) for _, ftype in fields]).map(list)
    rows = data.draw(st.lists(st.tuples(word, st.none() | int64, values), min_size=1, max_size=6), label="rows")
    _check_rows(wire_impl, oracle, stream, kind, rows)
