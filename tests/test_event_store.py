"""Event store behaviour, one suite on SQLite and PostgreSQL (see also test_event_store_model.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from factstream.events import (
    EventNotFound,
    EventsStreamSource,
    EventStore,
    InvalidEvent,
    RoomsToken,
    StateUnknown,
    StreamToken,
    TokenError,
    TopologicalToken,
    parse_event,
)
from factstream.events.state_groups import base_height
from factstream.events.tokens import RoomsToken as _RT  # noqa: F401  (public path check)

ROOM = "!room:hs"


@pytest.fixture
def db(engine_db: Any) -> Any:
    """An empty database of each engine (conftest's engine_db; conftest's ``store`` is an EventStore on it)."""
    return engine_db


class Room:
    """Builds a linear (or forked) room's events as JSON bytes."""

    def __init__(self, room_id: str = ROOM) -> None:
        self.room_id = room_id
        self.n = 0
        self.depth: dict[str, int] = {}
        self.tip: list[str] = []

    def ev(self, etype: str, sender: str, content: Mapping[str, Any] | None = None, *,
           state_key: str | None = None, prevs: Sequence[str] | None = None, **extra: Any) -> bytes:
        self.n += 1
        eid = f"${self.n}-{self.room_id}"
        prevs = list(self.tip if prevs is None else prevs)
        d = max((self.depth.get(p, 0) for p in prevs), default=0) + 1
        self.depth[eid] = d
        obj: dict[str, Any] = {"event_id": eid, "room_id": self.room_id, "type": etype, "sender": sender,
                               "prev_events": prevs, "depth": d, "content": dict(content or {})}
        if state_key is not None:
            obj["state_key"] = state_key
        obj.update(extra)
        self.tip = [eid]
        return json.dumps(obj).encode()

    def create(self, creator: str = "@a:hs") -> list[bytes]:
        return [self.ev("m.room.create", creator, {"creator": creator}, state_key=""),
                self.member(creator, "join")]

    def member(self, user: str, membership: str, sender: str | None = None, **kw: Any) -> bytes:
        return self.ev("m.room.member", sender or user, {"membership": membership}, state_key=user, **kw)

    def msg(self, sender: str, body: str = "hi", **kw: Any) -> bytes:
        return self.ev("m.room.message", sender, {"msgtype": "m.text", "body": body}, **kw)

    @staticmethod
    def eid(raw: bytes) -> str:
        return str(json.loads(raw)["event_id"])


# ----------------------------------------------------------------- pure parts


def test_tokens_round_trip_and_reject_garbage() -> None:
    for tok in (StreamToken(5), TopologicalToken(3, -7), RoomsToken(10, 4, "!a~b:hs")):
        assert type(tok).parse(str(tok)) == tok
    assert str(TopologicalToken(3, -7)) == "t3--7"
    for cls, bad in ((StreamToken, "t1-2"), (TopologicalToken, "s5"), (RoomsToken, "r1~x~!a")):
        with pytest.raises(TokenError):
            cls.parse(bad)


def test_base_height_keeps_chains_logarithmic() -> None:
    for h in range(1, 5000):
        hops, x = 0, h
        while x:
            x = base_height(x)
            hops += 1
        assert hops == bin(h).count("1") <= 13


def test_parse_event_reads_columns_and_rejects_bad_input() -> None:
    raw = json.dumps({"event_id": "$e", "room_id": "!r", "type": "m.room.member", "sender": "@a",
                      "state_key": "@b", "depth": 4, "prev_events": [["$p", {"sha256": "x"}]],
                      "content": {"membership": "invite", "m.relates_to": {"event_id": "$t"}}})
    f = parse_event(raw)
    assert (f.membership, f.prev_events, f.relates_to, f.state_key) == ("invite", ("$p",), "$t", "@b")
    with pytest.raises(InvalidEvent, match="room_id"):
        parse_event(b'{"event_id": "$e", "type": "x", "sender": "@a"}')
    with pytest.raises(InvalidEvent, match="not valid JSON"):
        parse_event(b"{nope")


# ----------------------------------------------------------------- requirement 1: lossless


async def test_json_returned_byte_for_byte(store: EventStore) -> None:
    room = Room()
    await store.persist_events(room.create())
    raw = (b'{ "type" :"m.room.message",\n\t"room_id":"!room:hs", "sender":"@a:hs", "depth": 3,'
           b' "prev_events":["$2-!room:hs"], "event_id":"$odd",'
           b' "content":{"body":"caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\/", "z":1, "a":[1.50, 2e3]},'
           b' "signatures":{"hs":{"ed25519:a":"c2ln"}}}  ')
    await store.persist_event(raw)
    assert await store.get_event_json("$odd") == raw
    with pytest.raises(EventNotFound):
        await store.get_event_json("$missing")


async def test_redacted_event_is_pruned_but_raw_kept(store: EventStore) -> None:
    room = Room()
    await store.persist_events(room.create())
    target = room.msg("@a:hs", "secret")
    redaction = room.ev("m.room.redaction", "@a:hs", {}, redacts=room.eid(target))
    await store.persist_events([target, redaction])
    pruned = json.loads(await store.get_event_json(room.eid(target)))
    assert pruned["content"] == {} and pruned["type"] == "m.room.message"
    assert await store.get_event_json(room.eid(target), prune_redacted=False) == target
    # membership survives pruning
    m = room.member("@b:hs", "join", displayname="B")
    await store.persist_events([m, room.ev("m.room.redaction", "@a:hs", {}, redacts=room.eid(m))])
    assert json.loads(await store.get_event_json(room.eid(m)))["content"] == {"membership": "join"}


# ----------------------------------------------------------------- requirement 2: state groups


async def test_state_groups_share_and_chain_lengths_stay_short(store: EventStore, db: Any) -> None:
    room = Room()
    await store.persist_events(room.create())
    batch = []
    for i in range(300):
        batch.append(room.member(f"@u{i % 40}:hs", "join" if i % 3 else "leave"))
        batch.append(room.msg("@a:hs"))
    res = await store.persist_events(batch)
    # a message shares the group of the state before it
    for st_ev, msg in zip(res[0::2], res[1::2]):
        assert msg.state_group == msg.state_group_before == st_ev.state_group
    rows = await db.fetchall("SELECT id, base_group FROM state_groups")
    base = {r[0]: r[1] for r in rows}
    longest = 0
    for g in base:
        hops = 0
        while g is not None:
            g = base[g]
            hops += 1
        longest = max(longest, hops)
    assert longest <= 10  # popcount of heights below 512
    state = await store.get_state_at(res[-1].event_id)
    assert len(state) == 2 + 40  # create, @a's join, 40 users
    # every group along the way reads back exactly (cold, through the delta chains)
    store.groups.forget()
    expected = {k: v for k, v in state.items() if k[1] in ("", "@a:hs")}
    for i, (raw, r) in enumerate(zip(batch, res)):
        d = json.loads(raw)
        if "state_key" in d:
            expected[(d["type"], d["state_key"])] = d["event_id"]
        if i % 6 == 0 or r is res[-1]:
            assert await store.get_state_at(r.event_id) == expected


async def test_storage_grows_with_changes_not_room_size(store: EventStore, db: Any) -> None:
    async def rows() -> int:
        r = await db.fetchone("SELECT COUNT(*) FROM state_group_deltas")
        return int(r[0])

    growth = {}
    for size in (40, 320):
        room = Room(f"!size{size}:hs")
        await store.persist_events(room.create())
        await store.persist_events([room.member(f"@m{i}:hs", "join") for i in range(size)])
        before = await rows()
        flips = [room.member(f"@m{i % 10}:hs", "leave" if (i // 10) % 2 == 0 else "join") for i in range(128)]
        await store.persist_events(flips)
        growth[size] = (await rows()) - before
    # 128 changes: about 128 * log2(height) / 2 rows each time, whatever the room size
    # (plus at most one full snapshot per power-of-two height crossed)
    assert growth[320] < growth[40] * 2 + 2 * 320
    assert growth[40] < 128 * 12


async def test_outliers_have_no_state_and_rejected_events_change_nothing(store: EventStore) -> None:
    room = Room()
    await store.persist_events(room.create())
    good = room.ev("m.room.topic", "@a:hs", {"topic": "ok"}, state_key="")
    bad = room.ev("m.room.topic", "@a:hs", {"topic": "evil"}, state_key="", prevs=[room.eid(good)])
    await store.persist_event(good)
    await store.persist_event(bad, rejected=True)
    assert (await store.get_state_at(room.eid(bad)))[("m.room.topic", "")] == room.eid(good)
    assert (await store.get_current_state(ROOM))[("m.room.topic", "")] == room.eid(good)
    oob = Room("!far:hs").member("@a:hs", "invite", sender="@x:remote", prevs=["$unknown"])
    await store.persist_event(oob, outlier=True)
    with pytest.raises(StateUnknown):
        await store.get_state_at(Room.eid(oob))
    new = await store.get_new_events_for_user("@a:hs", 0)
    assert new["!far:hs"].event_ids == [Room.eid(oob)]


async def test_fork_resolution_is_pluggable(db: Any) -> None:
    def smallest_id(room_id: str, states: Sequence[Mapping[Any, str]], depths: Mapping[str, int]) -> dict:
        out: dict[Any, str] = {}
        for s in states:
            for k, v in s.items():
                out[k] = min(out.get(k, v), v)
        return out

    results = {}
    for name, resolver in (("default", None), ("custom", smallest_id)):
        store = await EventStore.open(db, resolver=resolver, instance_name=f"w-{name}")
        room = Room(f"!fork-{name}:hs")
        base = room.create()
        await store.persist_events(base)
        fork = room.tip
        a = room.ev("m.room.topic", "@a:hs", {"topic": "A"}, state_key="", prevs=fork)
        a2 = room.msg("@a:hs", prevs=[room.eid(a)])
        b = room.ev("m.room.topic", "@a:hs", {"topic": "B"}, state_key="", prevs=fork)
        merge = room.msg("@a:hs", prevs=[room.eid(a2), room.eid(b)])
        await store.persist_events([a, a2, b, merge])
        results[name] = ((await store.get_state_at(room.eid(merge)))[("m.room.topic", "")], room.eid(a),
                         room.eid(b))
        await store.close()
    # default: a is at the same depth as b: greatest event_id wins; custom: smallest
    _, a_id, b_id = results["default"]
    assert results["default"][0] == max(a_id, b_id)
    assert results["custom"][0] == min(results["custom"][1:])


# ----------------------------------------------------------------- requirement 4: change caches


async def test_change_caches_skip_unchanged_rooms(store: EventStore, db: Any) -> None:
    rooms = [Room(f"!c{i}:hs") for i in range(20)]
    for r in rooms:
        await store.persist_events(r.create() + [r.member("@u:hs", "join"), r.msg("@a:hs")])
    since = store.current_token()
    await store.persist_event(rooms[7].msg("@a:hs", "new"))
    calls = 0
    real = db.fetchall

    async def counting(sql: str, params: Any = ()) -> Any:
        nonlocal calls
        calls += 1
        return await real(sql, params)

    db.fetchall = counting
    try:
        with_caches = await store.get_new_events_for_user("@u:hs", since)
        q_cached, calls = calls, 0
        without = await store.get_new_events_for_user("@u:hs", since, use_caches=False)
        q_uncached = calls
    finally:
        del db.fetchall
    assert {k: v.event_ids for k, v in with_caches.items()} == {k: v.event_ids for k, v in without.items()}
    assert list(with_caches) == ["!c7:hs"]
    assert q_cached <= 2 and q_uncached >= 20


# ----------------------------------------------------------------- requirement 8 + replication rows


async def test_backfill_takes_negative_orderings_and_is_never_new(store: EventStore, db: Any) -> None:
    room = Room()
    await store.persist_events(room.create())
    fork = room.tip
    since = store.current_token()
    old = room.msg("@a:hs", "from the past", prevs=fork)
    res = await store.persist_event(old, backfilled=True)
    assert res.stream_ordering < 0
    assert await store.get_new_events_for_user("@a:hs", since) == {}
    updates, _, _ = await EventsStreamSource(db).get_updates("master", 0, store.current_token(), 1000)
    assert room.eid(old) not in {u[1][1][0] for u in updates if u[1][0] == "ev"}
    evs, _ = await store.paginate_backwards(ROOM, "@a:hs", None, 10)
    assert room.eid(old) in [e.event_id for e in evs]


async def test_stream_rows_page_on_token_boundaries_and_collapse_big_state(store: EventStore, db: Any) -> None:
    room = Room()
    await store.persist_events(room.create())
    await store.persist_events([room.member(f"@m{i}:hs", "join") for i in range(160)])
    src = EventsStreamSource(db)
    upto = store.current_token()
    full, _, limited = await src.get_updates("master", 0, upto, 100_000)
    assert not limited
    kinds = [u[1][0] for u in full]
    assert kinds.count("state-all") == 1 and kinds.count("state") == 0 and kinds.count("ev") == 162
    assert [u for u in full if u[1][0] == "state-all"][0][1] == ["state-all", [ROOM]]
    # paged: the union of pages is every ev row, in order, with no token split
    got, pos = [], 0
    while True:
        page, pos2, lim = await src.get_updates("master", pos, upto, 20)
        got += [u for u in page if u[1][0] == "ev"]
        pos = pos2
        if not lim:
            break
    assert got == [u for u in full if u[1][0] == "ev"]
    # the row shape is Synapse's: 9 fields, booleans last
    ev = full[0][1][1]
    assert len(ev) == 9 and ev[7] is False and ev[8] is False


async def test_reader_answers_only_up_to_its_known_position(store: EventStore, db: Any) -> None:
    room = Room()
    await store.persist_events(room.create())
    reader = await EventStore.open(db, writer=False, instance_name="reader1")
    known = reader.current_token()
    later = await store.persist_event(room.msg("@a:hs", "after"))
    got = await reader.get_new_events_for_user("@a:hs", 0)
    assert later.event_id not in [e for v in got.values() for e in v.event_ids]
    from factstream.errors import FactstreamError

    with pytest.raises(FactstreamError, match="beyond"):
        await reader.get_new_events_for_user("@a:hs", 0, later.stream_ordering)
    updates, _, _ = await EventsStreamSource(db).get_updates("master", known, later.stream_ordering, 100)
    for tok, row in updates:
        reader.on_events_rows("master", tok, [row])
    reader.advance_reader("master", later.stream_ordering)
    got = await reader.get_new_events_for_user("@a:hs", known)
    assert got[ROOM].event_ids == [later.event_id]
