"""The archive column builder twins (factstream.spark._archive_c / _archive_py).

The row function (``spark.lines.line_values``) is the specification; the pure
builder only collects its rows. The compiled builder computes most lines'
columns itself, so every test here runs on both twins, and the differential
tests demand that both give equal Arrow columns for the same bytes, fuzzed
with hypothesis.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require, twin  # noqa: E402

pa = require(module="pyarrow", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")

from factstream.spark import lines as L  # noqa: E402
import wire_strategies as ws  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import spark_archives  # noqa: E402


@pytest.fixture
def archive_impl(impl: str) -> ModuleType:
    """The archive column builder twin under test (``ArchiveColumns``)."""
    return twin("spark._archive", impl)


def _table(mod: ModuleType, data: bytes, typed: bool, batch_rows: int = 1000, fmt: str = "lines") -> Any:
    """Everything the builder makes of ``data``, fed the way the pipeline feeds it."""
    cols = mod.ArchiveColumns(typed)
    names = [name for name, _ in mod.COLUMNS][: len(mod.COLUMNS) if typed else mod.HEADER_COLUMNS]
    batches = []
    values = L.ROW_FUNCTIONS[fmt]

    def row_function(number: int, line: bytes) -> tuple[Any, ...] | None:
        return values(number, line, typed)

    pos, number = 0, 0
    while True:
        pos, number = cols.feed(data, pos, number, batch_rows, row_function, fmt)
        assert len(cols) <= batch_rows
        if len(cols) >= batch_rows or pos >= len(data):
            batches.append(pa.RecordBatch.from_arrays(cols.take(), names=names))
            assert len(cols) == 0
        if pos >= len(data):
            break
    return pa.Table.from_batches(batches)


def _expected(data: bytes, typed: bool, fmt: str = "lines") -> list[tuple[Any, ...]]:
    """The row function applied line by line: what every builder must hold."""
    out = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if line:
            values = L.ROW_FUNCTIONS[fmt](number, line, typed)
            if values is not None:
                out.append(values)
    return out


def _rows(table: Any) -> list[tuple[Any, ...]]:
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*columns))


def _normalise(values: tuple[Any, ...]) -> tuple[Any, ...]:
    # Arrow stores text as UTF-8: lone surrogates come back replaced
    return tuple(_fix(v) for v in values)


def _fix(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, list):
        return [_fix(x) for x in v]
    return v


EDGE_LINES = [
    b"",
    b"   ",
    b"2026-11-22T01:02:03Z > PING 5",
    b"> ",
    b"PING",
    b"PING ",
    b"REPLICATE x y",
    b"USER_SYNC a b None start 5",
    b"USER_SYNC a b c end -5",
    b"USER_SYNC a  c end 5",
    b"USER_SYNC a b c middle 5",
    b"USER_SYNC a b c end 5 6",
    b"USER_SYNC a b c end",
    b"USER_SYNC",
    b'RDATA caches m 5 ["f",[1,"a"],1.5]',
    b'RDATA caches m 5 ["f",["a","b"],123456789012345678901]',
    b'RDATA caches m 5 ["f",["a","b"],9223372036854775807]',
    b'RDATA caches m 5 ["f",["a","b"],-9223372036854775808]',
    b'RDATA caches m 5 ["f",["a\\"b"],1e3]',
    b'RDATA caches m 2 ["x",null,-0]',
    b'RDATA caches m 2 ["x",[],true]',
    b'RDATA caches m 2 ["x",{},"5"]',
    b'RDATA caches m 2 [1,["k"],2,3]',
    b'RDATA events m 1 ["ev",["\\u0041",1,2,3,4,5,6,true,1]]',
    b'RDATA events m 1 ["ev",["$e","!r","t",null,null,null,null,false,true]]',
    b'RDATA events m batch [ "state" , [ "r" , "t" , "" , "e" ] ]',
    b'RDATA events m 7 ["state-all",["!r"]]',
    b'RDATA events m 7 ["state-all",[5]]',
    b'RDATA events m 7 ["other",[1,2]]',
    b'RDATA events m 7 [5,[1,2]]',
    b'RDATA events m 7 ["ev",{}]',
    b'RDATA events m 7 ["ev",[1,2],3]',
    b'RDATA events m 7 {"a":1}',
    b'RDATA events m 7 ["\\u0065v",["$e","!r","t",null,null,null,null,false,true]]',
    'RDATA events m 1 ["ev",["\u00e9"]]'.encode(),
    b"RDATA events m 9223372036854775808 []",
    b"RDATA events m -9223372036854775808 []",
    b"RDATA events  1 []",
    b"RDATA events m 1 [",
    b"RDATA events m 1 [NaN]",
    b"RDATA events m 1",
    b"POSITION events m 1 2",
    b"POSITION events m 1 2 3",
    b"POSITION events m x 2",
    b"POSITION  m 1 2",
    b"FEDERATION_ACK fed 5",
    b"HELLO world",
    b"RDATAX a b 1 []",
    b"\xff\xfe",
    b"RDATA typing m 1 [\"caf\xc3\xa9\"]",
    b"PING 1\r",
    # numbers past the double range (issue 11): inf / 0.0 for the row function, never a crash
    b'RDATA caches m 5 ["f",["a"],1e400]',
    b'RDATA caches m 5 ["f",[1700e000440013],-1e400]',
    b'RDATA caches m 5 ["f",["a"],1e-400]',
    b'RDATA events m 5 ["ev",["$e","!r","t",null,null,null,null,false,1e400]]',
    b'RDATA presence m 5 [["@u:h","online",1700e000440013,1,2,null,true,false]]',
    b'USER_IP @u:h ["tok","::1","curl",null,1e400]',
]


def _corpus() -> bytes:
    lines = spark_archives.protocol_lines(3, 2000) + EDGE_LINES
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("typed", [True, False])
def test_builder_holds_what_the_row_function_says(archive_impl: ModuleType, typed: bool) -> None:
    data = _corpus()
    table = _table(archive_impl, data, typed, batch_rows=333)
    assert _rows(table) == [_normalise(v) for v in _expected(data, typed)]


@pytest.mark.parametrize("typed", [True, False])
def test_twins_give_equal_arrow_columns(typed: bool) -> None:
    data = _corpus()
    c = _table(twin("spark._archive", "c"), data, typed)
    py = _table(twin("spark._archive", "py"), data, typed)
    assert c.schema == py.schema
    for name in c.column_names:
        assert c.column(name).equals(py.column(name)), name


def test_feed_numbers_lines_and_stops_at_max_rows(archive_impl: ModuleType) -> None:
    cols = archive_impl.ArchiveColumns(False)
    data = b"PING 1\n\nPING 2\nPING 3\nPING 4"

    def row_function(number: int, line: bytes) -> tuple[Any, ...] | None:
        return L.line_values(number, line, False)

    pos, number = cols.feed(data, 0, 10, 2, row_function)
    assert (data[pos:], number, len(cols)) == (b"PING 3\nPING 4", 13, 2)
    pos, number = cols.feed(data, pos, number, 10, row_function)
    assert (pos, number, len(cols)) == (len(data), 15, 4)
    assert cols.take()[0].to_pylist() == [11, 13, 14, 15]  # the blank line 12 is skipped, still counted
    assert len(cols) == 0


def test_row_function_sees_exactly_the_lines_the_builder_cannot_do_alone(archive_impl: ModuleType) -> None:
    cols = archive_impl.ArchiveColumns(True)
    asked: list[tuple[int, bytes]] = []

    def row_function(number: int, line: bytes) -> tuple[Any, ...] | None:
        asked.append((number, line))
        return L.line_values(number, line, True)

    data = b'RDATA events m 1 ["ev",["$e","!r","t",null,null,null,null,false,true]]\nHELLO\n> \n  \n'
    cols.feed(data, 0, 0, 100, row_function)
    if archive_impl.__name__.endswith("_c"):
        assert asked == [(2, b"HELLO"), (3, b"> "), (4, b"  ")]
    else:
        assert [n for n, _ in asked] == [1, 2, 3, 4]
    assert len(cols) == 3  # the whitespace-only line is blank


def test_append_checks_width_and_types_and_loses_nothing_on_a_bad_row(archive_impl: ModuleType) -> None:
    cols = archive_impl.ArchiveColumns(False)
    good = L.line_values(1, b"POSITION events m 1 2", False)
    assert good is not None
    cols.append(good)
    with pytest.raises(ValueError, match="13 column values"):
        cols.append(good[:5])
    bad = (2, None, None, None, "PING", None, None, "not-an-int", None, None, None, None, None)
    with pytest.raises(TypeError, match="column token"):
        cols.append(bad)
    cols.append(good)  # the refused row left nothing behind
    assert [a.to_pylist() for a in cols.take()][:8] == [[1, 1]] + [[None] * 2] * 3 + [["POSITION"] * 2] + [
        ["events"] * 2, ["m"] * 2, [2, 2]]


def test_lone_surrogates_are_replaced_not_fatal(archive_impl: ModuleType) -> None:
    cols = archive_impl.ArchiveColumns(True)
    data = b'RDATA events m 1 ["ev",["\\ud800x","!r","t",null,null,null,null,false,true]]'
    cols.feed(data, 0, 0, 10, lambda n, line: L.line_values(n, line, True))
    arrays = cols.take()
    event_id = arrays[[name for name, _ in archive_impl.COLUMNS].index("ev_event_id")]
    assert event_id.to_pylist() == ["?x"]


def test_empty_take_gives_empty_columns(archive_impl: ModuleType) -> None:
    arrays = archive_impl.ArchiveColumns(True).take()
    assert len(arrays) == len(archive_impl.COLUMNS) and all(len(a) == 0 for a in arrays)


# ---------------------------------------------------------------- fuzzing

ascii_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8)
field = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                  ascii_text, ws.any_text, st.lists(ascii_text, max_size=2))
events_rows = st.one_of(
    st.tuples(st.sampled_from(["ev", "state", "state-all", "other", "ev\u00e9"]), st.lists(field, max_size=10)).map(list),
    st.lists(field, max_size=3),
    field,
)
caches_rows = st.one_of(
    st.tuples(field, st.one_of(st.none(), st.lists(st.one_of(ascii_text, ws.any_text, st.integers(), st.none()), max_size=4), field), field).map(list),
    st.lists(field, max_size=4),
)


def _rdata(stream: str, token: str, row: Any, spaced: bool) -> bytes:
    text = json.dumps(row, separators=(", ", " : ") if spaced else (",", ":"))
    return f"RDATA {stream} w {token} {text}".encode()


typed_lines = st.one_of(
    st.builds(_rdata, st.just("events"), st.sampled_from(["1", "batch", "-3"]), events_rows, st.booleans()),
    st.builds(_rdata, st.just("caches"), st.sampled_from(["1", "batch"]), caches_rows, st.booleans()),
)
archive_lines = st.lists(st.one_of(typed_lines, ws.lines, ws.commands.map(lambda c: c.NAME.encode() + b" " + c.to_line().encode("utf-8", "surrogatepass"))), max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archive_lines, st.booleans(), st.integers(1, 7))
def test_fuzz_twins_agree_on_any_bytes(lines: list[bytes], typed: bool, batch_rows: int) -> None:
    data = b"\n".join(lines)
    c = _table(twin("spark._archive", "c"), data, typed, batch_rows)
    py = _table(twin("spark._archive", "py"), data, typed, batch_rows)
    assert _rows(c) == _rows(py)
    assert _rows(py) == [_normalise(v) for v in _expected(data, typed)]



# ------------------------------------------------- prefixes and redis-cli captures
#
# Recorded traffic: most lines carry the recorder's timestamp and direction,
# redis-cli captures wrap the payload in quotes. The compiled builder reads
# their common lines itself; the pure one asks the row function about each.

TIMESTAMPS = st.one_of(
    st.builds(
        lambda d, sep, frac, zone: d.strftime("%Y-%m-%d") + sep + d.strftime("%H:%M:%S") + frac + zone,
        st.datetimes(),
        st.sampled_from(["T", " "]),
        st.sampled_from(["", ".5", ",123", ".051", ".123456", ".1234567", ".123456789", ".1234567890", "."]),
        st.sampled_from(["", "Z", "+01:00", "-0530", "+18:00", "+18:01", "-23:59", "+00:60", "+1", "z"]),
    ),
    st.sampled_from(["0000-01-01T00:00:00Z", "2026-02-29T00:00:00Z", "2024-02-29T23:59:59Z", "2026-13-01T00:00:00Z",
                     "2026-11-31T00:00:00Z", "2026-11-21T24:00:00Z", "2026-11-21T23:60:00Z", "2026-11-21T23:59:60Z",
                     "9999-12-30T00:00:00Z", "9999-12-29T23:59:59.999999Z", "0001-01-02T00:00:00Z",
                     "0001-01-01T23:59:59.999999Z", "0001-01-02T00:00:00+01:00", "2026-11-21T10:00:00.051Z"]),
)
UNIX_TIMES = st.one_of(
    st.builds(lambda i, f: f"{i}{f}", st.integers(0, 10**15), st.sampled_from(["", ".5", ".0000005", ".9999995", ".449548",
                                                                          ".12345649", "."])),
    st.sampled_from(["00000000001795310678.449548", "253402214399.9999995", "253402128000", "1e5", "-1", ""]),
)
DIRECTIONS = st.sampled_from([b"> ", b"< ", b"# ", b">  ", b"", b">", b"#"])


def _prefixed(ts: str | None, sep: bytes, direction: bytes, payload: bytes) -> bytes:
    return (ts.encode() + sep if ts is not None else b"") + direction + payload


notes = st.builds(lambda word, text: word + text, st.sampled_from([b"disconnected", b"connected", b"x", b"\xc3\xa9t\xc3\xa9"]),
                  st.sampled_from([b"", b" ", b" peer closed the connection", b" caf\xc3\xa9"]))
prefixed_lines = st.builds(
    _prefixed,
    st.one_of(st.none(), TIMESTAMPS),
    st.sampled_from([b" ", b"  ", b"", b"\t"]),
    DIRECTIONS,
    st.one_of(typed_lines, ws.lines, notes, st.just(b""), st.just(b"nonsense here")),
)


def _redis_quote(payload: bytes) -> bytes:
    return spark_archives.redis_quote(payload)


monitor_lines = st.one_of(
    st.builds(
        lambda t, client, verb, chan, payload: f"{t} [0 {client}] ".encode() + verb + b" " + _redis_quote(chan) + b" "
        + _redis_quote(payload),
        UNIX_TIMES, st.sampled_from(["127.0.0.1:42798", "lua", "unix:/tmp/r.sock"]),
        st.sampled_from([b'"PUBLISH"', b'"publish"', b'"SPUBLISH"', b'"GET"']),
        st.sampled_from([b"chan", b'ch"an', b"c\\h"]), st.one_of(typed_lines, ws.lines)),
    st.sampled_from([b"OK", b"junk", b'1795310678.4 [0 lua] "PUBLISH" "c"', b'1795310678.4 [0 lua] "PUBLISH" "c" "PING 1" ']),
)
csv_lines = st.one_of(
    st.builds(lambda chan, payload: b'"message",' + _redis_quote(chan) + b"," + _redis_quote(payload),
              st.sampled_from([b"chan", b'ch"an']), st.one_of(typed_lines, ws.lines)),
    st.builds(lambda chan, payload: b'"pmessage","ch*",' + _redis_quote(chan) + b"," + _redis_quote(payload),
              st.sampled_from([b"chan", b"c,h"]), st.one_of(typed_lines, ws.lines)),
    st.sampled_from([b'"subscribe","chan",1', b"Reading messages... (press Ctrl-C to quit)", b'"message","chan"',
                     b'"message","chan","PING 1" ', b'"smessage","chan","PING 1"']),
)
FORMAT_LINES = {"lines": prefixed_lines, "monitor": monitor_lines, "redis-csv": csv_lines}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FORMAT_LINES)).flatmap(lambda f: st.tuples(st.just(f), st.lists(FORMAT_LINES[f], max_size=20))),
       st.booleans(), st.integers(1, 7))
def test_fuzz_twins_agree_on_every_format(case: tuple[str, list[bytes]], typed: bool, batch_rows: int) -> None:
    fmt, lines = case
    data = b"\n".join(lines)
    c = _table(twin("spark._archive", "c"), data, typed, batch_rows, fmt)
    py = _table(twin("spark._archive", "py"), data, typed, batch_rows, fmt)
    assert _rows(c) == _rows(py)
    assert _rows(py) == [_normalise(v) for v in _expected(data, typed, fmt)]


RDATA = b'RDATA events m 1 ["ev",["$e","!r","t",null,null,null,null,false,true]]'
RECORDED = {
    "lines": [
        b"2026-11-21T10:00:00.051Z > " + RDATA,
        b"2026-11-21T10:00:00.051123+01:00 < PING 5",
        b"2026-11-21 10:00:00Z  >  POSITION events m 1 2",
        b"> PING 6",
        b"2026-11-21T10:00:01Z # disconnected peer closed the connection",
        b"2026-11-21T10:00:02.5Z # connected 127.0.0.1:9092",
        RDATA,
    ],
    "monitor": [b'1795310678.449548 [0 127.0.0.1:42798] "PUBLISH" "chan" ' + _redis_quote(RDATA),
                b'1795310678 [0 lua] "PUBLISH" "c\x01" "PING 1"'],
    "redis-csv": [b'"message","chan",' + _redis_quote(RDATA), b'"pmessage","ch*","chan","POSITION events m 1 2"'],
}


@pytest.mark.parametrize("fmt", sorted(RECORDED))
def test_recorded_traffic_never_reaches_python_in_the_compiled_builder(archive_impl: ModuleType, fmt: str) -> None:
    asked: list[bytes] = []

    def row_function(number: int, line: bytes) -> tuple[Any, ...] | None:
        asked.append(line)
        return L.ROW_FUNCTIONS[fmt](number, line, True)

    cols = archive_impl.ArchiveColumns(True)
    data = b"\n".join(RECORDED[fmt])
    cols.feed(data, 0, 0, 100, row_function, fmt)
    assert len(cols) == len(RECORDED[fmt])
    rows = list(zip(*[a.to_pylist() for a in cols.take()]))
    assert rows == _expected(data, True, fmt)
    assert asked == ([] if archive_impl.__name__.endswith("_c") else RECORDED[fmt])


def test_recorder_notes_are_commands_not_errors() -> None:
    values = L.line_values(7, b"2026-11-21T10:00:01Z # disconnected peer closed the connection", False)
    assert values == (7, "2026-11-21T10:00:01Z", "#", None, "#disconnected", None, None, None, None, None,
                      "peer closed the connection", None, None)
    assert L.line_values(1, b"2026-11-21T10:00:01Z # connected", False)[4:11] == (  # type: ignore[index]
        "#connected", None, None, None, None, None, None)
    assert L.line_values(1, b"2026-11-21T10:00:01Z #", False)[11] == "recorder note without text"  # type: ignore[index]
    assert L.line_values(1, b"# disconnected", False)[11].startswith("unknown command")  # type: ignore[index]


# ---------------------------------------------------------------- timestamps

OFFSETS = st.sampled_from([0, 3600, -5 * 3600 - 1800, 14 * 3600, -12 * 3600])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.none(), TIMESTAMPS, UNIX_TIMES, st.text(max_size=12),
                          st.sampled_from(["\u0661\u0662", "2026-11-21T10:00:00\u0665Z"])), max_size=12), OFFSETS)
def test_timestamp_twins_agree_with_timestamp_micros(texts: list[str | None], offset: int) -> None:
    import datetime as dt

    from factstream.spark.timestamps import _date, timestamp_micros

    zone = dt.timezone(dt.timedelta(seconds=offset))
    arr = pa.array(texts, pa.string())
    want_micros = [None if t is None else timestamp_micros(t, zone) for t in texts]
    want_days = [None if m is None else _date(m, zone) for m in want_micros]
    for name in ("c", "py"):
        for a in (arr, arr.slice(1)):
            skip = len(texts) - len(a)
            micros, days = twin("spark._archive", name).timestamp_columns(a, offset, lambda t: timestamp_micros(t, zone))
            assert micros.to_pylist() == want_micros[skip:], name
            assert days.to_pylist() == want_days[skip:], name
