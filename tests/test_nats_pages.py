"""The page format: what one JetStream message holds, its id, and facts cut across messages.

Pure checks of :mod:`factstream.transport.nats.pages` (a page is lines the
codec reads back; ids name the first and last line), then end to end against
the shared JetStream server: a fact larger than a page arrives whole, a row
too large for any message is counted and its fact taken from the table, and
the same page published twice is stored once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from factstream import wire
from factstream.transport.nats import JetStreamLayout
from factstream.transport.nats.pages import build_pages, decode_page, header_chain, page_top, parse_keys

from nats_helpers import (
    STREAM,
    assert_exact,
    deployment,
    nats_url,
    random_fact,
    settle,
    writer_and_reader,
)

__all__ = ["deployment", "nats_url"]

BOTH_EVENT_LOOPS = True

R = wire.RdataCommand
P = wire.PositionCommand


def facts() -> list[wire.Command]:
    return [
        R(STREAM, "w1", 5, ["a"]),
        R(STREAM, "w1", None, ["b0"]), R(STREAM, "w1", None, ["b1"]), R(STREAM, "w1", 7, ["b2"]),
        P(STREAM, "w1", 7, 9),
        R(STREAM, "w1", 10, ["c"]),
    ]


def test_a_page_is_wire_lines_that_the_codec_reads_back() -> None:
    cmds = facts()
    (page,), too_large = build_pages(STREAM, "w1", cmds, 4, 1 << 20)
    assert too_large == []
    assert page.payload == wire.encode_lines(cmds)  # newline-ended lines, as over TCP
    assert wire.LineDecoder().feed(page.payload) == cmds == decode_page(page.payload)
    assert decode_page(page.payload.rstrip(b"\n")) == cmds  # a last line without its newline is read too
    assert page.msg_id == f"{STREAM}:w1:5:0..10:0" and page.prev == 4 and page.end == 10 and page.lines == 6
    assert parse_keys(page.msg_id.encode()) == ((5, 0), (10, 0))
    raw = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nFs-Prev: 4\r\n\r\n" % page.msg_id.encode()
    assert header_chain(raw) == (4, (5, 0), (10, 0))
    # One line: the id of a message holding one row (or one POSITION).
    (one,), _ = build_pages(STREAM, "w1", [R(STREAM, "w1", 5, ["a"])], 4, 1 << 20)
    assert one.msg_id == f"{STREAM}:w1:5:0"
    (pos,), _ = build_pages(STREAM, "w1", [P(STREAM, "w1", 7, 9)], 7, 1 << 20)
    assert pos.msg_id == f"{STREAM}:w1:9:p7" and parse_keys(pos.msg_id.encode()) == ((9, None), (9, None))


def test_pages_end_on_fact_boundaries_and_a_large_fact_is_cut_by_rows() -> None:
    big = [R(STREAM, "w1", None, ["x" * 300]) for _ in range(9)] + [R(STREAM, "w1", 20, ["x" * 300])]
    cmds = [R(STREAM, "w1", 19, ["small"]), *big, R(STREAM, "w1", 21, ["after"])]
    pages, too_large = build_pages(STREAM, "w1", cmds, 18, 1024)
    assert too_large == []
    assert all(len(p.payload) <= 1024 for p in pages)
    assert [c for p in pages for c in decode_page(p.payload)] == cmds
    ids = [p.msg_id for p in pages]
    assert ids[0] == f"{STREAM}:w1:19:0"  # the small fact alone: the big one does not fit beside it
    assert ids[1] == f"{STREAM}:w1:20:0..20:2" and ids[-2] == f"{STREAM}:w1:20:9"  # its last row alone
    assert [p.end for p in pages[1:-1]] == [None] * (len(pages) - 3) + [20]  # only the last part completes it
    assert pages[-1].prev == 20 and pages[-1].end == 21
    assert page_top(decode_page(pages[1].payload), (20, 2), 19) == 20


def test_a_row_too_large_for_any_message_leaves_out_its_fact_and_the_chain_shows_it() -> None:
    cmds = [R(STREAM, "w1", 1, ["a"]), R(STREAM, "w1", None, ["b"]), R(STREAM, "w1", 2, ["y" * 3000]),
            R(STREAM, "w1", 3, ["c"])]
    pages, too_large = build_pages(STREAM, "w1", cmds, 0, 1024)
    assert too_large == [cmds[2]]
    assert [c for p in pages for c in decode_page(p.payload)] == [cmds[0], cmds[3]]
    assert pages[-1].prev == 2  # a reader at 1 sees that fact 2 is missing


async def test_a_fact_larger_than_a_page_arrives_whole(nats_url: str, deployment: str) -> None:
    rng = random.Random(7)
    async with writer_and_reader(nats_url, deployment, page_bytes=1024) as (writer, reader):
        for i in range(40):
            writer.write(random_fact(rng, "w1", i))
            if i % 10 == 0:
                writer.write([[f"{i}-{k}-" + "z" * 200] for k in range(12)])  # about 2.7 kB: cut in three
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert reader.source.queries == 0 and reader.nats.stats.broken_batches == 0
        assert writer.nats.stats.too_large == 0


async def test_a_row_too_large_is_counted_and_its_fact_comes_from_the_table(nats_url: str, deployment: str) -> None:
    async with writer_and_reader(nats_url, deployment, page_bytes=1024) as (writer, reader):
        writer.write([["before"]])
        writer.write([["huge-" + "q" * 5000]])
        writer.write([["after"]])
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert writer.nats.stats.too_large == 1
        assert reader.nats.stats.fallbacks >= 1 and reader.source.queries >= 1


async def test_the_same_page_published_twice_is_stored_once(nats_url: str, deployment: str) -> None:
    import nats

    from factstream.transport.nats import NatsReplication
    from factstream.replication import ReplicationHub

    # The deployment's stream, created as the carrier creates it (duplicate window and all).
    link = NatsReplication(ReplicationHub("maker"), nats_url, deployment)
    await link.start()
    await link.wait_connected(15)
    await link.stop()
    layout = JetStreamLayout.for_server(deployment)
    (page,), _ = build_pages(STREAM, "w1", facts(), 4, 1 << 20)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        acks: list[Any] = []
        for _ in range(2):  # a writer re-publishing after a crash: same lines, same id
            acks.append(await js.publish(layout.log_subject(STREAM, "w1"), page.payload,
                                         headers={"Nats-Msg-Id": page.msg_id, "Fs-Prev": "4"}))
        assert [bool(a.duplicate) for a in acks] == [False, True] and acks[0].seq == acks[1].seq
        assert (await js.stream_info(layout.stream)).state.messages == 1
    finally:
        await nc.close()


async def _publish_raw(url: str, server_name: str, payload: bytes) -> None:
    """Store ``payload`` on writer w1's subject as another tool would (not through the carrier)."""
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(JetStreamLayout.for_server(server_name).log_subject(STREAM, "w1"), payload)
    finally:
        await nc.close()


@pytest.mark.parametrize("payload", [b"RDATA to_device w1 1 [\"a\"]\nNOT A COMMAND\n",
                                     b"RDATA to_device w1 1 [\"a\"]\nRDATA to_device w2 2 [\"b\"]\n"])
async def test_a_page_with_a_bad_or_foreign_line_is_skipped_whole(nats_url: str, deployment: str,
                                                                  payload: bytes) -> None:
    async with writer_and_reader(nats_url, deployment) as (writer, reader):
        writer.write([["x0"]])
        await writer.nats.flush(10)
        await _publish_raw(nats_url, deployment, payload)
        writer.write([["x1"]])
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert reader.nats.stats.invalid == 1


async def test_an_old_position_read_again_does_not_move_a_reader_back(nats_url: str, deployment: str) -> None:
    # A consumer restarted behind what it delivered (links cut again and again) reads old pages again:
    # their facts are skipped by token, and so must their POSITIONs be, or the follower would take
    # one for a writer going backwards and deliver everything after it a second time.
    async with writer_and_reader(nats_url, deployment) as (writer, reader):
        for i in range(4):
            writer.write([[f"x{i}"]])
        await settle([writer], [reader])
        old = wire.encode(P(STREAM, "w1", 1, 2)) + b"\n"
        await _publish_raw(nats_url, deployment, old)
        writer.write([["x4"]])
        await settle([writer], [reader])
        assert_exact([writer], [reader])
        assert reader.follower.stats["resets"] == 0
        assert reader.nats.stats.skipped >= 1
