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
    | st.floats(allow_nan=False, allow_infinity=False)
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
                     b"\\u", b"\\ud83d", b"\\ude00", b",", b":", b"null", b"1e5", b"-0", b"NaN", b"\xc3\xa9", b"\xff"]),
)
lines = st.builds(lambda h, parts: h + b" " + b"".join(parts), header, st.lists(fragment, max_size=12))


