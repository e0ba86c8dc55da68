"""The transport-independent core: publisher, follower, hub, over an in-memory carrier."""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import Any

import pytest

from factstream import wire
from factstream.commands import (
    CancelTaskCommand,
    ClearUserSyncsCommand,
    FederationAckCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    UserSyncCommand,
)
from factstream.replication import (
    CacheInvalidator,
    CacheRegistry,
    Follower,
    LocalStream,
    MemoryPipe,
    OutboxFull,
    PositionTimeout,
    Publisher,
    ReplicationHub,
    SimpleCache,
)
from factstream.streams import ToDeviceRow
from factstream.replication import MemoryUpdateSource

Got = list[tuple[str, str, int, list[Any]]]


def recorder(fol: Follower) -> Got:
    got: Got = []
    fol.add_handler(lambda s, w, t, rows: got.append((s, w, t, rows)))
    return got


def rd(stream: str, writer: str, token: int | None, row: Any) -> RdataCommand:
    return RdataCommand(stream, writer, token, row)


# ----------------------------------------------------------------- follower alone


async def test_batches_interleaved_from_two_writers_are_delivered_per_writer() -> None:
    fol = Follower(typed=False, positions={("to_device", "w1"): 0, ("to_device", "w2"): 0})
    got = recorder(fol)
    for cmd in [
        rd("to_device", "w1", None, ["a1"]),
        rd("to_device", "w2", None, ["b1"]),
        rd("to_device", "w1", None, ["a2"]),
        rd("to_device", "w2", 7, ["b2"]),
        rd("to_device", "w1", 5, ["a3"]),
    ]:
        fol.on_rdata(cmd)
    assert got == [
        ("to_device", "w2", 7, [["b1"], ["b2"]]),
        ("to_device", "w1", 5, [["a1"], ["a2"], ["a3"]]),
    ]
    assert fol.position("to_device", "w1") == 5 and fol.position("to_device", "w2") == 7


async def test_duplicate_and_stale_rdata_are_dropped() -> None:
    fol = Follower(typed=False, positions={("caches", "m"): 10})
    got = recorder(fol)
    fol.on_rdata(rd("caches", "m", 9, ["old", None, 1]))
    fol.on_rdata(rd("caches", "m", 10, ["same", None, 1]))
    fol.on_rdata(rd("caches", "m", 11, ["new", None, 1]))
    fol.on_rdata(rd("caches", "m", 11, ["dup", None, 1]))
    assert [g[2] for g in got] == [11]
    assert fol.stats["stale_rows"] == 3


async def test_position_without_gap_advances_and_with_gap_fetches_in_order() -> None:
    src = MemoryUpdateSource()
    for t in range(1, 21):
        src.add("m", t, [f"@u{t}:hs"])
    fol = Follower(sources={"to_device": src}, positions={("to_device", "m"): 3}, page_limit=4)
    got = recorder(fol)
    # prev == our position: nothing missed, just advance.
    fol.on_position(PositionCommand("to_device", "m", 3, 5))
    assert fol.position("to_device", "m") == 5 and got == []
    # prev ahead of us: we missed (5, 12]; fetch in pages of 4 while later commands wait.
    fol.on_position(PositionCommand("to_device", "m", 9, 12))
    fol.on_rdata(rd("to_device", "m", 13, ["@u13:hs"]))
    fol.on_rdata(rd("to_device", "m", 12, ["@dup:hs"]))  # stale once the fetch delivered 12
    await fol.wait_for_position("to_device", "m", 13, timeout=2)
    assert [g[2] for g in got] == list(range(6, 14))
    assert got[0][3] == [ToDeviceRow("@u6:hs")]
    assert fol.stats["catchup_fetches"] == 2 and fol.stats["catchup_rows"] == 7


async def test_unknown_pair_starts_live_or_replays() -> None:
    live = Follower(typed=False)
    live.on_rdata(rd("caches", "m", 3, ["x", None, 1]))  # position unknown: dropped
    live.on_position(PositionCommand("caches", "m", 8, 8))
    assert live.position("caches", "m") == 8
    src = MemoryUpdateSource()
    src.add("m", 2, ["a"])
    replay = Follower(typed=False, sources={"to_device": src}, start_position=0)
    got = recorder(replay)
    replay.on_position(PositionCommand("to_device", "m", 8, 8))
    await replay.wait_for_position("to_device", "m", 8, timeout=2)
    assert got == [("to_device", "m", 2, [["a"]])]


async def test_wait_for_position_times_out_with_a_useful_error() -> None:
    fol = Follower()
    with pytest.raises(PositionTimeout, match="stream caches of writer m is at None, not 3"):
        await fol.wait_for_position("caches", "m", 3, timeout=0.05)
    assert isinstance(PositionTimeout("x"), TimeoutError)


async def test_async_iteration_and_unknown_stream(caplog: pytest.LogCaptureFixture) -> None:
    fol = Follower(positions={("mystery", "m"): 0})
    seen = []

    async def consume() -> None:
        async for upd in fol.updates():
            seen.append(upd)
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        fol.on_rdata(rd("mystery", "m", 1, {"any": "thing"}))
        fol.on_rdata(rd("mystery", "m", 2, [1]))
    await asyncio.wait_for(task, 1)
    assert [(u.token, u.rows) for u in seen] == [(1, [{"any": "thing"}]), (2, [[1]])]
    assert "unknown stream 'mystery'" in caplog.text


async def test_a_failing_handler_does_not_stop_delivery() -> None:
    fol = Follower(typed=False, positions={("caches", "m"): 0})

    def boom(*a: Any) -> None:
        raise RuntimeError("handler bug")

    fol.add_handler(boom)
    got = recorder(fol)
    fol.on_rdata(rd("caches", "m", 1, ["x", None, 1]))
    assert len(got) == 1 and fol.position("caches", "m") == 1


async def test_partial_batch_of_a_lost_connection_is_discarded() -> None:
    fol = Follower(typed=False, positions={("caches", "m"): 0})
    got = recorder(fol)
    conn = object()
    fol.on_rdata(rd("caches", "m", None, ["half", None, 1]), conn)
    fol.connection_lost(conn)
    fol.on_rdata(rd("caches", "m", 4, ["whole", None, 1]))
    assert got == [("caches", "m", 4, [["whole", None, 1]])]


# ----------------------------------------------------------------- publisher


class Collect:
    def __init__(self) -> None:
        self.cmds: list[Any] = []

    def __call__(self, cmds: list[Any]) -> None:
        self.cmds.extend(cmds)

    def lines(self) -> list[str]:
        return [wire.encode(c).decode() for c in self.cmds]


async def test_publisher_sends_rows_batches_and_positions_for_holes() -> None:
    ls = LocalStream("to_device", "m")
    pub = Publisher("m")
    pub.add_stream("to_device", ls.source, ls.current_token())
    ls.add_listener(pub.notify)
    out = Collect()
    pub.add_sink(out)
    ls.write([["@a"]])
    ls.write([["@b"], ["@c"]])
    t1, t2, t3 = ls.reserve(), ls.reserve(), ls.reserve()
    ls.complete(t2, [["@e"]])   # waits for t1
    ls.complete(t1, None)       # rollback: a hole; position jumps to t2
    ls.complete(t3, None)       # trailing hole: POSITION only
    assert out.lines() == [
        'RDATA to_device m 1 ["@a"]',
        'RDATA to_device m batch ["@b"]',
        'RDATA to_device m 2 ["@c"]',
        'RDATA to_device m 4 ["@e"]',
        "POSITION to_device m 4 5",
    ]
    assert pub.position_commands() == [PositionCommand("to_device", "m", 5, 5)]


def _publishing(relay: ModuleType, page_limit: int = 1000) -> tuple[LocalStream, Publisher, Collect]:
    ls = LocalStream("to_device", "m", source=MemoryUpdateSource(relay=relay), relay=relay)
    assert type(ls._core).__module__ == relay.__name__
    pub = Publisher("m", relay=relay, page_limit=page_limit)
    pub.add_stream("to_device", ls.source, ls.current_token())
    ls.add_listener(pub.notify)
    out = Collect()
    pub.add_sink(out)
    return ls, pub, out


async def test_write_many_publishes_what_one_write_per_fact_publishes(relay_impl: ModuleType) -> None:
    facts: list[list[Any]] = [[["@a"]], [["@b"], ["@c"]], [], [["@d"]], [["@e"], ["@f"], ["@g"]], []]
    one, _, one_out = _publishing(relay_impl)
    tokens = [one.write(f) for f in facts]
    many, pub, many_out = _publishing(relay_impl, page_limit=2)  # several pages, a token never split
    heard: list[tuple[int, int]] = []
    many.add_listener(lambda s, w, old, new: heard.append((old, new)))
    assert many.write_many(iter(facts)) == tokens[-1] == 6
    # One write per fact closes the hole at 3 with a POSITION of its own; in a run the next row's token does.
    assert [line for line in one_out.lines() if line != "POSITION to_device m 2 3"] == many_out.lines() == [
        'RDATA to_device m 1 ["@a"]',
        'RDATA to_device m batch ["@b"]',
        'RDATA to_device m 2 ["@c"]',
        'RDATA to_device m 4 ["@d"]',
        'RDATA to_device m batch ["@e"]',
        'RDATA to_device m batch ["@f"]',
        'RDATA to_device m 5 ["@g"]',
        "POSITION to_device m 5 6",
    ]
    assert heard == [(0, 6)]  # one advance for the whole run
    assert many.current_token() == 6 and pub.positions() == {"to_device": 6}
    assert many.write_many([]) == 6 and heard == [(0, 6)]
    assert many.write([["@h"]]) == 7


async def test_write_many_behind_a_reservation_waits_for_it(relay_impl: ModuleType) -> None:
    ls, _, out = _publishing(relay_impl)
    t1 = ls.reserve()
    assert ls.write_many([[["@a"]], [["@b"]]]) == 3
    assert out.lines() == [] and ls.current_token() == 0
    ls.complete(t1, [["@z"]])
    assert out.lines() == ['RDATA to_device m 1 ["@z"]', 'RDATA to_device m 2 ["@a"]', 'RDATA to_device m 3 ["@b"]']


async def test_write_many_announces_the_facts_written_before_a_failing_one(relay_impl: ModuleType) -> None:
    ls, _, out = _publishing(relay_impl)

    def bad() -> Any:
        raise RuntimeError("the application's rows failed")
        yield

    with pytest.raises(RuntimeError, match="rows failed"):
        ls.write_many([[["@a"]], bad(), [["@never"]]])
    assert ls.current_token() == 1
    assert out.lines() == ['RDATA to_device m 1 ["@a"]']
    assert ls.write([["@b"]]) == 3  # the failed fact's token stays used (a hole), as write() leaves its token
    assert out.lines()[1:] == ['RDATA to_device m 3 ["@b"]']


class SlowSource:
    """An async update source (like a database table) that counts its calls."""

    def __init__(self, inner: MemoryUpdateSource) -> None:
        self.inner = inner
        self.calls = 0

    async def get_updates(self, instance: str, start: int, upto: int, limit: int) -> Any:
        self.calls += 1
        await asyncio.sleep(0.001)
        return self.inner.get_updates_now(instance, start, upto, limit)


async def test_publisher_drains_async_sources_in_pages() -> None:
    mem = MemoryUpdateSource()
    src = SlowSource(mem)
    pub = Publisher("m", page_limit=3)
    pub.add_stream("caches", src, 0)
    out = Collect()
    pub.add_sink(out)
    for t in range(1, 11):
        mem.add("m", t, ["c", [str(t)], 0])
    pub.notify("caches", "m", 0, 10)
    pub.notify("caches", "other", 0, 99)  # another writer's stream: not ours to publish
    await pub.flush()
    assert [c.token for c in out.cmds] == list(range(1, 11))
    assert src.calls == 4


# ----------------------------------------------------------------- hub over a pipe


def writer_hub(name: str = "m") -> tuple[ReplicationHub, LocalStream]:
    ls = LocalStream("to_device", name)
    pub = Publisher(name)
    pub.add_stream("to_device", ls.source, 0)
    ls.add_listener(pub.notify)
    return ReplicationHub(name, publisher=pub), ls


@pytest.mark.parametrize("through_wire", [False, True])
async def test_end_to_end_over_a_pipe_with_reconnect_and_catch_up(through_wire: bool) -> None:
    whub, ls = writer_hub()
    for i in range(5):
        ls.write([[f"@before{i}"]])
    fol = Follower(sources={"to_device": ls.source}, start_position=0, page_limit=2)
    got = recorder(fol)
    rhub = ReplicationHub("r", follower=fol)
    pipe = MemoryPipe(whub, rhub, through_wire=through_wire).connect()
    await fol.wait_for_position("to_device", "m", 5, timeout=2)
    ls.write([["@live1"], ["@live2"]])
    await fol.wait_for_position("to_device", "m", 6, timeout=2)
    pipe.close("cut")
    for i in range(7):
        ls.write([[f"@offline{i}"]])
    pipe = MemoryPipe(whub, rhub, through_wire=through_wire).connect()
    ls.write([["@after"]])
    await fol.wait_for_position("to_device", "m", 14, timeout=2)
    tokens = [g[2] for g in got]
    assert tokens == list(range(1, 15))
    assert sum(len(g[3]) for g in got) == 15


async def test_user_sync_is_tracked_per_connection_and_resent_after_reconnect() -> None:
    whub, _ = writer_hub()
    cleared: list[str] = []
    synced: list[UserSyncCommand] = []
    whub.on("USER_SYNC", lambda cmd, conn: synced.append(cmd))
    whub.on("CLEAR_USER_SYNC", lambda cmd, conn: cleared.append(cmd.instance_id))
    rhub = ReplicationHub("r", follower=Follower())
    rhub.user_sync("@a:hs", "DEV", True, 1)  # disconnected: queued in the outbox
    assert rhub.outbox_size == 1
    pipe = MemoryPipe(whub, rhub).connect()
    rhub.user_sync("@b:hs", None, True, 2)
    await asyncio.sleep(0.01)
    assert whub.syncing_users() == {"r": {("@a:hs", "DEV"), ("@b:hs", None)}}
    pipe.close()
    assert whub.syncing_users() == {} and cleared == ["r"]
    MemoryPipe(whub, rhub).connect()
    await asyncio.sleep(0.01)
    assert whub.syncing_users() == {"r": {("@a:hs", "DEV"), ("@b:hs", None)}}
    rhub.user_sync("@b:hs", None, False, 3)
    await asyncio.sleep(0.01)
    assert whub.syncing_users() == {"r": {("@a:hs", "DEV")}}
    rhub.clear_user_syncs()
    await asyncio.sleep(0.01)
    assert whub.syncing_users() == {}
    assert cleared == ["r", "r"]
    assert isinstance(synced[0], UserSyncCommand)


async def test_other_commands_reach_typed_handlers_and_the_outbox_is_bounded() -> None:
    whub, _ = writer_hub()
    seen: list[Any] = []
    for name in ("FEDERATION_ACK", "REMOTE_SERVER_UP", "CANCEL_TASK"):
        whub.on(name, lambda cmd, conn: seen.append(cmd))
    rhub = ReplicationHub("r", follower=Follower(), max_outbox=2)
    rhub.send(FederationAckCommand("r", 7))
    rhub.send(RemoteServerUpCommand("other.hs"))
    with pytest.raises(OutboxFull, match="2 commands are already queued"):
        rhub.send(CancelTaskCommand("t1"))
    MemoryPipe(whub, rhub, through_wire=True).connect()
    rhub.send(CancelTaskCommand("t1"))
    await asyncio.sleep(0.01)
    assert seen == [FederationAckCommand("r", 7), RemoteServerUpCommand("other.hs"), CancelTaskCommand("t1")]
    assert rhub.outbox_size == 0


async def test_cache_invalidation_reaches_reader_caches() -> None:
    ls = LocalStream("caches", "m")
    pub = Publisher("m")
    pub.add_stream("caches", ls.source, 0)
    ls.add_listener(pub.notify)
    whub = ReplicationHub("m", publisher=pub)
    fol = Follower(sources={"caches": ls.source}, start_position=0)
    caches = CacheRegistry()
    users, rooms, members = SimpleCache(), SimpleCache(), SimpleCache()
    caches.register("get_user_by_id", users)
    caches.register("get_rooms_for_user", members)
    caches.register("get_current_state_ids", rooms)
    caches.register_current_state(per_room=["get_current_state_ids"], per_member=["get_rooms_for_user"])
    fol.add_handler(caches.on_rows, "caches")
    MemoryPipe(whub, ReplicationHub("r", follower=fol), through_wire=True).connect()
    users.update({("@bob:hs",): 1, ("@ann:hs",): 2})
    rooms.update({("!r:hs",): 1, ("!s:hs",): 2})
    members.update({("@bob:hs",): 1, ("@ann:hs",): 2})
    inv = CacheInvalidator(ls.write)
    inv.invalidate("get_user_by_id", ["@bob:hs"])
    inv.invalidate_many([("cs_cache_fake", ["!r:hs", "@ann:hs"]), ("unknown_cache", ["x"])])
    token = inv.invalidate("get_user_by_id", None)
    await fol.wait_for_position("caches", "m", token, timeout=2)
    assert users == {}
    assert rooms == {("!s:hs",): 2}
    assert members == {("@bob:hs",): 1}


async def test_clear_user_sync_from_handler_order() -> None:
    # CLEAR_USER_SYNC handlers get typed commands even when synthesised on disconnect.
    whub, _ = writer_hub()
    got: list[Any] = []
    whub.on("CLEAR_USER_SYNC", lambda cmd, conn: got.append((cmd, conn)))
    rhub = ReplicationHub("r2", follower=Follower())
    pipe = MemoryPipe(whub, rhub).connect()
    rhub.user_sync("@a:hs", None, True, 1)
    await asyncio.sleep(0.01)
    pipe.close()
    assert got == [(ClearUserSyncsCommand("r2"), None)]


@pytest.mark.parametrize("kwargs", [{"page_limit": 0}, {"trust_window": -1}, {"verify_grace": -0.5},
                                    {"start_position": -3}])
def test_a_follower_refuses_options_that_cannot_work(kwargs: dict[str, Any]) -> None:
    """A page of 0 rows asked its source for the same nothing forever: refused when the follower is made."""
    (name,) = kwargs
    with pytest.raises(ValueError, match=f"{name} must be"):
        Follower(**kwargs)


def test_a_publisher_refuses_a_page_of_no_rows() -> None:
    with pytest.raises(ValueError, match="page_limit must be at least 1, got 0"):
        Publisher("w", page_limit=0)
    pub = Publisher("w")
    with pytest.raises(ValueError, match="page_limit must be at least 1"):
        pub.page_limit = 0
    assert pub.page_limit == 1000
