"""The event store as a new user meets it: mistakes named, faults that lose nothing (SQLite and PostgreSQL).

Each test here failed before its fix: events persisted inside an open transaction
were announced before they committed; a commit whose answer was cut off hid the
room from the writer's cached "new events"; ids with NUL were stored by SQLite
and refused by PostgreSQL with a driver error; a str event broke every read of
its room on SQLite; a child given before its parent in one batch got the empty
state; a locked SQLite file gave the driver's bare error; close() did not wait
for a running persist.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from factstream.errors import FactstreamError
from factstream.events import EventStore, InvalidEvent, NewEvent, StreamToken, TokenError, TopologicalToken
from factstream.store.database import DatabaseUnavailable, connect

ROOM = "!probe:hs"


def ev(eid: str, prevs: Sequence[str], depth: int, etype: str = "m.room.message", *, room: str = ROOM,
       sender: str = "@a:hs", state_key: str | None = None, content: dict[str, Any] | None = None) -> bytes:
    obj: dict[str, Any] = {"event_id": eid, "room_id": room, "type": etype, "sender": sender,
                           "prev_events": list(prevs), "depth": depth, "content": content or {}}
    if state_key is not None:
        obj["state_key"] = state_key
    return json.dumps(obj).encode()


def room_start() -> list[bytes]:
    return [ev("$create", [], 1, "m.room.create", state_key="", content={"creator": "@a:hs"}),
            ev("$join", ["$create"], 2, "m.room.member", state_key="@a:hs", content={"membership": "join"})]


# ``store``: conftest's EventStore on an empty database of each engine.


async def test_persist_inside_an_open_transaction_is_refused(store: EventStore) -> None:
    """Joined to the caller's transaction, the events' ids completed (and the events stream moved
    past them) before that transaction committed: a reader fetching meanwhile skipped them for good."""
    await store.persist_events(room_start())
    before = store.current_token()
    async with store.db.transaction():
        with pytest.raises(FactstreamError, match="own transaction"):
            await store.persist_event(ev("$inner", ["$join"], 3))
        assert store.current_token() == before
    assert await store.db.fetchone("SELECT 1 FROM events WHERE event_id = '$inner'") is None
    res = await store.persist_event(ev("$inner", ["$join"], 3))  # outside: as usual
    assert store.current_token() == res.stream_ordering


class CommitCutter:
    """A TCP proxy to PostgreSQL that, once armed, lets a COMMIT through and cuts the link
    before its answer: the transaction is committed, the client only learns the link died."""

    def __init__(self) -> None:
        self.armed = False
        self.cuts = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._links:
            w.transport.abort()
        await self._server.wait_closed()

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", 5432)
        self._links += [cw, uw]

        async def up() -> None:
            while data := await cr.read(65536):
                uw.write(data)
                await uw.drain()
            uw.transport.abort()

        async def down() -> None:
            while data := await ur.read(65536):
                # CommandComplete "COMMIT": the server has committed; drop its answer and the link.
                if self.armed and b"C\x00\x00\x00\x0bCOMMIT\x00" in data:
                    self.armed = False
                    self.cuts += 1
                    cw.transport.abort()
                    uw.transport.abort()
                    return
                cw.write(data)
                await cw.drain()
            cw.transport.abort()

        await asyncio.gather(up(), down(), return_exceptions=True)


@pytest.mark.postgres
async def test_commit_cut_off_after_committing_still_shows_the_event(postgres_dsn: str) -> None:
    """The commit went through but its answer was lost: persist raises, the retry finds a duplicate,
    and the writer's cached "new events" used to skip the room (its change cache was never told)."""
    proxy = CommitCutter()
    await proxy.start()
    db = await connect(postgres_dsn.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"))
    store = await EventStore.open(db)
    try:
        await store.persist_events(room_start())
        since = store.current_token()
        proxy.armed = True
        with pytest.raises(DatabaseUnavailable):
            await store.persist_event(ev("$cut", ["$join"], 3))
        assert proxy.cuts == 1
        again = await store.persist_event(ev("$cut", ["$join"], 3))
        assert again.duplicate  # it was committed
        uncached = await store.get_new_events_for_user("@a:hs", since, use_caches=False)
        cached = await store.get_new_events_for_user("@a:hs", since)
        assert uncached[ROOM].event_ids == ["$cut"]
        assert {r: v.event_ids for r, v in cached.items()} == {ROOM: ["$cut"]}
    finally:
        await store.close()
        await db.close()
        await proxy.stop()


BAD_EVENTS = [
    (ev("$nul\x00id", ["$join"], 3), "NUL"),
    (ev("$nulsender", ["$join"], 3, sender="@a\x00:hs"), "NUL"),
    (ev("$nulkey", ["$join"], 3, "m.room.topic", state_key="\x00"), "NUL"),
    (ev("$nulprev", ["$join", "$x\x00"], 3), "NUL"),
    (ev("$nulmember", ["$join"], 3, "m.room.member", state_key="@b:hs", content={"membership": "jo\x00in"}), "NUL"),
    (b'{"event_id":"$sur\\ud800","room_id":"!probe:hs","type":"m","sender":"@a:hs","content":{}}', "surrogate"),
    (ev("", ["$join"], 3), "empty"),
    (ev("$noroom", ["$join"], 3, room=""), "empty"),
    (ev("$deep", ["$join"], 2 ** 70), "64-bit"),
    (b'{"event_id":"$nest","room_id":"!probe:hs","type":"m","sender":"@a:hs","content":'
     + b"[" * 200_000 + b"]" * 200_000 + b"}", "nests"),
    ('{"event_id":"$u16","room_id":"!probe:hs","type":"m","sender":"@a:hs","content":{}}'.encode("utf-16"), "UTF-8"),
]


async def test_malformed_events_are_refused_alike_on_both_engines(store: EventStore) -> None:
    """SQLite stored NUL ids that PostgreSQL refused with psycopg's DataError; a lone surrogate,
    a depth past 64 bits or deep nesting raised UnicodeEncodeError, OverflowError or RecursionError."""
    await store.persist_events(room_start())
    for raw, words in BAD_EVENTS:
        with pytest.raises(InvalidEvent, match=words):
            await store.persist_event(raw)
        with pytest.raises(InvalidEvent, match=words):  # and the whole batch with it: nothing half-stored
            await store.persist_events([ev("$fine", ["$join"], 3), raw])
    rows = await store.db.fetchall("SELECT event_id FROM events ORDER BY stream_ordering")
    assert [r[0] for r in rows] == ["$create", "$join"]
    ok = await store.persist_event(ev("$fine", ["$join"], 3, content={"body": "a\x00b \ud83d\ude00"}))
    assert store.current_token() == ok.stream_ordering  # NUL and emoji inside content are fine (escaped)


async def test_event_given_as_str_reads_back(store: EventStore) -> None:
    """A str event went into SQLite's BLOB column as TEXT; every read of the room then raised
    'string argument without an encoding'."""
    await store.persist_events(room_start())
    text = '{"event_id":"$str","room_id":"!probe:hs","type":"m.room.message","sender":"@a:hs",' \
           '"prev_events":["$join"],"depth":3,"content":{"body":"é"}}'
    await store.persist_event(text)  # type: ignore[arg-type]
    assert await store.get_event_json("$str") == text.encode("utf-8")
    new = await store.get_new_events_for_user("@a:hs", 0)
    assert new[ROOM].event_ids == ["$create", "$join", "$str"]
    assert new[ROOM].events[-1].json == text.encode("utf-8")


async def test_child_before_parent_in_one_batch(store: EventStore) -> None:
    """The child was persisted as if its parent were unknown: empty state, hidden from the room."""
    await store.persist_events(room_start())
    child = ev("$child", ["$parent"], 4)
    parent = ev("$parent", ["$join"], 3, "m.room.topic", state_key="", content={"topic": "t"})
    res = await store.persist_events([child, parent])
    assert [r.event_id for r in res] == ["$child", "$parent"]  # results in the order given
    assert res[1].stream_ordering < res[0].stream_ordering  # persisted parent first
    state = await store.get_state_at("$child", after=False)
    assert state[("m.room.member", "@a:hs")] == "$join" and state[("m.room.topic", "")] == "$parent"
    assert await store.get_forward_extremities(ROOM) == {"$child"}
    page, _ = await store.get_recent_rooms_for_user("@a:hs", 10, 5)
    assert page[ROOM].event_ids[-2:] == ["$parent", "$child"]


async def test_prev_events_cycle_in_a_batch_is_refused(store: EventStore) -> None:
    await store.persist_events(room_start())
    with pytest.raises(InvalidEvent, match="cycle"):
        await store.persist_events([ev("$x", ["$y"], 3), ev("$y", ["$x"], 3)])
    assert await store.db.fetchone("SELECT 1 FROM events WHERE event_id IN ('$x', '$y')") is None


async def test_usage_mistakes_are_named(store: EventStore) -> None:
    """Each raised something internal before: json's TypeError, int()'s ValueError, AttributeError
    on a token string, a silent 'backwards' for any direction, LIMIT -1 (all rows on SQLite, a driver
    error on PostgreSQL), a page of 0 rooms read as "no rooms"."""
    await store.persist_events(room_start())
    await store.persist_event(ev("$m", ["$join"], 3))
    with pytest.raises(TypeError, match="list of events"):
        await store.persist_events(ev("$one", ["$m"], 4))  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent, match="bytes"):
        await store.persist_event(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="outlier must be True or False"):
        await store.persist_events([NewEvent(ev("$one", ["$m"], 4), outlier="no")])  # type: ignore[arg-type]
    # tokens are handed back as strings
    evs, tok = await store.paginate_backwards(ROOM, "@a:hs", None, 2)
    assert tok is not None
    assert await store.paginate_backwards(ROOM, "@a:hs", str(tok), 2) == \
        await store.paginate_backwards(ROOM, "@a:hs", tok, 2)
    ids, _ = await store.get_events_topological(ROOM, str(TopologicalToken(1, 10**6)), "f")
    assert ids == ["$join", "$m"]
    with pytest.raises(TokenError):
        await store.paginate_backwards(ROOM, "@a:hs", "s3", 2)
    since = evs[-1].stream_ordering
    expect = await store.get_new_events_for_user("@a:hs", since)
    assert await store.get_new_events_for_user("@a:hs", f"s{since}") == expect
    assert await store.get_new_events_for_user("@a:hs", StreamToken(since)) == expect
    with pytest.raises(ValueError, match="direction"):
        await store.get_events_topological(ROOM, None, "x")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit"):
            await store.get_events_topological(ROOM, None, "f", limit=bad)
        with pytest.raises(ValueError, match="limit"):
            await store.paginate_backwards(ROOM, "@a:hs", None, bad)
    with pytest.raises(ValueError, match="m_rooms"):
        await store.get_recent_rooms_for_user("@a:hs", 10, 0)


LOCKER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
"""


async def test_sqlite_file_locked_by_another_process(tmp_path: Any) -> None:
    """The persist gave the driver's bare 'sqlite3.OperationalError: database is locked'."""
    path = tmp_path / "locked.db"
    db = await connect(f"sqlite:///{path}")
    store = await EventStore.open(db)
    try:
        await store.persist_events(room_start())
        await db.execute("PRAGMA busy_timeout = 300")  # the default waits 30 s
        proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
            with pytest.raises(DatabaseUnavailable, match="locked by another"):
                await store.persist_event(ev("$m", ["$join"], 3))
        finally:
            proc.communicate("\n", timeout=10)
        res = await store.persist_event(ev("$m", ["$join"], 3))
        assert not res.duplicate and store.current_token() == res.stream_ordering
    finally:
        await store.close()
        await db.close()


async def test_close_waits_for_a_running_persist(engine_db: Any) -> None:
    """On PostgreSQL close() returned at once; closing the database next cut the persist off with
    'lost the connection'. A persist after close() said 'id generator ... is closed'."""
    store = await EventStore.open(engine_db)
    await store.persist_events(room_start())
    batch, tip = [], "$join"
    for i in range(300):
        batch.append(ev(f"$b{i}", [tip], 3 + i, "m.room.member", state_key=f"@u{i}:hs",
                        content={"membership": "join"}))
        tip = f"$b{i}"
    task = asyncio.create_task(store.persist_events(batch))
    await asyncio.sleep(0.05)
    assert not task.done()
    await store.close()
    await engine_db.close()
    res = await task
    assert len(res) == 300
    with pytest.raises(FactstreamError, match="EventStore is closed"):
        await store.persist_event(ev("$late", [tip], 400))
    db = await connect(engine_db.url)
    try:
        row = await db.fetchone("SELECT count(*), MAX(stream_ordering) FROM events")
        assert row is not None and row[0] == 302
        again = await EventStore.open(db)
        assert again.current_token() == row[1] == res[-1].stream_ordering
        await again.close()
    finally:
        await db.close()
