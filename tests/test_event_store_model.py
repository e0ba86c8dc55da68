"""The event store against the reference model, on random rooms, on both backends.

Hypothesis builds rooms from joins, leaves, invites, kicks, bans, visibility
changes, other state, messages, redactions, forks and merges, rejected
events, out-of-band invites (outliers) and late branches that arrive as
backfill; the store's answers for state, topological order, new events for a
user, recent rooms, back-pagination, visibility and the events stream rows must
equal the model's (tests/event_model.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from event_model import Model  # noqa: E402

from factstream.store.database import connect  # noqa: E402
from factstream.events import EventsStreamSource, EventStore, NewEvent, StateUnknown  # noqa: E402

N_USERS = 4
KINDS = ["msg", "msg", "msg", "join", "join", "leave", "invite", "invite", "kick", "ban", "vis", "vis", "topic",
         "redact", "oob_invite"]
VIS = ["world_readable", "shared", "invited", "joined", "bogus"]


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    """An abstract scenario: events with local names, materialised per example namespace."""
    n_rooms = draw(st.integers(1, 2))
    events: list[dict[str, Any]] = []
    ext: dict[int, list[str]] = {}
    fwd: dict[int, list[str]] = {}
    late: dict[int, list[str]] = {}
    depth: dict[str, int] = {}
    names = itertools.count()

    def add(room: int, etype: str, sender: int, prevs: list[str], *, state_key: Any = None,
            content: dict[str, Any] | None = None, is_late: bool = False, rejected: bool = False,
            outlier: bool = False, redacts: str | None = None) -> str:
        name = f"e{next(names)}"
        d = max((depth[p] for p in prevs if p in depth), default=0) + 1
        depth[name] = d
        events.append(dict(name=name, room=room, type=etype, sender=sender, prevs=prevs, depth=d,
                           state_key=state_key, content=content or {}, late=is_late, rejected=rejected,
                           outlier=outlier, redacts=redacts,
                           fmt=draw(st.sampled_from(["compact", "spaced", "ascii", "reversed"]))))
        if outlier:
            return name
        if not rejected:
            if is_late:
                late[room].append(name)
            else:
                ext[room] = [e for e in ext[room] if e not in prevs] + [name]
                fwd[room].append(name)
        return name

    for r in range(n_rooms):
        ext[r], fwd[r], late[r] = [], [], []
        c = add(r, "m.room.create", 0, [], state_key="", content={"creator": "u0"})
        add(r, "m.room.member", 0, [c], state_key=0, content={"membership": "join"})
    for _ in range(draw(st.integers(2, 22))):
        r = draw(st.integers(0, n_rooms - 1))
        kind = draw(st.sampled_from(KINDS))
        is_late = draw(st.integers(0, 9)) == 0
        rejected = draw(st.integers(0, 11)) == 0
        mode = draw(st.sampled_from(["tip", "tip", "tip", "fork", "merge"]))
        cands = fwd[r] + (late[r] if is_late else [])
        if is_late and late[r] and mode == "tip":
            prevs = [late[r][-1]]
        elif mode == "fork":
            prevs = [draw(st.sampled_from(cands))]
        elif mode == "merge" and len(ext[r]) > 1:
            prevs = draw(st.lists(st.sampled_from(ext[r]), min_size=2, max_size=2, unique=True))
        else:
            prevs = [draw(st.sampled_from(ext[r]))]
        user = draw(st.integers(0, N_USERS - 1))
        other = draw(st.integers(0, N_USERS - 1))
        kw: dict[str, Any] = dict(is_late=is_late, rejected=rejected)
        if kind == "msg":
            body = draw(st.text(alphabet="ab é☃\"\\\n😀", max_size=6))
            add(r, "m.room.message", user, prevs, content={"body": body, "msgtype": "m.text"}, **kw)
        elif kind in ("join", "leave"):
            add(r, "m.room.member", user, prevs, state_key=user, content={"membership": kind}, **kw)
        elif kind in ("invite", "ban"):
            add(r, "m.room.member", other, prevs, state_key=user, content={"membership": kind}, **kw)
        elif kind == "kick":
            add(r, "m.room.member", other, prevs, state_key=user, content={"membership": "leave"}, **kw)
        elif kind == "vis":
            add(r, "m.room.history_visibility", user, prevs, state_key="",
                content={"history_visibility": draw(st.sampled_from(VIS))}, **kw)
        elif kind == "topic":
            add(r, "m.room.topic", user, prevs, state_key="", content={"topic": "t"}, **kw)
        elif kind == "redact":
            targets = [e["name"] for e in events if e["room"] == r]
            add(r, "m.room.redaction", user, prevs, redacts=draw(st.sampled_from(targets)), **kw)
        elif kind == "oob_invite":
            add(n_rooms + len(events), "m.room.member", other, ["unknown"], state_key=user,
                content={"membership": "invite"}, outlier=True)
    batches = draw(st.lists(st.integers(1, 4), min_size=1, max_size=len(events)))
    return dict(events=events, batches=batches, limit=draw(st.integers(1, 4)))


def materialise(scn: dict[str, Any], ns: str) -> list[NewEvent]:
    """Concrete event JSON bytes in delivery order (late events last, as backfill)."""
    def eid(name: str) -> str:
        return f"${name}-{ns}"

    def user(u: Any) -> str:
        return f"@u{u}-{ns}:hs"

    out_fwd, out_late = [], []
    for e in scn["events"]:
        d: dict[str, Any] = {
            "event_id": eid(e["name"]),
            "room_id": f"!r{e['room']}-{ns}:hs",
            "type": e["type"],
            "sender": user(e["sender"]),
            "depth": e["depth"],
            "prev_events": [eid(p) for p in e["prevs"]],
            "origin_server_ts": 1700000000000,
            "content": dict(e["content"]),
        }
        if e["state_key"] is not None:
            d["state_key"] = "" if e["state_key"] == "" else user(e["state_key"])
        if e["redacts"] is not None:
            d["redacts"] = eid(e["redacts"])
        if e["type"] == "m.room.create":
            d["content"]["creator"] = user(0)
        fmt = e["fmt"]
        if fmt == "reversed":
            d = dict(reversed(list(d.items())))
        raw = json.dumps(
            d, ensure_ascii=(fmt == "ascii"), separators=(", ", ": ") if fmt == "spaced" else (",", ":")
        ).encode("utf-8")
        ne = NewEvent(raw, backfilled=e["late"], outlier=e["outlier"], rejected=e["rejected"])
        (out_late if e["late"] else out_fwd).append(ne)
    return out_fwd + out_late


async def run_and_check(store: EventStore, scn: dict[str, Any], ns: str) -> None:
    db = store.db
    start = store.current_token()
    items = materialise(scn, ns)
    model = Model()
    pos = 0
    sizes = itertools.cycle(scn["batches"])
    last_fwd, last_back = start, 0
    while pos < len(items):
        batch = items[pos : pos + next(sizes)]
        pos += len(batch)
        results = await store.persist_events(batch)
        for ne, res in zip(batch, results):
            assert not res.duplicate
            if ne.backfilled:
                assert res.stream_ordering < last_back
                last_back = res.stream_ordering
            else:
                assert res.stream_ordering > last_fwd
                last_fwd = res.stream_ordering
            model.persist(ne.raw, res.stream_ordering, backfilled=ne.backfilled, outlier=ne.outlier,
                          rejected=ne.rejected)
    # re-persisting is a no-op
    again = await store.persist_event(items[0].raw)
    assert again.duplicate
    upto = store.current_token()
    limit = scn["limit"]

    # 1. lossless bytes; redaction pruning
    for ne in items:
        eid = json.loads(ne.raw)["event_id"]
        assert await store.get_event_json(eid, prune_redacted=False) == ne.raw
        got = await store.get_event_json(eid)
        if model.redacted(eid):
            pruned = json.loads(got)
            assert pruned["event_id"] == eid and "body" not in pruned["content"]
            assert "origin_server_ts" in pruned
        else:
            assert got == ne.raw

    # 2. state at every event, current state, extremities
    for eid, ev in model.events.items():
        if ev.outlier:
            with pytest.raises(StateUnknown):
                await store.get_state_at(eid)
            continue
        assert await store.get_state_at(eid) == model.state_after(eid), eid
        assert await store.get_state_at(eid, after=False) == model.state_before(eid), eid
    for room in model.rooms():
        assert await store.get_current_state(room) == model.current_state(room), room
        assert await store.get_forward_extremities(room) == model.extremities(room)

    # 3. topological order, forwards and backwards, in pages
    for room in model.rooms():
        expected = model.topological(room)
        got_ids: list[str] = []
        tok = None
        while True:
            ids, tok = await store.get_events_topological(room, tok, "f", limit=3)
            if not ids:
                break
            got_ids += ids
        assert got_ids == expected
        got_ids, tok = [], None
        while True:
            ids, tok = await store.get_events_topological(room, tok, "b", limit=2)
            if not ids:
                break
            got_ids += ids
        assert got_ids == expected[::-1]

    users = [f"@u{u}-{ns}:hs" for u in range(N_USERS)]
    rooms = set(model.rooms())
    fwd_streams = sorted(e.stream for e in model.events.values() if e.stream > 0)
    points = sorted({start, fwd_streams[len(fwd_streams) // 2], fwd_streams[-1] - 1})
    for user in users:
        # 4. new events for a user since a token (with and without change caches)
        for since in points:
            want = model.new_events_for_user(user, since, upto, limit)
            for caches in (True, False):
                got = await store.get_new_events_for_user(user, since, limit=limit, use_caches=caches)
                assert {r: (v.event_ids, v.limited) for r, v in got.items()} == want, (user, since, caches)
        # 5. recent rooms, paginated one room at a time
        pages: list[tuple[str, list[str], bool]] = []
        rtok = None
        while True:
            page, rtok = await store.get_recent_rooms_for_user(user, 3, 1, rtok)
            pages += [(r, v.event_ids, v.limited) for r, v in page.items()]
            if rtok is None:
                break
        assert pages == model.recent_rooms(user, 3, upto, rooms)
        # 6. back-pagination with tokens
        for room in rooms:
            seen: list[str] = []
            ttok = None
            while True:
                evs, ttok = await store.paginate_backwards(room, user, ttok, 2)
                seen += [e.event_id for e in evs]
                if ttok is None:
                    break
            assert seen == model.back_pagination(room, user, upto), (room, user)

    # 8. events stream rows
    updates, upper, limited = await EventsStreamSource(db).get_updates("master", start, upto, 100_000)
    assert not limited and upper == upto
    assert [u for u in updates if u[1][0] == "ev"] == model.ev_rows(start, upto)
    assert [(t, *row[1]) for t, row in updates if row[0] == "state"] == model.state_deltas()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/events.db"
    else:
        yield request.getfixturevalue("postgres_dsn")


def _run_model_test(db_url: str, max_examples: int) -> None:
    counter = itertools.count()
    with asyncio.Runner() as runner:
        db = runner.run(connect(db_url))
        store = runner.run(EventStore.open(db))
        try:
            @settings(max_examples=max_examples, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                             HealthCheck.function_scoped_fixture])
            @given(scn=scenarios())
            def check(scn: dict[str, Any]) -> None:
                runner.run(run_and_check(store, scn, f"x{next(counter)}"))

            check()
        finally:
            runner.run(store.close())
            runner.run(db.close())


def test_store_matches_model(db_url: str) -> None:
    _run_model_test(db_url, 25)


@pytest.mark.slow
def test_store_matches_model_deep(db_url: str) -> None:
    _run_model_test(db_url, 300)
