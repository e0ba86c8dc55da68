"""Rows of one token come back in the order the writer wrote them, live and on catch-up (issue 11, item 9).

PostgreSQL returns rows that tie on ``ORDER BY stream_id`` in no stable
order (a top-N sort under ``LIMIT`` shuffles them), so two readers of one
writer could disagree on the order inside a multi-row token. The demo tables
keep the insertion order (``row_seq`` on PostgreSQL, ``rowid`` on SQLite)
and the sources order by it. Both engines (``engine_db``), both relay twins.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

from factstream.commands import Command, PositionCommand, RdataCommand
from factstream.replication import Follower, Publisher
from factstream.replication.tables import TableWriter, create_tables, open_id_generators
from factstream.demo.tables import DEMO_TABLES

RECEIPTS = DEMO_TABLES[1]


def feeder(fol: Follower) -> Any:
    def sink(cmds: list[Command]) -> None:
        for c in cmds:
            if isinstance(c, RdataCommand):
                fol.on_rdata(c)
            else:
                assert isinstance(c, PositionCommand)
                fol.on_position(c)

    return sink


async def test_multi_row_tokens_keep_the_writers_order_live_and_on_catch_up(
    engine_db: Any, relay_impl: ModuleType
) -> None:
    await create_tables(engine_db, [RECEIPTS])
    gen = (await open_id_generators(engine_db, "master", [RECEIPTS]))["receipts"]
    live = Follower(sources={"receipts": RECEIPTS.source(engine_db)}, start_position=0, typed=False, relay=relay_impl)
    got_live: list[tuple[int, list[str]]] = []
    live.add_handler(lambda s, w, t, rows: got_live.append((t, [r[2] for r in rows])))
    pub = Publisher("master", page_limit=7)
    pub.add_stream("receipts", RECEIPTS.source(engine_db), gen.current_token_for_writer("master"))
    pub.add_sink(feeder(live))
    gen.add_listener(pub.notify)
    writer = TableWriter(engine_db, gen, RECEIPTS)
    rng = random.Random(9)
    written: list[tuple[int, list[str]]] = []
    for i in range(120):
        users = [f"@u{i}_{j}:hs" for j in range(rng.randint(2, 9))]
        rng.shuffle(users)  # the writer's order is not the sorted order
        token = await writer.write([["!room:hs", "m.read", u, f"$e{i}", None, {"ts": i}] for u in users])
        written.append((token, users))
    await pub.flush()
    await live.wait_for_position("receipts", "master", gen.current_token(), 10)
    assert got_live == written

    # A reader that joins late gets everything by catch-up, in small pages.
    late = Follower(
        sources={"receipts": RECEIPTS.source(engine_db)}, start_position=0, typed=False, relay=relay_impl, page_limit=5
    )
    got_late: list[tuple[int, list[str]]] = []
    late.add_handler(lambda s, w, t, rows: got_late.append((t, [r[2] for r in rows])))
    late.on_position(PositionCommand("receipts", "master", gen.current_token(), gen.current_token()))
    await late.wait_for_position("receipts", "master", gen.current_token(), 10)
    assert late.stats["catchup_fetches"] > 10
    assert got_late == written
    pub.close()
    await live.close()
    await late.close()
    await gen.close()
