"""Property test: whatever the writer's history and wherever the link drops commands,
the follower delivers every committed fact exactly once, in token order."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.commands import Command, PositionCommand, RdataCommand
from factstream.replication import Follower, LocalStream, Publisher

# A history step: a group of reservations completed in some order, each with 0..3 rows.
step = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4).flatmap(
    lambda rows: st.tuples(st.just(rows), st.permutations(list(range(len(rows)))))
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=st.lists(step, min_size=1, max_size=25),
    cuts=st.lists(st.tuples(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=30)), max_size=4),
    page_limit=st.integers(min_value=1, max_value=6),
    start=st.sampled_from([0, None]),
)
def test_follower_delivers_exactly_once_in_order(history: Any, cuts: Any, page_limit: int, start: Any) -> None:
    asyncio.run(_check(history, cuts, page_limit, start))


async def _check(history: Any, cuts: Any, page_limit: int, start: int | None) -> None:
    ls = LocalStream("to_device", "w")
    pub = Publisher("w")
    pub.add_stream("to_device", ls.source, 0)
    ls.add_listener(pub.notify)
    wire_log: list[Command] = []
    pub.add_sink(wire_log.extend)
    committed: dict[int, list[Any]] = {}
    for rows_per, order in history:
        tokens = [ls.reserve() for _ in rows_per]
        for i in order:
            rows = [[f"@{tokens[i]}-{j}"] for j in range(rows_per[i])]
            if rows:
                committed[tokens[i]] = rows
            ls.complete(tokens[i], rows or None)
    final = ls.current_token()

    fol = Follower(typed=False, sources={"to_device": ls.source}, page_limit=page_limit, start_position=start)
    got: list[tuple[int, list[Any]]] = []
    fol.add_handler(lambda s, w, t, rows: got.append((t, rows)))

    # Replay the wire in "connections": each cut drops a run of commands (and any half batch),
    # and the next connection starts with the REPLICATE answer at the publisher's position then.
    # Without cuts the follower sees exactly what the publisher sent.
    conn = object()
    fol.on_position(PositionCommand("to_device", "w", 0, 0), conn)
    pos = 0
    cut_at = {a: b for a, b in cuts}
    i = 0
    while i < len(wire_log):
        if i in cut_at:
            fol.connection_lost(conn)
            conn = object()
            i += cut_at.pop(i)
            # A new link starts on a fact boundary: the REPLICATE answer is sent between two
            # publications, never inside one (the publisher emits a fact's commands in one call).
            while 0 < i < len(wire_log) and getattr(wire_log[i - 1], "token", 0) is None:
                i += 1
            # The writer's published position once the link is back: the token of the last command sent so far.
            sent = [c for c in wire_log[:i] if getattr(c, "token", None) is not None or isinstance(c, PositionCommand)]
            if sent:
                last = sent[-1]
                pos = last.new_token if isinstance(last, PositionCommand) else last.token  # type: ignore[union-attr]
            fol.on_position(PositionCommand("to_device", "w", pos, pos), conn)
            continue
        cmd = wire_log[i]
        if isinstance(cmd, RdataCommand):
            fol.on_rdata(cmd, conn)
        else:
            fol.on_position(cmd, conn)  # type: ignore[arg-type]
        i += 1
    fol.on_position(PositionCommand("to_device", "w", final, final), conn)
    await fol.wait_for_position("to_device", "w", final, timeout=5)
    while fol.is_catching_up():
        await asyncio.sleep(0)

    tokens = [t for t, _ in got]
    assert tokens == sorted(set(tokens)), "duplicated or reordered"
    # start None adopts the first POSITION (0 here), so both starts must yield the whole history.
    assert dict(got) == committed
