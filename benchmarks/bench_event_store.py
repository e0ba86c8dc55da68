"""Room event store: persist rate, new events for a user, full state, bytes per change.

Each group pairs a measurement with its baseline in the same process:

* ``events-persist-<db>``: 200 messages persisted one call each, against
  2,000 messages persisted in batches of 100 (items = events, so ops/s is
  events/s).
* ``new-events-<db>``: "new events for user" for a user in 100 rooms of which
  1 changed since the token, with the stream-change caches and without them.
* ``full-state-<db>``: the full state (10,000+ entries) at the last join of a
  room with 10,000 members, read cold from its delta chain, against reading a
  flat snapshot of the same size (the room's current_state_events rows).
* bytes per membership change: printed and attached as extra_info of the
  full-state rows (logical bytes of state rows, and on PostgreSQL the growth of
  the tables' on-disk size), next to what a full copy per change would cost.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factstream.store.database import connect
from factstream.events import EventStore

SINGLE = 200
BATCHED = 2000
BATCH = 100
ROOMS = 100
MEMBERS = 10_000
FLIPS = 1000

_ids = itertools.count()


class RoomWriter:
    """Linear room event JSON, numbered across the whole run."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self.prev: list[str] = []
        self.depth = 0

    def ev(self, etype: str, sender: str, content: dict[str, Any], state_key: str | None = None) -> bytes:
        self.depth += 1
        eid = f"${next(_ids)}:bench"
        d: dict[str, Any] = {"event_id": eid, "room_id": self.room_id, "type": etype, "sender": sender,
                             "prev_events": self.prev, "depth": self.depth, "origin_server_ts": 1700000000000,
                             "content": content, "hashes": {"sha256": "x" * 43},
                             "signatures": {"bench": {"ed25519:a": "s" * 86}}}
        if state_key is not None:
            d["state_key"] = state_key
        self.prev = [eid]
        return json.dumps(d, separators=(",", ":")).encode()

    def create(self, creator: str) -> list[bytes]:
        return [self.ev("m.room.create", creator, {"creator": creator}, ""),
                self.ev("m.room.member", creator, {"membership": "join"}, creator)]

    def msg(self, sender: str) -> bytes:
        return self.ev("m.room.message", sender, {"msgtype": "m.text", "body": "hello world"})

    def member(self, user: str, membership: str) -> bytes:
        return self.ev("m.room.member", user, {"membership": membership}, user)


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, asyncio.AbstractEventLoop, EventStore]]:
    name = request.param
    url = f"sqlite:///{tmp_path / 'ev.db'}" if name == "sqlite" else request.getfixturevalue("postgres_dsn")
    loop = asyncio.new_event_loop()

    async def setup() -> EventStore:
        db = await connect(url)
        return await EventStore.open(db)

    store = loop.run_until_complete(setup())
    try:
        yield name, loop, store
    finally:
        loop.run_until_complete(store.close())
        loop.run_until_complete(store.db.close())
        loop.close()


def test_persist_single(benchmark: Any, env: tuple[str, asyncio.AbstractEventLoop, EventStore]) -> None:
    name, loop, store = env
    room = RoomWriter("!single:bench")
    loop.run_until_complete(store.persist_events(room.create("@a:bench")))

    async def run() -> None:
        for _ in range(SINGLE):
            await store.persist_event(room.msg("@a:bench"))

    benchmark.group = f"events-persist-{name}"
    benchmark.extra_info["items"] = SINGLE
    benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=5, iterations=1, warmup_rounds=1)


def test_persist_batched(benchmark: Any, env: tuple[str, asyncio.AbstractEventLoop, EventStore]) -> None:
    name, loop, store = env
    room = RoomWriter("!batched:bench")
    loop.run_until_complete(store.persist_events(room.create("@a:bench")))

    async def run() -> None:
        evs = [room.msg("@a:bench") for _ in range(BATCHED)]
        for i in range(0, BATCHED, BATCH):
            await store.persist_events(evs[i : i + BATCH])

    benchmark.group = f"events-persist-{name}"
    benchmark.extra_info["items"] = BATCHED
    benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("caches", [True, False], ids=["with-caches", "without-caches"])
def test_new_events_for_user(benchmark: Any, env: tuple[str, asyncio.AbstractEventLoop, EventStore],
                             caches: bool) -> None:
    name, loop, store = env
    rooms = [RoomWriter(f"!r{i}:bench") for i in range(ROOMS)]

    async def setup() -> int:
        batch: list[bytes] = []
        for r in rooms:
            batch += r.create("@owner:bench") + [r.member("@u:bench", "join")] + [r.msg("@owner:bench")
                                                                                  for _ in range(5)]
        for i in range(0, len(batch), 500):
            await store.persist_events(batch[i : i + 500])
        since = store.current_token()
        await store.persist_events([rooms[42].msg("@owner:bench") for _ in range(3)])  # 1% of rooms changed
        return since

    since = loop.run_until_complete(setup())
    got = loop.run_until_complete(store.get_new_events_for_user("@u:bench", since, use_caches=caches))
    assert list(got) == ["!r42:bench"] and len(got["!r42:bench"].events) == 3
    benchmark.group = f"new-events-{name}"
    benchmark.extra_info["rooms"] = ROOMS
    benchmark.pedantic(
        lambda: loop.run_until_complete(store.get_new_events_for_user("@u:bench", since, use_caches=caches)),
        rounds=50, iterations=1, warmup_rounds=2,
    )


async def _state_bytes(store: EventStore) -> dict[str, int]:
    db = store.db
    row = await db.fetchone(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(type) + LENGTH(state_key) + LENGTH(event_id) + 8), 0)"
        " FROM state_group_deltas"
    )
    groups = await db.fetchone("SELECT COUNT(*) FROM state_groups")
    assert row is not None and groups is not None
    out = {"delta_rows": int(row[0]), "logical_bytes": int(row[1]) + 40 * int(groups[0])}
    if db.engine == "postgres":
        disk = await db.fetchone(
            "SELECT pg_total_relation_size('state_group_deltas') + pg_total_relation_size('state_groups')"
        )
        assert disk is not None
        out["disk_bytes"] = int(disk[0])
    return out


@pytest.fixture
def big_room(env: tuple[str, asyncio.AbstractEventLoop, EventStore]) -> Iterator[dict[str, Any]]:
    name, loop, store = env
    room = RoomWriter("!big:bench")

    async def build() -> dict[str, Any]:
        evs = room.create("@a:bench") + [room.member(f"@m{i}:bench", "join") for i in range(MEMBERS)]
        for i in range(0, len(evs), 1000):
            res = await store.persist_events(evs[i : i + 1000])
        last_join = res[-1].event_id
        before = await _state_bytes(store)
        flips = [room.member(f"@m{i % 500}:bench", "leave" if (i // 500) % 2 == 0 else "join")
                 for i in range(FLIPS)]
        for i in range(0, FLIPS, 100):
            await store.persist_events(flips[i : i + 100])
        after = await _state_bytes(store)
        entry = after["logical_bytes"] / max(after["delta_rows"], 1)
        per_change = {k: (after[k] - before[k]) / FLIPS for k in after}
        info = {
            "members": MEMBERS,
            "delta_rows_per_change": round(per_change["delta_rows"], 1),
            "logical_bytes_per_change": round(per_change["logical_bytes"]),
            "full_copy_bytes_per_change": round(entry * (MEMBERS + 2)),
        }
        if "disk_bytes" in per_change:
            info["disk_bytes_per_change"] = round(per_change["disk_bytes"])
        print(f"\n[{name}] bytes per membership change in a {MEMBERS}-member room: {info}")
        return {"last_join": last_join, "info": info}

    yield loop.run_until_complete(build())


def test_full_state_10k_members(benchmark: Any, env: tuple[str, asyncio.AbstractEventLoop, EventStore],
                                big_room: dict[str, Any]) -> None:
    name, loop, store = env

    async def cold() -> int:
        store.groups.forget()
        return len(await store.get_state_at(big_room["last_join"]))

    assert loop.run_until_complete(cold()) == MEMBERS + 2
    benchmark.group = f"full-state-{name}"
    benchmark.extra_info.update(big_room["info"])
    benchmark.pedantic(lambda: loop.run_until_complete(cold()), rounds=10, iterations=1, warmup_rounds=1)


def test_full_state_flat_snapshot_baseline(benchmark: Any, env: tuple[str, asyncio.AbstractEventLoop, EventStore],
                                           big_room: dict[str, Any]) -> None:
    name, loop, store = env

    async def flat() -> int:
        return len(await store.get_current_state("!big:bench"))

    assert loop.run_until_complete(flat()) >= MEMBERS
    benchmark.group = f"full-state-{name}"
    benchmark.pedantic(lambda: loop.run_until_complete(flat()), rounds=10, iterations=1, warmup_rounds=1)
