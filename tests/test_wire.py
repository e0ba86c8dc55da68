"""The wire codec, on both twins: exact bytes, framing, JSON, errors, decoder."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from factstream import _json
from factstream.commands import (
    CancelTaskCommand,
    ClearUserSyncsCommand,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
    COMMAND_MAP,
)
from factstream.errors import ProtocolError

# (command, exact line Synapse writes for it)
EXAMPLES = [
    (ServerCommand("localhost:8823"), b"SERVER localhost:8823"),
    (RdataCommand("events", "master", 14, ["$ev:hs", "!r:hs", "m.room.guest_access", "", None]),
     b'RDATA events master 14 ["$ev:hs","!r:hs","m.room.guest_access","",null]'),
    (RdataCommand("caches", "master", None, ["get_user_by_id", ["@t:hs"], 1490197670513]),
     b'RDATA caches master batch ["get_user_by_id",["@t:hs"],1490197670513]'),
    (PositionCommand("events", "master", 53, 54), b"POSITION events master 53 54"),
    (ErrorCommand("server stopping"), b"ERROR server stopping"),
    (PingCommand("1490197665618"), b"PING 1490197665618"),
    (NameCommand("synapse.app.appservice"), b"NAME synapse.app.appservice"),
    (ReplicateCommand(), b"REPLICATE "),
    (UserSyncCommand("worker1", "@a:hs", "DEV", True, 1490197675000), b"USER_SYNC worker1 @a:hs DEV start 1490197675000"),
    (UserSyncCommand("worker1", "@a:hs", None, False, 5), b"USER_SYNC worker1 @a:hs None end 5"),
    (ClearUserSyncsCommand("worker1"), b"CLEAR_USER_SYNC worker1"),
    (FederationAckCommand("fed1", 15), b"FEDERATION_ACK fed1 15"),
    (UserIpCommand("@a:hs", "tok", "10.0.0.1", "Mozilla/5.0 (X11)", "DEV", 1490197675100),
     b'USER_IP @a:hs ["tok","10.0.0.1","Mozilla/5.0 (X11)","DEV",1490197675100]'),
    (UserIpCommand("@a:hs", "tok", "::1", "curl", None, 7), b'USER_IP @a:hs ["tok","::1","curl",null,7]'),
    (RemoteServerUpCommand("other.org"), b"REMOTE_SERVER_UP other.org"),
    (LockReleasedCommand("master", "purge", "!r:hs"), b'LOCK_RELEASED ["master","purge","!r:hs"]'),
    (NewActiveTaskCommand("task-1"), b"NEW_ACTIVE_TASK task-1"),
    (CancelTaskCommand("task-1"), b"CANCEL_TASK task-1"),
]


def test_all_fifteen_commands_are_known() -> None:
    assert sorted(COMMAND_MAP) == sorted(
        ["SERVER", "RDATA", "POSITION", "ERROR", "PING", "NAME", "REPLICATE", "USER_SYNC", "CLEAR_USER_SYNC",
         "FEDERATION_ACK", "USER_IP", "REMOTE_SERVER_UP", "LOCK_RELEASED", "NEW_ACTIVE_TASK", "CANCEL_TASK"]
    )
    assert {type(c).NAME for c, _ in EXAMPLES} == set(COMMAND_MAP)


@pytest.mark.parametrize(("cmd", "line"), EXAMPLES, ids=[type(c).__name__ + str(i) for i, (c, _) in enumerate(EXAMPLES)])
def test_encode_and_parse_exact_bytes(wire_impl: ModuleType, cmd: object, line: bytes) -> None:
    assert wire_impl.encode(cmd) == line
    assert wire_impl.parse_line(line) == cmd
    assert wire_impl.parse_line(line.decode()) == cmd
    assert wire_impl.encode(wire_impl.parse_line(line)) == line
    assert wire_impl.encode_lines([cmd, cmd]) == line + b"\n" + line + b"\n"


def _resp_publish(channel: bytes, line: bytes) -> bytes:
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(line), line)


def test_encode_redis_publish_frames_each_line_as_a_publish(wire_impl: ModuleType) -> None:
    cmds = [c for c, _ in EXAMPLES] * 3
    counts = {"RDATA": 1}
    data = wire_impl.encode_redis_publish(cmds, b"srv", b"srv/USER_IP", counts)
    assert data == b"".join(
        _resp_publish(b"srv/USER_IP" if type(c) is UserIpCommand else b"srv", line) for c, line in EXAMPLES * 3
    )
    expected = {"RDATA": 1}
    for c in cmds:
        expected[c.NAME] = expected.get(c.NAME, 0) + 1
    assert counts == expected
    # non-ASCII lines: the RESP length is in bytes
    cmd = RdataCommand("events", "master", 3, ["é", "\u2028"])
    assert wire_impl.encode_redis_publish((cmd,), b"c", b"u", {}) == _resp_publish(b"c", wire_impl.encode(cmd))
    assert wire_impl.encode_redis_publish([], b"c", b"u", counts) == b"" and counts == expected


def test_encode_lines_output_of_any_size_is_every_line_exactly(wire_impl: ModuleType) -> None:
    """The output buffer grows past its first guess (and past a batch of unknown length) without losing a byte."""
    big = [RdataCommand("events", "m", i, ["x" * 100_000, list(range(1000))]) for i in range(1, 4)]
    expected = b"".join(wire_impl.encode(c) + b"\n" for c in big)
    assert wire_impl.encode_lines(big) == expected
    assert wire_impl.encode_lines(iter(big)) == expected  # no length to reserve from
    pings = [PingCommand(str(i)) for i in range(5000)]
    assert wire_impl.encode_lines(c for c in pings) == b"".join(b"PING %d\n" % i for i in range(5000))
    assert wire_impl.encode_lines([]) == b"" and wire_impl.encode_lines(iter(())) == b""
    # a big batch whose size was guessed closely (handed out as written) behaves as any bytes
    near = [PingCommand("p" * 150) for _ in range(2000)]
    out = wire_impl.encode_lines(near)
    assert out == (b"PING " + b"p" * 150 + b"\n") * 2000
    assert len(out) == 312_000 and hash(out) == hash(bytes(out)) and out[-1:] == b"\n" and out + b"" == out
    assert wire_impl.encode_redis_publish(iter(big), b"c", b"u", {}) == b"".join(
        _resp_publish(b"c", wire_impl.encode(c)) for c in big
    )


def test_encode_redis_publish_error_leaves_counts_alone(wire_impl: ModuleType) -> None:
    counts: dict[str, int] = {}
    bad = PositionCommand("events", "has space", 1, 2)
    with pytest.raises(ProtocolError, match="instance_name must be non-empty with no spaces"):
        wire_impl.encode_redis_publish([PingCommand("1"), bad, PingCommand("2")], b"c", b"u", counts)
    assert counts == {}
    with pytest.raises(TypeError, match="takes a Command"):
        wire_impl.encode_redis_publish([b"PING 1"], b"c", b"u", counts)
    with pytest.raises(ProtocolError, match="fields is not JSON"):
        wire_impl.encode_redis_publish([UserIpCommand("@a:hs", "t", "ip", "ua", None, float("nan"))], b"c", b"u", counts)  # type: ignore[arg-type]
    assert counts == {}
    # two bad fields: both twins name the same one first
    with pytest.raises(ProtocolError, match="fields is not JSON"):
        wire_impl.encode(UserIpCommand("a b", "t", "ip", "ua", None, float("nan")))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="user_id must be non-empty"):
        wire_impl.encode(UserIpCommand("a b", "t", "ip", "ua", None, 1))


def test_encode_redis_publish_refuses_wrong_argument_types_alike(wire_impl: ModuleType) -> None:
    counts: dict[str, int] = {}
    for args, what in (((b"c", b"u", None), "counts must be a dict"), ((b"c", b"u", [1]), "counts must be a dict"),
                       ((None, b"u", counts), "channel must be bytes"), ((b"c", "u", counts), "user_ip_channel must be bytes")):
        with pytest.raises(TypeError, match=what):
            wire_impl.encode_redis_publish([PingCommand("1")], *args)
    assert counts == {}


def test_feed_takes_byte_buffers_only(wire_impl: ModuleType) -> None:
    """An int was taken as that many NUL bytes, which then poisoned the next line; a str got bytes()'s words."""
    dec = wire_impl.LineDecoder()
    for bad, what in ((5, "got int"), (True, "got bool"), (None, "got NoneType"), ("PING 1\n", "not str: encode it first")):
        with pytest.raises(TypeError, match=what):
            dec.feed(bad)
    assert dec.buffered == 0
    assert dec.feed(b"PING 1\n") == [PingCommand("1")]  # nothing of the refused calls was kept
    assert dec.feed(bytearray(b"PING 2\nPI")) == [PingCommand("2")]
    assert dec.feed(memoryview(b"xxNG 3\n")[2:]) == [PingCommand("3")]


def test_commands_compare_by_value_and_repr() -> None:
    a = RdataCommand("events", "master", 1, ["x"])
    assert a == RdataCommand("events", "master", 1, ["x"])
    assert a != RdataCommand("events", "master", 2, ["x"])
    assert a != PositionCommand("events", "master", 1, 1)
    assert repr(a) == "RdataCommand(stream_name='events', instance_name='master', token=1, row=['x'])"
    assert repr(ReplicateCommand()) == "ReplicateCommand()"
    assert ClearUserSyncsCommand("w").instance_id == "w"
    assert repr(UserSyncCommand("w", "@u:h", None, True, 1)) == (
        "UserSyncCommand(instance_id='w', user_id='@u:h', device_id=None, is_syncing=True, last_sync_ms=1)"
    )


def test_seed_examples_parse(wire_impl: ModuleType) -> None:
    row = b'RDATA caches master 550953771 ["get_user_by_id", ["@bob:example.com"], 1550574873251]'
    cmd = wire_impl.parse_line(row)
    assert (cmd.stream_name, cmd.instance_name, cmd.token) == ("caches", "master", 550953771)
    assert cmd.row == ["get_user_by_id", ["@bob:example.com"], 1550574873251]
    whole = wire_impl.parse_line(b'RDATA caches master 550953772 ["get_user_by_id", null, 1550574873252]')
    assert whole.row[1] is None
    assert wire_impl.parse_line(b"SERVER example.com") == ServerCommand("example.com")


# ------------------------------------------------------------------- framing

def test_split_at_first_space_only(wire_impl: ModuleType) -> None:
    assert wire_impl.parse_line(b"ERROR failed to parse: a b  c") == ErrorCommand("failed to parse: a b  c")
    cmd = wire_impl.parse_line(b'RDATA s w 1 ["a b", {"k": "v w"}]')
    assert cmd.row == ["a b", {"k": "v w"}]
    assert wire_impl.parse_line(b"PING") == PingCommand("")
    assert wire_impl.parse_line(b"REPLICATE") == ReplicateCommand()
    assert wire_impl.parse_line(b"REPLICATE ALL 0") == ReplicateCommand()  # Synapse ignores the rest


def test_names_are_case_sensitive(wire_impl: ModuleType) -> None:
    with pytest.raises(ProtocolError, match="unknown command 'rdata'"):
        wire_impl.parse_line(b"rdata s w 1 []")
    with pytest.raises(ProtocolError, match="unknown command 'Ping'"):
        wire_impl.parse_line(b"Ping 1")


def test_field_counts(wire_impl: ModuleType) -> None:
    for line in (b"RDATA s w 1", b"RDATA s w", b"POSITION s w 1", b"USER_SYNC a b c start", b"FEDERATION_ACK a",
                 b"USER_IP @u:h"):
        with pytest.raises(ProtocolError, match="expected"):
            wire_impl.parse_line(line)
    with pytest.raises(ProtocolError, match="not an integer"):
        wire_impl.parse_line(b"FEDERATION_ACK a 1 2")  # exactly 2 fields: the token would be '1 2'
    with pytest.raises(ProtocolError, match="not an integer"):
        wire_impl.parse_line(b"POSITION s w 1 2 3")
    with pytest.raises(ProtocolError, match="not an integer"):
        wire_impl.parse_line(b"USER_SYNC a b c start 1 2")


def test_one_trailing_newline_allowed(wire_impl: ModuleType) -> None:
    assert wire_impl.parse_line(b"PING 1\n") == PingCommand("1")
    assert wire_impl.parse_line("PING 1\n") == PingCommand("1")
    with pytest.raises(ProtocolError, match="newline"):
        wire_impl.parse_line(b"PING 1\nPING 2")


def test_every_way_of_calling_parse_line_agrees(wire_impl: ModuleType) -> None:
    # The compiled twin takes parse_line(bytes) and parse_line(bytes, rows=<bool>) by a short way; every
    # other spelling goes the general way. Both give the same commands and refuse the same mistakes.
    import inspect

    parse = wire_impl.parse_line
    line = b'RDATA events master 3 ["$e",{"a":[1]}]'
    eager, lazy = parse(line, rows=True), parse(line)
    assert eager == lazy and eager.row == ["$e", {"a": [1]}]
    for rows in (True, 1, "yes", [0]):
        assert parse(line, rows=rows) == eager
        assert parse(line=line, rows=rows) == eager
        assert parse(line + b"\n", rows=rows) == eager
        assert parse(line.decode(), rows=rows) == eager
        assert parse(line, **{"".join(["ro", "ws"]): rows}) == eager  # a keyword name not interned
    for rows in (False, 0, "", None):
        assert parse(line, rows=rows) == lazy
        assert parse(bytearray(line), rows=rows) == lazy
    params = inspect.signature(parse).parameters
    assert [(p.name, p.kind, p.default) for p in params.values()] == [
        ("line", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
        ("rows", inspect.Parameter.KEYWORD_ONLY, False),
    ]
    for args, kwargs in [((), {}), ((line, True), {}), ((line,), {"row": True}), ((line,), {"rows": True, "x": 1})]:
        with pytest.raises(TypeError):
            parse(*args, **kwargs)
    with pytest.raises(ProtocolError, match="unknown command 'NOPE'") as err:
        parse(b"NOPE 1", rows=True)
    assert err.value.line == b"NOPE 1"


def test_bytearray_and_memoryview_input(wire_impl: ModuleType) -> None:
    assert wire_impl.parse_line(bytearray(b"PING 1")) == PingCommand("1")
    assert wire_impl.parse_line(memoryview(b"PING 1")) == PingCommand("1")
    with pytest.raises(TypeError):
        wire_impl.parse_line(42)


# ---------------------------------------------------------------------- JSON

def test_json_exactly_as_synapse_writes_it(wire_impl: ModuleType) -> None:
    row = {"z": 1, "a": ["é", "😀", "\x7f", "\x00", "\n\t\"\\/", 1.5, 1e100, -0.0, True, None, 10**30]}
    line = wire_impl.encode(RdataCommand("s", "w", 1, row))
    assert line == (
        b'RDATA s w 1 {"z":1,"a":["\\u00e9","\\ud83d\\ude00","\\u007f","\\u0000","\\n\\t\\"\\\\/",1.5,1e+100,-0.0,'
        b'true,null,1000000000000000000000000000000]}'
    )
    assert line == b"RDATA s w 1 " + json.dumps(row, separators=(",", ":")).encode()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_refused_on_encode(wire_impl: ModuleType, bad: float) -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        wire_impl.encode(RdataCommand("s", "w", 1, [bad]))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "[NaN]", '{"a":Infinity}'])
def test_nan_and_infinity_refused_on_decode(wire_impl: ModuleType, text: str) -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        wire_impl.parse_line(f"RDATA s w 1 {text}")


def test_unencodable_rows_are_protocol_errors(wire_impl: ModuleType) -> None:
    loop: list[object] = []
    loop.append(loop)
    for row in ([object()], loop, {(1, 2): 3}):
        with pytest.raises(ProtocolError):
            wire_impl.encode(RdataCommand("s", "w", 1, row))


def test_unusual_but_valid_rows_match_the_stdlib(wire_impl: ModuleType) -> None:
    from collections import OrderedDict
    from types import MappingProxyType

    class Str(str):
        pass

    rows = [
        (1, "x"),
        {1: "int key", None: "none key", 1.5: "float key"},
        {True: "bool key", False: "false key"},
        OrderedDict(a=1),
        MappingProxyType({"frozen": 1}),
        [Str("sub"), 2**70, -(2**70)],
        [[[[[]]]]],
    ]
    for row in rows:
        assert wire_impl.encode(RdataCommand("s", "w", 1, row)) == b"RDATA s w 1 " + _json.dumps(row).encode()


NON_CANONICAL = [
    '["a", "b"]',            # separators with spaces
    ' ["a"]',                # leading whitespace
    '["a"] ',                # trailing whitespace
    '["caf\u00e9"]',         # raw UTF-8
    '["\\u00E9"]',           # uppercase escape
    '["\\u0041"]',           # escaped printable ASCII
    '["\\/"]',               # escaped slash
    '["\\u000a"]',           # control with a short form
    '[-0]',                  # negative zero
    '[1.50]',                # float not in repr form
    '[1E5]',                 # exponent form
    '{"a":1,"a":2}',         # duplicate key
    '["\x7f"]',              # raw DEL
]


@pytest.mark.parametrize("text", NON_CANONICAL)
def test_non_canonical_input_is_reencoded(wire_impl: ModuleType, text: str) -> None:
    cmd = wire_impl.parse_line(f"RDATA s w 1 {text}")
    expected = b"RDATA s w 1 " + _json.dumps(json.loads(text)).encode()
    assert wire_impl.encode(cmd) == expected
    assert expected != f"RDATA s w 1 {text}".encode()


CANONICAL = ['["a","b"]', '{"a":1,"b":[true,false,null]}', '["\\u00e9\\ud83d\\ude00\\u007f\\u0001"]',
             '["\\ud800"]', '[1.5,-3,0,"\\n\\t\\"\\\\"]', "[]", "{}", '"plain"', "12"]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_input_round_trips_byte_for_byte(wire_impl: ModuleType, text: str) -> None:
    line = f"RDATA s w 1 {text}".encode()
    cmd = wire_impl.parse_line(line)
    assert wire_impl.encode(cmd) == line
    assert cmd.row == json.loads(text)
    assert wire_impl.encode(cmd) == line  # and after the row was read


def test_mutating_the_row_changes_the_encoding(wire_impl: ModuleType) -> None:
    cmd = wire_impl.parse_line(b'RDATA s w 1 ["a"]')
    cmd.row.append("b")
    assert wire_impl.encode(cmd) == b'RDATA s w 1 ["a","b"]'
    cmd.row = {"x": 1}
    assert wire_impl.encode(cmd) == b'RDATA s w 1 {"x":1}'


def test_deep_nesting_refused_consistently(wire_impl: ModuleType) -> None:
    ok = "[" * _json.MAX_DEPTH + "]" * _json.MAX_DEPTH
    assert wire_impl.parse_line(f"RDATA s w 1 {ok}").row is not None
    deep = "[" * (_json.MAX_DEPTH + 1) + "]" * (_json.MAX_DEPTH + 1)
    with pytest.raises(ProtocolError, match="nested deeper"):
        wire_impl.parse_line(f"RDATA s w 1 {deep}")


def test_huge_integers(wire_impl: ModuleType) -> None:
    big = "9" * 4300
    assert wire_impl.parse_line(f"RDATA s w 1 [{big}]").row == [int(big)]
    with pytest.raises(ProtocolError, match="not valid JSON"):
        wire_impl.parse_line(f"RDATA s w 1 [{big}9]")


# Number literals past what a double holds, as in issue 11: Python's json
# module (and so Synapse) reads 1e400 as inf and 1e-400 as 0.0; the compiled
# twin once raised SystemError on the first. Whoever holds such a row can read
# it; encoding it is refused, as Synapse's encoder refuses it.
EXTREME_ROWS = [
    "[1e400]", "[-1e400]", "[1e-400]", "[-1e-400]", "[-0]", "[-0.0]", "[1E+309, -2.5e-324]",
    '["get_user_by_id",["@u:h"],1700e000440013]',                       # caches
    '[["@u:h","online",1700e000440013,1e400,-1e400,"hi",true,false]]',  # presence
    "[" + "9" * 400 + ", -" + "1" * 400 + ", " + "1" * 400 + ".5, 0." + "0" * 400 + "1]",
    '{"ts":1.7976931348623159e308,"small":4.9e-324,"nested":[[1e400]]}',
]


@pytest.mark.parametrize("text", EXTREME_ROWS, ids=[t[:30] for t in EXTREME_ROWS])
def test_extreme_numbers_decode_as_the_stdlib(wire_impl: ModuleType, text: str) -> None:
    expected = json.loads(text)
    cmd = wire_impl.parse_line(f"RDATA caches master 1234567 {text}".encode())
    assert repr(cmd.row) == repr(expected)  # repr: inf, -0.0 and 0 told apart
    if "inf" in repr(expected):
        with pytest.raises(ProtocolError, match="not JSON Synapse can carry"):
            wire_impl.encode(cmd)
    else:
        assert wire_impl.encode(cmd) == b"RDATA caches master 1234567 " + _json.dumps(expected).encode()


@pytest.mark.parametrize("last_seen", ["1e400", "-1e400", "1700e000440013", "1e-400", "-0"])
def test_extreme_numbers_in_user_ip_and_lock_released(wire_impl: ModuleType, last_seen: str) -> None:
    cmd = wire_impl.parse_line(f'USER_IP @u:h ["tok","::1","curl",null,{last_seen}]'.encode())
    assert repr(cmd.last_seen) == repr(json.loads(last_seen))
    lock = wire_impl.parse_line(f'LOCK_RELEASED [{last_seen},"lock","key"]'.encode())
    assert repr(lock.instance_name) == repr(json.loads(last_seen))


def test_extreme_numbers_through_the_decoder(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    got = dec.feed(b"RDATA events master 1 [1e400]\nRDATA events master 2 [-1e400,1e-400]\n")
    assert [c.row for c in got] == [[float("inf")], [float("-inf"), 0.0]]


# --------------------------------------------------------------------- errors

BAD_LINES = [
    (b"", "empty line"),
    (b"BOGUS x", "unknown command 'BOGUS'"),
    (b" PING", "unknown command ''"),
    (b"RDATA s w 1_000 []", "not an integer"),
    (b"RDATA s  w 12 []", "instance_name is empty"),
    (b"RDATA s w  12 []", "token .. is not an integer"),
    (b"RDATA s w +12 []", "not an integer"),
    (b"RDATA s w \xd9\xa1\xd9\xa2 []", "not an integer"),  # Arabic-Indic digits
    (b"RDATA s w 12 ", "not valid JSON"),
    (b"RDATA s w 12 [1,]", "not valid JSON"),
    (b"RDATA s w 12 [1] [2]", "not valid JSON"),
    (b'RDATA s w 12 ["\x01"]', "not valid JSON"),
    (b'RDATA s w 12 ["\\x"]', "not valid JSON"),
    (b'RDATA s w 12 ["\\u12g4"]', "not valid JSON"),
    (b"RDATA s w 12 [01]", "not valid JSON"),
    (b"RDATA s w 99999999999999999999 []", "does not fit in 64 bits"),
    (b"RDATA s w -9223372036854775809 []", "does not fit in 64 bits"),
    (b"POSITION s w 1 x", "not an integer"),
    (b"POSITION s w - 1", "not an integer"),
    (b"USER_SYNC a b c maybe 1", "USER_SYNC state"),
    (b"USER_IP @u:h {}", "JSON array"),
    (b'USER_IP @u:h ["a","b"]', "JSON array"),
    (b'LOCK_RELEASED "abc"', "JSON array"),
    (b'USER_IP @u:h ["a",', "USER_IP fields is not valid JSON"),
    (b'USER_IP @u:h ["a","b","c",null,1] x', "USER_IP fields is not valid JSON"),
    (b"LOCK_RELEASED [NaN]", "LOCK_RELEASED fields is not valid JSON"),
    (b"PING \xff", "not valid UTF-8"),
    (b"PING \xed\xa0\x80", "not valid UTF-8"),  # an encoded surrogate
    (b"PING \xc0\x80", "not valid UTF-8"),      # overlong NUL
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES, ids=[repr(b)[:40] for b, _ in BAD_LINES])
def test_bad_lines_raise_protocol_error(wire_impl: ModuleType, line: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as info:
        wire_impl.parse_line(line)
    assert isinstance(info.value, ValueError)
    assert info.value.line is not None


def test_int64_bounds_accepted(wire_impl: ModuleType) -> None:
    assert wire_impl.parse_line(b"POSITION s w -9223372036854775808 9223372036854775807") == PositionCommand(
        "s", "w", -(2**63), 2**63 - 1
    )
    assert wire_impl.parse_line(b"RDATA s w 007 []").token == 7


def test_error_message_shows_truncated_line(wire_impl: ModuleType) -> None:
    with pytest.raises(ProtocolError) as info:
        wire_impl.parse_line(b"BOGUS " + b"x" * 500)
    assert "..." in str(info.value) and len(str(info.value)) < 300


def test_many_names_decode_the_same(wire_impl: ModuleType) -> None:
    # More names than the compiled twin's name cache holds, of every length it keys differently
    # (under four bytes, under eight, up to sixteen, up to its 40-byte limit, past it): sets meet and evict.
    names = [f"{'n' * (i % 45)}{i}" for i in range(300)] + ["receipts", "event_persister1", "typing", "events"]
    for order in (names, names[::-1], names[::7] * 3):
        for name in order:
            cmd = wire_impl.parse_line(f"RDATA {name} {name[::-1]} 1 []".encode(), rows=True)
            assert (cmd.stream_name, cmd.instance_name) == (name, name[::-1])


@pytest.mark.parametrize(
    "cmd",
    [
        RdataCommand("has space", "w", 1, []),
        RdataCommand("s", "", 1, []),
        RdataCommand("s", "w", 1.5, []),  # type: ignore[arg-type]
        RdataCommand("s", "w", True, []),  # type: ignore[arg-type]
        RdataCommand("s", "w", 2**63, []),
        PositionCommand("s", "w\n", 1, 2),
        PingCommand("1\n2"),
        ErrorCommand("a\nb"),
        UserSyncCommand("w", "@u:h", "dev ice", True, 1),
        ServerCommand("\ud800"),
        RdataCommand("\ud800", "w", 1, []),
    ],
)
def test_unencodable_commands_are_refused(wire_impl: ModuleType, cmd: object) -> None:
    with pytest.raises(ProtocolError, match="cannot encode"):
        wire_impl.encode(cmd)


def test_encode_rejects_non_commands(wire_impl: ModuleType) -> None:
    with pytest.raises(TypeError):
        wire_impl.encode("PING 1")


# -------------------------------------------------------------------- decoder

def test_decoder_holds_partial_lines(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    assert dec.feed(b"PING 1\nPI") == [PingCommand("1")]
    assert dec.buffered == 2
    assert dec.feed(b"NG 2") == []
    assert dec.feed(b"\n\n   \r\n\nREPLICATE\n") == [PingCommand("2"), ReplicateCommand()]
    assert dec.buffered == 0


def test_decoder_every_split_point(wire_impl: ModuleType) -> None:
    data = b"".join(line + b"\n" for _, line in EXAMPLES)
    expected = [cmd for cmd, _ in EXAMPLES]
    for cut in range(len(data) + 1):
        dec = wire_impl.LineDecoder()
        assert dec.feed(data[:cut]) + dec.feed(data[cut:]) == expected
    dec = wire_impl.LineDecoder()
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert got == expected


def test_decoder_error_keeps_earlier_and_later_commands(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    with pytest.raises(ProtocolError, match="unknown command") as info:
        dec.feed(b"PING 1\nPING 2\nNOPE\nPING 3\nPING 4\nPI")
    assert info.value.commands == [PingCommand("1"), PingCommand("2")]
    assert info.value.line == b"NOPE"
    assert dec.feed(b"") == [PingCommand("3"), PingCommand("4")]
    assert dec.feed(b"NG 5\n") == [PingCommand("5")]


def test_decoder_second_bad_line_among_held_lines_loses_nothing(wire_impl: ModuleType) -> None:
    # After a bad line the lines behind it are held; a second bad line among them, met by a feed of new data,
    # keeps both what follows it and the new data (the compiled twin once kept only the new data: PING 2-4 lost).
    dec = wire_impl.LineDecoder()
    with pytest.raises(ProtocolError) as first:
        dec.feed(b"NOPE\nPING 1\nBAD\nPING 2\nPING 3\n")
    assert first.value.commands == [] and first.value.line == b"NOPE"
    with pytest.raises(ProtocolError) as second:
        dec.feed(b"PING 4\nPING 5\nPI")
    assert second.value.commands == [PingCommand("1")] and second.value.line == b"BAD"
    assert dec.buffered == len(b"PING 2\nPING 3\nPING 4\nPING 5\nPI")
    assert dec.feed(b"NG 6\n") == [PingCommand(str(i)) for i in range(2, 7)]


def test_decoder_max_line_length(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder(max_line_length=10)
    assert dec.max_line_length == 10
    assert dec.feed(b"PING 12345\n") == [PingCommand("12345")]  # exactly 10 bytes
    with pytest.raises(ProtocolError, match="longer than 10 bytes") as info:
        dec.feed(b"PING 123456\nPING 1\n")
    assert info.value.commands == []
    assert dec.feed(b"") == [PingCommand("1")]


def test_decoder_overlong_partial_is_skipped_to_its_newline(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder(max_line_length=16)
    with pytest.raises(ProtocolError, match="longer than 16 bytes"):
        dec.feed(b"PING 1\nPING " + b"x" * 20)
    assert dec.buffered == 0  # memory stays bounded
    assert dec.feed(b"y" * 10_000) == []
    assert dec.buffered == 0
    assert dec.feed(b"zz\nPING 2\n") == [PingCommand("2")]


def test_decoder_default_limit_is_synapses(wire_impl: ModuleType) -> None:
    assert wire_impl.DEFAULT_MAX_LINE_LENGTH == 16384
    dec = wire_impl.LineDecoder()
    line = b"PING " + b"1" * (16384 - 5)
    assert dec.feed(line + b"\n") == [PingCommand("1" * (16384 - 5))]
    with pytest.raises(ProtocolError):
        dec.feed(line + b"1\n")


def test_decoder_rejects_bad_limit(wire_impl: ModuleType) -> None:
    with pytest.raises(ValueError):
        wire_impl.LineDecoder(max_line_length=0)


# ----------------------------------------------------------- cycle collector


def test_parsed_commands_stay_collectable_through_their_rows(wire_impl: ModuleType) -> None:
    # The compiled twin hands out commands the cycle collector does not track
    # while they hold only strings and numbers; a row put in them (decoded or
    # set) tracks them again, so a cycle through one is still collected.
    import gc
    import weakref

    class Probe:
        pass

    for setter in (False, True):
        cmd = wire_impl.parse_line(b'RDATA events master 5 ["a",1]')
        probe = Probe()
        if setter:
            cmd.row = [cmd, probe]
        else:
            cmd.row.extend([cmd, probe])
        assert gc.is_tracked(cmd)
        ref = weakref.ref(probe)
        del cmd, probe
        gc.collect()
        assert ref() is None, "a cycle through a parsed command was not collected"


def test_untracked_only_while_atomic(wire_impl: ModuleType) -> None:
    import gc

    position = wire_impl.parse_line(b"POSITION events master 1 2")
    rdata = wire_impl.parse_line(b'RDATA events master 5 "text"')
    if wire_impl.__name__.endswith("_c"):
        assert not gc.is_tracked(position) and not gc.is_tracked(rdata)
    assert rdata.row == "text"  # a str row: nothing to track
    rdata.row = {"k": []}
    assert gc.is_tracked(rdata)


def test_row_descriptor_behaves_as_the_property(wire_impl: ModuleType) -> None:
    cmd = wire_impl.parse_line(b'RDATA s w 1 ["a"]')
    assert cmd.raw_row in (b'["a"]', None)  # the pure twin decodes at once and keeps no bytes
    assert cmd.row == ["a"] and cmd.raw_row is None  # handed out: the bytes are no longer trusted
    with pytest.raises(AttributeError):
        del cmd.row
    built = RdataCommand("s", "w", None, {"x": 1})
    assert built.row == {"x": 1} and wire_impl.encode(built) == b'RDATA s w batch {"x":1}'
    assert isinstance(RdataCommand.__dict__["row"].__doc__, str)


def test_repeated_names_decode_the_same(wire_impl: ModuleType) -> None:
    # The compiled twin shares decoded stream/instance names between lines.
    names = ["events", "caches", "e" * 40, "f" * 41, "\u00e9v\u00e9nements", "x", "events"]
    for name in names * 3:
        cmd = wire_impl.parse_line(f"POSITION {name} w{len(name)} 1 2".encode())
        assert (cmd.stream_name, cmd.instance_name) == (name, f"w{len(name)}")
    with pytest.raises(ProtocolError, match="stream_name is empty"):
        wire_impl.parse_line(b"RDATA  w 1 []")


@pytest.mark.parametrize(
    "cmd",
    [PingCommand("a\nb"), PingCommand("caf\u00e9"), PingCommand("\ud800"), UserSyncCommand("w", "@u h", None, True, 1),
     UserSyncCommand("w", "@u:h", "", False, 1), UserSyncCommand("w", "@u:h", 5, False, 1),  # type: ignore[arg-type]
     UserSyncCommand("w", "@u:h", "D", False, 2**63)],
)
def test_encode_fast_paths_agree_with_to_line(wire_impl: ModuleType, cmd: object) -> None:
    from factstream import _wire_py

    try:
        expected: object = _wire_py.encode(cmd)
    except ProtocolError as err:
        expected = ("error", str(err))
    try:
        got: object = wire_impl.encode(cmd)
    except ProtocolError as err:
        got = ("error", str(err))
    assert got == expected


def test_strings_encode_like_json_for_every_length_and_escape_position(wire_impl: ModuleType) -> None:
    # The compiled encoder checks an ASCII string sixteen bytes at a time (the last sixteen re-read,
    # a short one through a padded copy): an escape at any place, in strings around those widths.
    specials = ['"', "\\", "\n", "\x7f", "\x01", "\u00e9", "\U0001f600"]
    for n in range(0, 36):
        strings = ["p" * n] + ["a" * i + ch + "b" * (n - i - 1) for i in range(n) for ch in specials]
        for text in strings:
            cmd = RdataCommand("s", "w", 1, [text, text[::-1]])
            want = "RDATA s w 1 " + json.dumps([text, text[::-1]], ensure_ascii=True, separators=(",", ":"))
            assert wire_impl.encode(cmd) == want.encode(), text


# ------------------------------------------------- rows=True: rows decoded in the parsing pass


ROWS_EDGE_CASES = [
    b'RDATA s w 1 ["\\u00e9\\ud83d\\ude00\\ud800x\\udc00", "h\xc3\xa9", "\x7f", "\\/\\b\\f\\n\\r\\t\\"\\\\"]',
    b'RDATA s w 1 ["\\u00E9", "\\uD83D\\uDE00", "' + b"x" * 40 + b'\\u0041' + b"y" * 40 + b'"]',
    b'RDATA s w 1 ["\\u00e', b'RDATA s w 1 ["\\u00eg"]', b'RDATA s w 1 ["\\', b'RDATA s w 1 ["\\a"]',
    b'RDATA s w 1 ["a\tb"]', b'RDATA s w 1 ["a\x00b"]', b'RDATA s w 1 ["' + b"z" * 100 + b'\x1f"]',
    b'RDATA s w 1 ["' + b"z" * 100, b'RDATA s w 1 "', b"RDATA s w 1 ",
    b"RDATA s w 1 [-0, -0.0, 0e0, 1E+2, 1e-2, 1.5e400, -1e400, 1e-400, 0.1, 1.0]",
    b"RDATA s w 1 -", b"RDATA s w 1 [-]", b"RDATA s w 1 [1.]", b"RDATA s w 1 [1e]", b"RDATA s w 1 [1e+]",
    b"RDATA s w 1 [.5]", b"RDATA s w 1 [01]", b"RDATA s w 1 [-01]", b"RDATA s w 1 [+1]", b"RDATA s w 1 1e",
    b"RDATA s w 1 [nul]", b"RDATA s w 1 [tru]", b"RDATA s w 1 [fals]", b"RDATA s w 1 nul", b"RDATA s w 1 [NaN]",
    b"RDATA s w 1 [Infinity]", b"RDATA s w 1 [-Infinity]", b"RDATA s w 1 [null,true,false]",
    b"RDATA s w 1 [" + b"9" * 18 + b", " + b"9" * 19 + b", -" + b"9" * 19 + b", 9223372036854775808]",
    b"RDATA s w 1 [" + b"7" * 640 + b"]", b"RDATA s w 1 [" + b"7" * 641 + b"]",
    b"RDATA s w 1 [" + b"7" * 4300 + b"]", b"RDATA s w 1 [" + b"7" * 4301 + b"]",
    b"RDATA s w 1 " + b"[" * 511 + b"]" * 511, b"RDATA s w 1 " + b"[" * 512 + b"]" * 512,
    b"RDATA s w 1 " + b"[" * 513 + b"]" * 513, b'RDATA s w 1 ' + b'{"a":' * 512 + b"1" + b"}" * 512,
    b'RDATA s w 1 ' + b'{"a":' * 511 + b"1" + b"}" * 511,
    b'RDATA s w 1 {"a":1,"a":2,"b":[]}', b'RDATA s w 1 {"a" 1}', b'RDATA s w 1 {"a":1,}', b'RDATA s w 1 {1:2}',
    b'RDATA s w 1 {"a":1', b'RDATA s w 1 {', b"RDATA s w 1 [1,]", b"RDATA s w 1 [1 2]", b"RDATA s w 1 [", b"RDATA s w 1 ]",
    b"RDATA s w 1  \t[ 1 ,\r2 ] \t", b"RDATA s w 1 [1]\x0b", b"RDATA s w 1 [1] [2]", b"RDATA s w 1 {}",
    b"RDATA s w 1 [" + b",".join(b"%d" % i for i in range(40)) + b"]", b"RDATA s w 1 [" + b"[]," * 17 + b"[]]",
    b"RDATA s w batch [1]", b"RDATA s w x [1]", b"RDATA s w [1]", b"RDATA s w 1 \xff", b'RDATA s w 1 ["\xed\xa0\x80"]',
]


def _escaped_texts() -> list[str]:
    """Texts that canonical JSON writes with escapes: every str width, pairs, lone and misordered surrogates."""
    pieces = ["\u00e9", "\u4e00", "\U0001f600", "\ud800", "\udc00", "\n", '"', "\\", "\x7f", "\x00", "\u0100"]
    texts = []
    for piece in pieces:
        for count in (1, 2, 15, 16, 17, 40):
            for plain in ("", "a", "abcdefghijklmnopq"):
                texts.append(plain + (piece + plain) * count)
    texts += ["\ud800\ud800\udc00", "\udc00\ud800", "\ud800A", "a\u00e9" * 9 + "\u4e00", "\u00ff" * 17 + "\U0001f600"]
    return texts


@pytest.mark.parametrize("rows", [True, False])
def test_escaped_strings_decode_as_the_stdlib(wire_impl: ModuleType, rows: bool) -> None:
    # The builders write an escaped string straight at its width; the str must equal (same width, same
    # code points) what json.loads gives, as a row, a dict key, and through the decoder.
    texts = _escaped_texts()
    rows_in = [[text, {text: text}] for text in texts]
    lines = [b"RDATA s w 1 " + json.dumps(row, separators=(",", ":")).encode() for row in rows_in]
    expected = [json.loads(line[12:]) for line in lines]  # a high and a low surrogate escape read as one
    for line, row in zip(lines, expected):
        cmd = wire_impl.parse_line(line, rows=rows)
        assert cmd.row == row
        # equal str of the same width may still differ in CPython's ASCII flag, which isascii() reads
        assert [cmd.row[0].isascii(), *(key.isascii() for key in cmd.row[1])] == [row[0].isascii()] * 2
        assert wire_impl.encode(cmd) == line
    fed = wire_impl.LineDecoder(rows=rows).feed(b"".join(line + b"\n" for line in lines))
    assert [cmd.row for cmd in fed] == expected
    assert expected[:6] == rows_in[:6]  # most texts are read back as they were


@pytest.mark.parametrize("line", ROWS_EDGE_CASES, ids=range(len(ROWS_EDGE_CASES)))
def test_rows_flag_gives_what_parse_then_row_gives(wire_impl: ModuleType, line: bytes) -> None:
    def run(**kwargs: bool) -> tuple[object, ...]:
        try:
            cmd = wire_impl.parse_line(line, **kwargs)
        except ProtocolError as err:
            return ("error", str(err), err.reason, err.line)
        try:
            line_out: object = wire_impl.encode(cmd)
        except ProtocolError as err:  # a row past the double range: neither can be written
            line_out = str(err)
        return ("ok", repr(cmd), repr(cmd.row), line_out)

    assert run(rows=True) == run()


def test_rows_flag_on_the_corpus_and_examples(wire_impl: ModuleType) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from corpus import generate

    from factstream.cli.decode import sample_log_path

    lines = generate(3000) + [line for _, line in EXAMPLES]
    lines += [line for line in Path(sample_log_path()).read_bytes().splitlines() if line.strip()]
    good = []
    for line in lines:
        try:
            lazy = wire_impl.parse_line(line)
        except ProtocolError as err:
            with pytest.raises(ProtocolError) as eager_err:
                wire_impl.parse_line(line, rows=True)
            assert str(eager_err.value) == str(err)
            continue
        good.append(line)
        eager = wire_impl.parse_line(line, rows=True)
        if isinstance(lazy, RdataCommand):
            assert repr(eager.row) == repr(lazy.row)
            assert eager.raw_row is None  # as after reading .row: no bytes kept
        assert eager == lazy
    data = b"".join(line + b"\n" for line in good)
    fed = wire_impl.LineDecoder(max_line_length=1 << 20, rows=True).feed(data)
    assert fed == [wire_impl.parse_line(line) for line in good]
    assert wire_impl.encode_lines(fed) == data


def test_rows_flag_rows_are_the_commands_own(wire_impl: ModuleType) -> None:
    # A decoded row belongs to its command (mutable, not shared) and the command re-encodes what it now holds.
    a = wire_impl.parse_line(b'RDATA s w 1 ["x", {"k": [1]}]', rows=True)
    b = wire_impl.parse_line(b'RDATA s w 1 ["x", {"k": [1]}]', rows=True)
    a.row[1]["k"].append(2)
    assert b.row == ["x", {"k": [1]}]
    assert wire_impl.encode(a) == b'RDATA s w 1 ["x",{"k":[1,2]}]'
    import gc
    import weakref

    class Holder:
        cmd: object = None

    holder = Holder()
    holder.cmd = a
    a.row.append(holder)  # a cycle through the row stays collectable
    gone = weakref.ref(holder)
    del a, holder
    gc.collect()
    assert gone() is None


def _containers(value: object) -> list[object]:
    """Every list and dict inside ``value`` (itself included)."""
    found: list[object] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            found.append(v)
            stack.extend(v)
        elif isinstance(v, dict):
            found.append(v)
            stack.extend(v.values())
    return found


def _assert_tracked_as_built(cmds: list[object]) -> None:
    # What a caller may rely on however the rows were built: a command holding
    # a container, every list, and every dict holding a container are tracked
    # by the cycle collector (a dict of atomic values may be left out, as
    # CPython itself leaves it).
    import gc

    for cmd in cmds:
        row = getattr(cmd, "row", None)  # RDATA only
        if isinstance(row, (list, dict)):
            assert gc.is_tracked(cmd)
        for c in _containers(row):
            if isinstance(c, list) or any(isinstance(v, (list, dict)) for v in c.values()):
                assert gc.is_tracked(c), c


_NESTED_ROWS = b"".join(
    b'RDATA events master %d ["$ev%d", {"k": [%d, {"deep": [1, 2]}], "e": {}}, [], [[%d]], "text", null]\n'
    % (i, i, i, i)
    for i in range(3000)
)


@pytest.mark.parametrize("chunk", [4096, 65536, None])
def test_fed_rows_are_tracked_when_feed_returns(wire_impl: ModuleType, chunk: int | None) -> None:
    # The compiled decoder keeps the rows of one feed out of the collector
    # until the feed ends (so its own young collections need not walk them);
    # by the time feed returns they are all tracked, and cycles through them
    # are collected. 3,000 rows of nested containers: several collections run
    # during a whole-buffer feed.
    import gc
    import weakref

    dec = wire_impl.LineDecoder(max_line_length=1 << 30, rows=True)
    step = chunk or len(_NESTED_ROWS)
    cmds = []
    for i in range(0, len(_NESTED_ROWS), step):
        got = dec.feed(_NESTED_ROWS[i : i + step])
        _assert_tracked_as_built(got)
        cmds.extend(got)
    assert len(cmds) == 3000
    assert cmds[7].row == ["$ev7", {"k": [7, {"deep": [1, 2]}], "e": {}}, [], [[7]], "text", None]

    class Probe:
        pass

    probe = Probe()
    cmds[5].row[1]["k"][1]["deep"].append([cmds[5], probe])  # a cycle through a nested container
    gone = weakref.ref(probe)
    del probe, cmds, got
    gc.collect()
    assert gone() is None, "a cycle through a fed row was not collected"


def test_fed_rows_are_tracked_when_feed_raises(wire_impl: ModuleType) -> None:
    # A bad line (here a row refused after part of it was built) raises with
    # the commands completed before it, all tracked; the partly built row is
    # freed, not leaked (the collector's object count does not grow).
    import gc

    bad = b'RDATA events master 1 ["a", [1, 2], {"k": [3]}, nope]\n'
    buffer = _NESTED_ROWS[:20_000].rpartition(b"\n")[0] + b"\n" + bad + b'RDATA events master 2 [["after"]]\n'
    dec = wire_impl.LineDecoder(rows=True)
    with pytest.raises(wire_impl.ProtocolError) as err:
        dec.feed(buffer)
    assert err.value.commands and err.value.commands[-1].row[0].startswith("$ev")
    _assert_tracked_as_built(err.value.commands)
    after = dec.feed(b"")
    assert [c.row for c in after] == [[["after"]]]
    _assert_tracked_as_built(after)
    del err, after
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(200):
        with pytest.raises(wire_impl.ProtocolError):
            wire_impl.LineDecoder(rows=True).feed(bad)
    gc.collect()
    assert len(gc.get_objects()) < before + 100


def test_feed_from_a_collector_callback(wire_impl: ModuleType) -> None:
    # Python code can run inside a feed only through the collector's
    # callbacks; a feed made there (nested in another) gives tracked rows, and
    # so does the outer one.
    import gc

    inner: list[object] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and not inner:
            inner.extend(wire_impl.LineDecoder(rows=True).feed(b'RDATA s w 1 [[1], {"a": [2]}]\n'))

    gc.callbacks.append(callback)
    try:
        outer = wire_impl.LineDecoder(max_line_length=1 << 30, rows=True).feed(_NESTED_ROWS)
    finally:
        gc.callbacks.remove(callback)
    assert len(outer) == 3000
    assert inner and inner[0].row == [[1], {"a": [2]}]
    _assert_tracked_as_built(outer)
    _assert_tracked_as_built(inner)


@pytest.mark.parametrize("rows", [False, True])
def test_fed_commands_tracked_as_parsed_ones(wire_impl: ModuleType, rows: bool) -> None:
    # Every command a feed returns is exactly as tracked as the same line
    # parsed alone (the compiled feed holds commands untracked while it runs):
    # a whole buffer of mixed commands, fed at once.
    import gc

    kinds = [
        b"PING 1700000000000",
        b"USER_SYNC worker1 @a:hs DEV start 1490197675000",
        b'USER_IP @a:hs ["tok","::1","curl",null,7]',
        b"POSITION events master 1 2",
        b"NAME worker1",
        b"FEDERATION_ACK fed 5",
        b"REMOTE_SERVER_UP example.org",
        b'RDATA events master 5 ["$e", "!r:hs", "m.room.member", "@u:hs", null, null, false]',
        b'RDATA caches master batch ["get_user", [["@u:hs"]], 1700000000000]',
        b'RDATA typing master 3 ["!r:hs", []]',
        b'RDATA account_data master 4 ["@u:hs", null, "m.push_rules"]',
        b'RDATA to_device master 9 "@u:hs"',
        b"RDATA presence master 2 {}",
    ]
    lines = kinds * 300
    fed = wire_impl.LineDecoder(max_line_length=1 << 30, rows=rows).feed(b"".join(line + b"\n" for line in lines))
    assert len(fed) == len(lines)
    for line, cmd in zip(lines, fed):
        alone = wire_impl.parse_line(line, rows=rows)
        assert type(cmd) is type(alone) and gc.is_tracked(cmd) == gc.is_tracked(alone), line
    _assert_tracked_as_built(fed)


def test_line_scan_at_every_offset(wire_impl: ModuleType) -> None:
    """The one line scanner (sixteen bytes at a time, the last sixteen re-read) at every length and place.

    A newline, a byte past ASCII and the header's spaces are found wherever
    they fall, in parse_line (a whole line) and in the decoder (cut at the
    first newline, the next line's bytes never counted for this one).
    """
    for pad in range(40):
        # The fields before the row end at spaces that fall in the main blocks or in the re-read tail.
        line = b"RDATA s" + b"x" * pad + b" m 7 " + b'["' + b"y" * (pad % 19) + b'"]'
        cmd = wire_impl.parse_line(line, rows=True)
        assert (cmd.stream_name, cmd.instance_name, cmd.token, cmd.row) == ("s" + "x" * pad, "m", 7, ["y" * (pad % 19)])
        text = b"PING " + b"a" * pad
        for at in range(5, len(text) + 1):
            with pytest.raises(ProtocolError, match="contains a newline"):
                wire_impl.parse_line(text[:at] + b"\n" + text[at:] + b"x")
            bad = text[:at] + b"\xff" + text[at:]
            with pytest.raises(ProtocolError, match="not valid UTF-8"):
                wire_impl.parse_line(bad)
            # Fed: the bad line is refused, the good ones around it come out, the bytes after it stay buffered.
            dec = wire_impl.LineDecoder()
            with pytest.raises(ProtocolError, match="not valid UTF-8") as err:
                dec.feed(b"PING \xc3\xa9\n" + bad + b"\n" + text)
            assert [c.data for c in err.value.commands] == ["\u00e9"]
            assert dec.feed(b"\n") == [PingCommand(text[5:].decode())]
        # Lines past ASCII and ASCII ones side by side, each as long as the other's tail.
        dec = wire_impl.LineDecoder()
        assert dec.feed(b"PING " + "\u00e9".encode() * (pad + 1) + b"\n" + text + b"\n") == [
            PingCommand("\u00e9" * (pad + 1)), PingCommand(text[5:].decode())
        ]
