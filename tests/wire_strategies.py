"""Hypothesis strategies for replication commands and lines, shared by the codec tests."""

from __future__ import annotations

from hypothesis import strategies as st

from factstream.commands import (
    ClearUserSyncsCommand,
    Command,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
)

# Text that may go anywhere JSON can carry it: any code point, lone surrogates included.
any_text = st.text(st.characters(codec=None), max_size=20)
# A space-delimited field: non-empty, no space or line break, encodable as UTF-8.
word = st.text(st.characters(exclude_categories=["Cs"], exclude_characters=" \n"), min_size=1, max_size=12)
# Free text at the end of a line: no line breaks.
tail_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n"), max_size=30)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.integers(min_value=-(10**400), max_value=10**400)  # past 64 bits, up to 400 digits
    | st.floats(allow_nan=False, allow_infinity=False)  # subnormals, the largest double and -0.0 included
    | any_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(any_text, children, max_size=5),
    max_leaves=25,
)

commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(RdataCommand, word, word, st.none() | int64, json_values),
    st.builds(PositionCommand, word, word, int64, int64),
    st.builds(UserSyncCommand, word, word, st.none() | word.filter(lambda s: s != "None"), st.booleans(), int64),
    st.builds(FederationAckCommand, word, int64),
    st.builds(UserIpCommand, word, any_text, any_text, any_text, st.none() | any_text, int64),
    st.builds(LockReleasedCommand, any_text, any_text, any_text),
    st.builds(ClearUserSyncsCommand, tail_text),
    st.just(ReplicateCommand()),
    *[st.builds(cls, tail_text) for cls in (ServerCommand, ErrorCommand, PingCommand, NameCommand, RemoteServerUpCommand)],
)


header = st.sampled_from(
    [b"RDATA", b"POSITION", b"PING", b"USER_SYNC", b"USER_IP", b"FEDERATION_ACK", b"LOCK_RELEASED", b"REPLICATE",
     b"SERVER", b"ERROR", b"NAME", b"CLEAR_USER_SYNC", b"REMOTE_SERVER_UP", b"NEW_ACTIVE_TASK", b"CANCEL_TASK", b"rdata", b""]
)
fragment = st.one_of(
    st.binary(max_size=12),
    st.sampled_from([b" ", b"batch", b"-", b"0", b"12", b"None", b"start", b"end", b"[", b"]", b"{", b"}", b'"',
                     b"\\u", b"\\ud83d", b"\\ude00", b",", b":", b"null", b"1e5", b"-0", b"NaN", b"1e400", b"-1e-400", b"E+309", b"\xc3\xa9", b"\xff"]),
)

# ------------------------------------------------------------------ extreme numbers
# JSON number literals at and past what a double or Python's int() holds: they
# must decode exactly as Python's json module does (1e400 is inf, 1e-400 is
# 0.0, -0 is 0) in both twins, as Synapse decodes them, never crash.

_digits = st.text("0123456789", min_size=1, max_size=400)


def _literal(sign: str, whole: str, frac: str | None, exp: tuple[str, str, str] | None) -> bytes:
    whole = whole.lstrip("0") or "0"  # JSON allows no leading zeros
    text = sign + whole
    if frac is not None:
        text += "." + frac
    if exp is not None:
        text += "".join(exp)
    return text.encode()


number_literal = st.one_of(
    st.sampled_from([
        b"1e400", b"-1e400", b"1e-400", b"-1e-400", b"-0", b"-0.0", b"0e0", b"-0E-0", b"1E+309", b"1700e000440013",
        b"4.9e-324", b"2.4e-324", b"2.5e-324", b"1.7976931348623157e308", b"1.7976931348623159e308",
        b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809", b"18446744073709551616",
        b"0." + b"0" * 400 + b"1", b"1" * 400 + b".5", b"1" * 400 + b"e-400", b"9" * 400,
        b"1" * 4301,  # past int()'s digit limit: refused by everyone
    ]),
    st.builds(
        _literal,
        st.sampled_from(["", "-"]),
        _digits,
        st.none() | st.text("0123456789", min_size=1, max_size=40),
        st.none() | st.tuples(st.sampled_from(["e", "E"]), st.sampled_from(["", "+", "-"]),
                              st.integers(0, 10**6).map(str) | st.text("0123456789", min_size=1, max_size=8)),
    ),
)

extreme_json: st.SearchStrategy[bytes] = st.recursive(
    number_literal,
    lambda inner: st.lists(inner, max_size=4).map(lambda xs: b"[" + b",".join(xs) + b"]")
    | st.lists(st.tuples(st.sampled_from([b'"a"', b'"ts"', b'"last_active_ts"']), inner), max_size=3).map(
        lambda kv: b"{" + b",".join(k + b":" + v for k, v in kv) + b"}"
    ),
    max_leaves=6,
)
_quoted = st.sampled_from([b'"@u:h"', b'"get_user"', b'"online"', b'""'])

extreme_lines = st.one_of(
    st.builds(lambda s, row: b"RDATA " + s + b" master 1234567 " + row,
              st.sampled_from([b"events", b"caches", b"presence", b"typing", b"s"]), extreme_json),
    # caches [cache_func, keys, invalidation_ts] and presence rows, the shapes Synapse writes
    st.builds(lambda f, k, ts: b"RDATA caches master 7 [" + f + b",[" + k + b"]," + ts + b"]",
              _quoted, number_literal, number_literal),
    st.builds(lambda u, a, b, c: b"RDATA presence master 9 [" + u + b',"online",' + a + b"," + b + b"," + c
              + b',null,true,false]', _quoted, number_literal, number_literal, number_literal),
    st.builds(lambda a, b: b'USER_IP @u:h ["tok","1.2.3.4","ua",' + a + b"," + b + b"]", number_literal | _quoted,
              number_literal),
    st.builds(lambda a: b"LOCK_RELEASED [" + a + b',"lock","key"]', number_literal),
)

lines = st.one_of(
    st.builds(lambda h, parts: h + b" " + b"".join(parts), header, st.lists(fragment, max_size=12)),
    extreme_lines,
)


