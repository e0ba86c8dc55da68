"""LineDecoder.iter_feed: the commands feed gives, built a window at a time as they are taken (both twins)."""

from __future__ import annotations

import gc
import sys
import weakref
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream import _compat
from factstream import _wire_py as PY
from factstream.commands import PingCommand, RdataCommand
from factstream.errors import ProtocolError
from test_wire import EXAMPLES, _assert_tracked_as_built

WINDOW = PY._WINDOW_BYTES  # the bytes of lines one window builds (both twins: the compiled one is checked against it)

# Some 300 KiB of every kind of line: several windows.
MIXED = b"".join(line + b"\n" for _, line in EXAMPLES)
BIG = b"".join(
    b'RDATA events master %d ["$ev%d", {"k": [%d, {"deep": [1, 2]}]}, "text", null]\nPING %d\n\n' % (i, i, i, i)
    for i in range(4000)
) + MIXED


def _drain(dec: Any, chunks: list[bytes], iterate: bool) -> list[Any]:
    """Every command and error ``feed`` (or ``iter_feed``) gives for ``chunks``, going on after each error with b""."""
    seen: list[Any] = []
    for chunk in chunks + [b""]:
        data = chunk
        for _ in range(len(chunk) + 3):
            taken: list[Any] = []
            try:
                if iterate:
                    for cmd in dec.iter_feed(data):
                        taken.append(cmd)
                else:
                    taken = dec.feed(data)
                seen += taken
                break
            except ProtocolError as err:
                if iterate:
                    assert err.commands == []  # everything before the bad line was given by the iterator
                seen += taken + err.commands
                seen.append(("error", err.reason.split(" (")[0], err.line))
                data = b""
    return seen


@pytest.mark.parametrize("rows", [False, True])
def test_iter_feed_gives_what_feed_gives(wire_impl: ModuleType, rows: bool) -> None:
    assert len(BIG) > 4 * WINDOW
    fed = wire_impl.LineDecoder(rows=rows).feed(BIG)
    dec = wire_impl.LineDecoder(rows=rows)
    taken = list(dec.iter_feed(BIG))
    assert taken == fed and len(taken) == 8000 + len(EXAMPLES)
    assert [c.row for c in taken if isinstance(c, RdataCommand)] == [c.row for c in fed if isinstance(c, RdataCommand)]
    assert dec.buffered == 0


def test_iter_feed_builds_a_window_at_a_time(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    it = dec.iter_feed(BIG)
    assert dec.buffered == len(BIG)  # nothing parsed before the first command is asked for
    first = next(it)
    assert first == RdataCommand("events", "master", 0, ["$ev0", {"k": [0, {"deep": [1, 2]}]}, "text", None])
    assert len(BIG) - WINDOW - 200 < dec.buffered < len(BIG) - WINDOW  # one window (to its line's end) parsed
    held = sys.getrefcount(first)  # the caller's and the window's
    rest = sum(1 for _ in it)
    assert sys.getrefcount(first) == held - 1  # once its window is taken, a command is the caller's alone
    assert rest == 8000 + len(EXAMPLES) - 1 and dec.buffered == 0
    assert list(it) == []  # an ended iterator stays ended


def test_iter_feed_holds_partial_lines_like_feed(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    assert dec.feed(b"PI") == []
    assert list(dec.iter_feed(b"NG 1\nPING 2\nPI")) == [PingCommand("1"), PingCommand("2")]
    assert dec.buffered == 2
    assert list(dec.iter_feed(b"NG 3\n")) == [PingCommand("3")]
    assert list(dec.iter_feed(b"")) == [] and dec.buffered == 0


def test_iter_feed_takes_what_feed_takes(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    assert list(dec.iter_feed(bytearray(b"PING 1\n"))) == [PingCommand("1")]
    assert list(dec.iter_feed(memoryview(b"PING 2\n"))) == [PingCommand("2")]
    with pytest.raises(TypeError, match=r"^LineDecoder\.iter_feed takes bytes as they arrive, not str"):
        dec.iter_feed("PING 3\n")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^LineDecoder\.iter_feed takes bytes, bytearray or memoryview, got int$"):
        dec.iter_feed(3)  # type: ignore[arg-type]
    assert dec.buffered == 0 and list(dec.iter_feed(b"PING 4\n")) == [PingCommand("4")]  # nothing taken in


def test_a_bad_line_ends_the_iterator_after_every_command_before_it(wire_impl: ModuleType) -> None:
    good = BIG[: BIG.index(b"\n", 2 * WINDOW + 100) + 1]  # the bad line lands in the third window
    data = good + b"NOPE\n" + b"PING after\n" * 3
    before = wire_impl.LineDecoder().feed(good)
    dec = wire_impl.LineDecoder()
    it = dec.iter_feed(data)
    taken = []
    with pytest.raises(ProtocolError, match="unknown command") as info:
        for cmd in it:
            taken.append(cmd)
    assert taken == before
    assert info.value.line == b"NOPE" and info.value.commands == []
    assert list(it) == []
    assert dec.buffered == len(b"PING after\n" * 3)  # the bytes after the bad line stay, as with feed
    assert dec.feed(b"") == [PingCommand("after")] * 3


def test_an_overlong_line_in_a_window(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder(max_line_length=100)
    data = b"PING 1\n" * 20000 + b"PING " + b"x" * 200 + b"\nPING 2\n"
    it = dec.iter_feed(data)
    with pytest.raises(ProtocolError, match="longer than 100 bytes"):
        assert sum(1 for _ in it) == 20000
    assert list(dec.iter_feed(b"")) == [PingCommand("2")]


def test_what_an_iterator_left_comes_out_first(wire_impl: ModuleType) -> None:
    # An iterator abandoned half way loses nothing: its built and unparsed commands come out of the next feed
    # (or iterator) first, in order.
    whole = wire_impl.LineDecoder().feed(BIG)
    dec = wire_impl.LineDecoder()
    it = dec.iter_feed(BIG)
    head = [next(it) for _ in range(5)]
    del it
    assert head + dec.feed(b"PING new\n") == whole + [PingCommand("new")]
    dec = wire_impl.LineDecoder()
    it = dec.iter_feed(BIG)
    head = [next(it) for _ in range(3)]
    assert head + list(dec.iter_feed(b"PING new\n")) == whole + [PingCommand("new")]
    dec = wire_impl.LineDecoder()
    first, second = dec.iter_feed(BIG[:WINDOW * 2]), dec.iter_feed(BIG[WINDOW * 2 :])
    assert [next(second), next(first)] == whole[:2]  # two iterators take from one queue
    assert [*second, *first] == whole[2:]


def test_a_bad_line_left_by_an_iterator_is_raised_by_the_next_feed(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder()
    it = dec.iter_feed(b"PING 1\nPING 2\nPING 3\nNOPE\nPING 4\n")
    assert next(it) == PingCommand("1")  # the window is built; its bad line waits behind PING 2 and 3
    with pytest.raises(ProtocolError, match="unknown command") as info:
        dec.feed(b"PING 5\n")
    assert info.value.commands == [PingCommand("2"), PingCommand("3")] and info.value.line == b"NOPE"
    assert dec.feed(b"") == [PingCommand("4"), PingCommand("5")]  # nothing the feed was given is lost


def test_iterated_rows_are_tracked_and_cycles_collected(wire_impl: ModuleType) -> None:
    dec = wire_impl.LineDecoder(max_line_length=1 << 30, rows=True)
    cmds = list(dec.iter_feed(BIG))
    _assert_tracked_as_built(cmds)

    class Probe:
        pass

    probe = Probe()
    cmds[0].row[1]["k"][1]["deep"].append([cmds[0], probe])
    gone = weakref.ref(probe)
    del probe, cmds
    gc.collect()
    assert gone() is None, "a cycle through an iterated row was not collected"


lines = st.sampled_from([line for _, line in EXAMPLES] + [b"NOPE", b"PING " + b"y" * 90, b"", b"RDATA s w 1 [1,"])


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(lines, max_size=12), at=st.lists(st.integers(0, 8000), min_size=12, max_size=12),
       cut=st.integers(0, 400_000), limit=st.integers(60, 200), rows=st.booleans())
def test_iter_feed_and_feed_agree_on_anything(parts: list[bytes], at: list[int], cut: int, limit: int,
                                              rows: bool) -> None:
    # Random lines, good and bad, placed among enough filler to span several windows, the whole given in two
    # pieces: both twins, feed and iter_feed, give the same commands and errors in the same order.
    filler = [b"PING %d" % i for i in range(8000)]
    for line, i in zip(parts, at):
        filler.insert(i, line)
    data = b"".join(line + b"\n" for line in filler)
    chunks = [data[:cut], data[cut:]]
    impls = [PY] + ([_compat.load("_wire", "c")] if _compat.IMPL == "c" else [])
    results = []
    for impl in impls:
        fed = _drain(impl.LineDecoder(max_line_length=limit, rows=rows), chunks, iterate=False)
        iterated = _drain(impl.LineDecoder(max_line_length=limit, rows=rows), chunks, iterate=True)
        assert iterated == fed
        results.append(fed)
    assert all(r == results[0] for r in results)
