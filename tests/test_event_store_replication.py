"""The event store over replication: writer publishes the events stream, a reader follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import synapse_python
from factstream.replication import CacheInvalidator, CacheRegistry, Follower, LocalStream, MemoryPipe, Publisher, ReplicationHub
from factstream.store.database import connect
from factstream.events import EventStore
from factstream.events.replication import attach_reader, attach_writer
from factstream.streams import EventRow, EventsRow


def ev(room: str, n: int, etype: str, sender: str, prev: list[str], depth: int, *, state_key: str | None = None,
       content: dict[str, Any] | None = None) -> bytes:
    d: dict[str, Any] = {"event_id": f"${n}-{room}", "room_id": room, "type": etype, "sender": sender,
                         "prev_events": prev, "depth": depth, "content": content or {}}
    if state_key is not None:
        d["state_key"] = state_key
    return json.dumps(d).encode()


def linear_room(room: str, script: list[tuple[str, str, str | None, dict[str, Any]]]) -> list[bytes]:
    out, prev = [], []
    for i, (etype, sender, sk, content) in enumerate(script, start=1):
        out.append(ev(room, i, etype, sender, prev, i, state_key=sk, content=content))
        prev = [f"${i}-{room}"]
    return out


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/events.db"
    return str(request.getfixturevalue("postgres_dsn"))


@pytest.fixture(params=[False, True], ids=["objects", "through_wire"])
def through_wire(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def test_reader_follows_events_stream_and_answers_new_events(db_url: str, through_wire: bool) -> None:
    wdb = await connect(db_url)
    rdb = await connect(db_url)
    writer = await EventStore.open(wdb)
    try:
        pub = Publisher("master")
        caches_stream = LocalStream("caches", "master")
        pub.add_stream("caches", caches_stream.source, 0)
        caches_stream.add_listener(pub.notify)
        attach_writer(writer, pub, cache_invalidator=CacheInvalidator(caches_stream.write))
        whub = ReplicationHub("master", publisher=pub)

        room_a = linear_room("!a:hs", [
            ("m.room.create", "@a:hs", "", {"creator": "@a:hs"}),
            ("m.room.member", "@a:hs", "@a:hs", {"membership": "join"}),
            ("m.room.history_visibility", "@a:hs", "", {"history_visibility": "joined"}),
            ("m.room.message", "@a:hs", None, {"body": "before b"}),
            ("m.room.member", "@a:hs", "@b:hs", {"membership": "invite"}),
            ("m.room.member", "@b:hs", "@b:hs", {"membership": "join"}),
            ("m.room.message", "@b:hs", None, {"body": "hello"}),
        ])
        await writer.persist_events(room_a[:4])
        since = writer.current_token()

        reader = await EventStore.open(rdb, writer=False, instance_name="reader1")
        fol = Follower(sources={"caches": caches_stream.source}, start_position=0, page_limit=5)
        caches = CacheRegistry()
        fol.add_handler(caches.on_rows, "caches")
        attach_reader(reader, fol, caches=caches)
        seen_rows: list[Any] = []
        fol.add_handler(lambda s, w, t, rows: seen_rows.extend(rows), "events")
        rhub = ReplicationHub("reader1", follower=fol)
        assert reader.current_token() == 0  # told nothing yet: answers nothing
        assert await reader.get_new_events_for_user("@a:hs", 0) == {}

        MemoryPipe(whub, rhub, through_wire=through_wire).connect()
        await fol.wait_for_position("events", "master", since, timeout=5)
        await writer.persist_events(room_a[4:])
        await pub.flush()
        upto = writer.current_token()
        await fol.wait_for_position("events", "master", upto, timeout=5)
        assert reader.current_token() == upto

        for user in ("@a:hs", "@b:hs"):
            for start in (0, since):
                want = await writer.get_new_events_for_user(user, start)
                got = await reader.get_new_events_for_user(user, start)
                assert {r: v.event_ids for r, v in got.items()} == {r: v.event_ids for r, v in want.items()}
        # @b misses only the message sent under "joined" before it was there: the events up
        # to and including the visibility change were "shared" (and @b is joined now)
        got_b = await reader.get_new_events_for_user("@b:hs", 0)
        assert got_b["!a:hs"].event_ids == ["$1-!a:hs", "$2-!a:hs", "$3-!a:hs", "$5-!a:hs", "$6-!a:hs", "$7-!a:hs"]
        # the reader's change caches learnt from the rows: an unrelated room costs no query
        assert reader.room_changes.has_entity_changed("!a:hs", since)
        assert not reader.membership_changes.has_entity_changed("@a:hs", since)
        assert reader.membership_changes.has_entity_changed("@b:hs", since)
        # rows arrived typed in Synapse's shape
        evs = [r.data for r in seen_rows if isinstance(r, EventsRow) and r.type == "ev"]
        assert evs and all(isinstance(e, EventRow) for e in evs)
        assert evs[-1] == EventRow("$7-!a:hs", "!a:hs", "m.room.message", None, None, None, None, False, False)
        kinds = {r.type for r in seen_rows}
        assert kinds == {"ev", "state"}
        # current-state changes went out as cs_cache_fake invalidations on the caches stream
        await fol.wait_for_position("caches", "master", caches_stream.current_token(), timeout=5)
        assert caches.invalidations >= 2  # @b invited, then joined: get_rooms_for_user((@b,))
        await fol.close()
    finally:
        await writer.close()
        await wdb.close()
        await rdb.close()


@pytest.mark.postgres
async def test_two_writers_share_the_stream_orderings(postgres_dsn: str) -> None:
    """Multi-writer: two event persisters (different rooms) draw from one events sequence."""
    from factstream.ids import create_id_generator
    from factstream.events import EventsStreamSource

    dbs = [await connect(postgres_dsn) for _ in range(2)]
    stores = []
    try:
        for name, db in zip(("w1", "w2"), dbs):
            await EventStore.open(db, writer=False)  # migrate before the generators read the tables
            fwd = await create_id_generator(db, stream_name="events", instance_name=name, writers=("w1", "w2"),
                                            tables=(("events", "instance_name", "stream_ordering"),))
            back = await create_id_generator(db, stream_name="backfill", instance_name=name, writers=("w1", "w2"),
                                             tables=(("events", "instance_name", "stream_ordering"),), backwards=True)
            stores.append(await EventStore.open(db, instance_name=name, stream_id_gen=fwd, backfill_id_gen=back))
        rooms = [linear_room(f"!w{i}:hs", [
            ("m.room.create", "@a:hs", "", {"creator": "@a:hs"}),
            ("m.room.member", "@a:hs", "@a:hs", {"membership": "join"}),
            *[("m.room.message", "@a:hs", None, {"body": str(j)}) for j in range(6)],
        ]) for i in range(2)]
        got: dict[str, list[int]] = {"w1": [], "w2": []}
        for k in range(8):
            for store, room in zip(stores, rooms):
                res = await store.persist_event(room[k])
                got[store.instance_name].append(res.stream_ordering)
        all_ids = got["w1"] + got["w2"]
        assert len(set(all_ids)) == 16 and all(ids == sorted(ids) for ids in got.values())
        src = EventsStreamSource(dbs[0])
        for name, room_id in (("w1", "!w0:hs"), ("w2", "!w1:hs")):
            rows, _, _ = await src.get_updates(name, 0, max(all_ids), 1000)
            evs = [r for r in rows if r[1][0] == "ev"]
            assert [t for t, _ in evs] == got[name]
            assert {r[1][1][1] for r in evs} == {room_id}
        # a reader asks up to a position both writers have passed
        reader = await EventStore.open(dbs[0], writer=False, instance_name="reader")
        for name in ("w1", "w2"):
            reader.advance_reader(name, max(got[name]))
        new = await reader.get_new_events_for_user("@a:hs", 0)
        assert sorted(new) == ["!w0:hs", "!w1:hs"]
        upto = reader.current_token()
        assert upto == min(max(got["w1"]), max(got["w2"]))
        assert all(e.stream_ordering <= upto for v in new.values() for e in v.events)
    finally:
        for s in stores:
            await s.stream_id_gen.close()
            await s.backfill_id_gen.close()
        for db in dbs:
            await db.close()


_PARSE_WITH_SYNAPSE = """
import json, sys, attr
from synapse.replication.tcp.streams.events import EventsStream
out = []
for token, row in json.load(sys.stdin):
    parsed = EventsStream.parse_row(row)
    out.append([token, parsed.type, type(parsed.data).__name__, attr.astuple(parsed.data)])
json.dump(out, sys.stdout)
"""


async def test_rows_parse_with_synapse_events_stream(tmp_path: Path) -> None:
    """Synapse's own EventsStream.parse_row reads our rows into the same fields (test-only oracle)."""
    import subprocess

    python = synapse_python()  # the test-only oracle venv (make oracle); fails under CI without it
    from factstream.events import EventsStreamSource

    db = await connect(f"sqlite:///{tmp_path}/events.db")
    store = await EventStore.open(db)
    try:
        room = linear_room("!s:hs", [
            ("m.room.create", "@a:hs", "", {"creator": "@a:hs"}),
            ("m.room.member", "@a:hs", "@a:hs", {"membership": "join"}),
            ("m.room.message", "@a:hs", None, {"body": "x", "m.relates_to": {"event_id": "$1-!s:hs"}}),
        ])
        await store.persist_events(room)
        await store.persist_event(ev("!s:hs", 9, "m.room.redaction", "@a:hs", ["$3-!s:hs"], 4) [:-1]
                                  + b', "redacts": "$3-!s:hs"}', rejected=True)
        rows, _, _ = await EventsStreamSource(db).get_updates("master", 0, store.current_token(), 1000)
    finally:
        await store.close()
        await db.close()
    proc = subprocess.run([python, "-c", _PARSE_WITH_SYNAPSE], input=json.dumps(rows),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout)
    kinds = {"ev": "EventsStreamEventRow", "state": "EventsStreamCurrentStateRow", "state-all": "EventsStreamAllStateRow"}
    assert len(parsed) == len(rows)
    for (token, row), (ptoken, ptype, pclass, fields) in zip(rows, parsed):
        assert (ptoken, ptype, pclass) == (token, row[0], kinds[row[0]])
        assert fields == row[1]
    assert parsed[-1][3][4] == "$3-!s:hs" and parsed[-1][3][7] is True  # redacts, rejected
    assert parsed[2 * 2][3][5] == "$1-!s:hs"  # relates_to of the message
