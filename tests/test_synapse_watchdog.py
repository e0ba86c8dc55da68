"""The watchdog's judgement alone (no services): which wire and database histories are problems.

The real-Synapse test (test_synapse_watch.py) shows each problem once; these
pin down the edges: catch-up ranges are not gaps, RDATA'd ids are published,
problems wait for ``frozen_after`` and clear when the wire moves on.
"""

from __future__ import annotations

from factstream.commands import PositionCommand, RdataCommand
from factstream.synapse.watchdog import DbView, Watchdog


def rdata(stream: str, writer: str, token: int | None) -> RdataCommand:
    return RdataCommand(stream, writer, token, ["!r:hs", "m.read", "@a:hs", "$e", None, {}])


def kinds(dog: Watchdog, now: float) -> set[tuple[str, str, str]]:
    return {(p.kind, p.stream, p.writer) for p in dog.problems(now)}


def test_a_row_under_a_trusted_position_is_unpublished_but_rdata_and_catch_up_are_not() -> None:
    dog = Watchdog(frozen_after=5)
    dog.on_command(PositionCommand("receipts", "master", 10, 10), now=0)  # baseline
    dog.on_command(rdata("receipts", "master", 12), now=1)                # covers 11 (trusted), publishes 12
    dog.on_command(PositionCommand("receipts", "master", 12, 15), now=2)  # trusted: 13..15 have no rows
    dog.on_command(PositionCommand("receipts", "master", 18, 20), now=3)  # prev above our token: readers fetch 16..20
    assert dog.audit_ranges(["receipts"]) == {("receipts", "master"): (10, 20)}
    dog.on_database({("receipts", "master"): DbView(top=None, ids=(9, 11, 12, 14, 17, 21))}, now=4)
    [p] = dog.problems(now=4)
    assert (p.kind, p.ids) == ("unpublished", (11, 14))  # 9: before we watched; 17: catch-up; 21: not yet covered


def test_frozen_waits_for_frozen_after_and_clears_when_the_wire_moves() -> None:
    dog = Watchdog(frozen_after=5)
    dog.on_command(PositionCommand("events", "persister1", 100, 100), now=0)
    dog.on_database({("events", "persister1"): DbView(top=103)}, now=1)
    assert kinds(dog, now=5.9) == set()
    assert kinds(dog, now=6.0) == {("frozen", "events", "persister1")}
    assert dog.snapshot(now=6)[0]["db_lag"] == 3
    dog.on_command(rdata("events", "persister1", 103), now=7)
    dog.on_database({("events", "persister1"): DbView(top=None)}, now=8)
    assert kinds(dog, now=20) == set()


def test_a_writer_only_the_database_knows_is_frozen_too() -> None:
    dog = Watchdog(frozen_after=1)
    dog.on_database({("receipts", "ghost"): DbView(top=7)}, now=0)
    assert kinds(dog, now=2) == {("frozen", "receipts", "ghost")}


def test_writer_behind_needs_others_to_move_on_and_skips_caches() -> None:
    dog = Watchdog(frozen_after=3)
    for stream in ("receipts", "caches"):
        dog.on_command(PositionCommand(stream, "master", 5, 5), now=0)
        dog.on_command(PositionCommand(stream, "worker1", 5, 5), now=0)
        dog.on_command(PositionCommand(stream, "master", 5, 6), now=1)
    assert kinds(dog, now=10) == set()  # master moved on only 1s after worker1 last moved
    for stream in ("receipts", "caches"):
        dog.on_command(PositionCommand(stream, "master", 6, 9), now=4)
    assert kinds(dog, now=5) == {("writer_behind", "receipts", "worker1")}
    dog.on_command(PositionCommand("receipts", "worker1", 5, 9), now=6)  # it echoes again
    assert kinds(dog, now=7) == set()


def test_rates_and_batches() -> None:
    dog = Watchdog()
    for t in range(20):
        dog.on_command(rdata("receipts", "master", None), now=t * 0.5)  # a batch row: no id of its own
        dog.on_command(rdata("receipts", "master", 100 + t), now=t * 0.5)
    [w] = dog.snapshot(now=10)
    assert w["token"] == 119 and w["rows_total"] == 40 and w["rows_per_second"] == 4.0


def test_a_recorded_position_above_the_wire_counts_only_for_writers_the_wire_knows() -> None:
    dog = Watchdog(frozen_after=1)
    dog.on_command(PositionCommand("receipts", "master", 4, 4), now=0)
    dog.on_database({("receipts", "master"): DbView(top=None, position=9),
                     ("receipts", "gone_worker"): DbView(top=None, position=50)}, now=0)
    assert kinds(dog, now=2) == {("frozen", "receipts", "master")}
    assert "records master at position 9" in dog.problems(now=2)[0].summary
    assert [w["db_lag"] for w in dog.snapshot(now=2)] == [None, 5]  # gone_worker, master


def test_sequence_behind_wire_and_position_ahead_say_exactly_this() -> None:
    """The two problems of a writer's figures against its stream's sequence, word for word (one code serves both)."""
    dog = Watchdog(frozen_after=1)
    dog.on_command(PositionCommand("receipts", "master", 40, 40), now=0)
    dog.on_command(PositionCommand("receipts", "worker1", 40, 40), now=0)
    dog.on_command(PositionCommand("account_data", "master", 7, 7), now=0)
    dog.on_database({
        # the sequence went back under both writers: behind the wire; master's position (40) only restates it
        ("receipts", "master"): DbView(position=40, sequence="receipts_sequence", sequence_issued=2, wire_token=40),
        # a position beyond the wire and the sequence: a second problem for worker1
        ("receipts", "worker1"): DbView(position=99, sequence="receipts_sequence", sequence_issued=2, wire_token=40),
        # only a position ahead, and no sequence name known
        ("account_data", "master"): DbView(position=12, sequence=None, sequence_issued=7, wire_token=7),
    }, now=0)
    found = [(p.kind, p.stream, p.writer, p.summary) for p in dog.problems(now=0)]
    behind = ("sequence receipts_sequence has handed out only up to 2 but {w} already announced receipts token 40: "
              "new rows get ids every reader has passed and are never seen (the sequence was set back: a restore or "
              "a hand edit); stop every Synapse process and run 'factstream synapse check --fix' (or setval "
              "receipts_sequence to at least 40)")
    assert found == [
        ("position_ahead", "account_data", "master",
         "stream_positions records master at 12 but sequence its sequence has handed out only up to 7 (edited by "
         "hand, or the sequence and stream_positions restored from different backups); Synapse refuses to start "
         "until it is repaired: run 'factstream synapse check' for the repair"),
        ("sequence_behind_wire", "receipts", "master", behind.format(w="master")),
        ("sequence_behind_wire", "receipts", "worker1", behind.format(w="worker1")),
        ("position_ahead", "receipts", "worker1",
         "stream_positions records worker1 at 99 but sequence receipts_sequence has handed out only up to 2 (edited "
         "by hand, or the sequence and stream_positions restored from different backups); Synapse refuses to start "
         "until it is repaired: run 'factstream synapse check' for the repair"),
    ], found
    dog.on_database({}, now=1)  # the database no longer shows them: both clear
    assert dog.problems(now=1) == []
