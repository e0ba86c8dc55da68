"""Carrier-neutral pieces of the end-to-end replication tests (Redis pub/sub, NATS JetStream, TCP).

Writers and readers are real :class:`ReplicationHub` s over a shared
:class:`MemoryUpdateSource` (the "database"); each carrier's tests subclass
:class:`Writer` and :class:`Reader` to add their link (``.redis``, ``.nats``),
exposed as ``.link`` for :func:`start_all` and :func:`stop_all`. Every check
compares, per reader and per writer, the exact list of facts delivered with
the list written.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from factstream.replication import Follower, LocalStream, Publisher, ReplicationHub

STREAM = "to_device"


class Writer:
    """One writer instance: a LocalStream over the shared source, its publisher and hub (a subclass adds the link)."""

    def __init__(self, name: str, source: Any, *, start_token: int = 0) -> None:
        self.name = name
        self.source = source
        self.stream = LocalStream(STREAM, name, source=source, start=start_token)
        self.publisher = Publisher(name)
        self.publisher.add_stream(STREAM, source, start_token)
        self.stream.add_listener(self.publisher.notify)
        self.hub = ReplicationHub(name, publisher=self.publisher)
        self.written: list[tuple[int, list[Any]]] = []  # (token, rows) of every fact with rows

    @property
    def link(self) -> Any:
        """The carrier's replication link (started by :func:`start_all`, stopped by :func:`stop_all`)."""
        raise NotImplementedError

    def write(self, rows: list[Any] | None) -> int:
        """Write one fact (None: a rolled-back hole)."""
        token = self.stream.reserve()
        self.stream.complete(token, rows)
        if rows:
            self.written.append((token, rows))
        return token


class Reader:
    """One reader instance: a follower catching up from ``source`` when it must (a subclass adds the link)."""

    def __init__(self, name: str, source: Any, *, positions: dict[tuple[str, str], int] | None = None,
                 start_position: int | None = 0, got: dict[str, list[tuple[int, list[Any]]]] | None = None) -> None:
        self.name = name
        self.source = source
        self.follower = Follower(sources={STREAM: source}, positions=positions, start_position=start_position,
                                 typed=False, page_limit=50)
        self.got: dict[str, list[tuple[int, list[Any]]]] = got if got is not None else {}
        self.follower.add_handler(lambda s, w, t, rows: self.got.setdefault(w, []).append((t, list(rows))))
        self.hub = ReplicationHub(name, follower=self.follower)

    @property
    def link(self) -> Any:
        """The carrier's replication link (started by :func:`start_all`, stopped by :func:`stop_all`)."""
        raise NotImplementedError


async def start_all(nodes: Sequence[Writer | Reader], timeout: float = 15.0) -> None:
    """Start every node's link, then wait until each is connected (``timeout`` seconds each)."""
    for n in nodes:
        await n.link.start()
    for n in nodes:
        await n.link.wait_connected(timeout)


async def stop_all(nodes: Sequence[Writer | Reader]) -> None:
    """Stop every node's link, then close the readers' followers and the writers' publishers."""
    for n in nodes:
        await n.link.stop()
    for n in nodes:
        if isinstance(n, Reader):
            await n.follower.close()
        else:
            n.publisher.close()


async def settle(writers: Sequence[Writer], readers: Sequence[Reader], timeout: float = 30.0) -> None:
    """Wait until every reader reached every writer's final position."""
    for w in writers:
        final = w.stream.current_token()
        for r in readers:
            await r.follower.wait_for_position(STREAM, w.name, final, timeout)


def assert_exact(writers: Sequence[Writer], readers: Sequence[Reader]) -> None:
    """Each reader holds exactly each writer's written facts: nothing lost, duplicated or reordered."""
    for r in readers:
        for w in writers:
            got = r.got.get(w.name, [])
            first = next((i for i, (a, b) in enumerate(zip(got, w.written)) if a != b), min(len(got), len(w.written)))
            assert got == w.written, (
                f"{r.name} from {w.name}: {len(got)} facts delivered, {len(w.written)} written; first difference at "
                f"{first}: {got[first:first + 3]} vs {w.written[first:first + 3]}"
            )


def random_fact(rng: random.Random, writer: str, i: int) -> list[Any] | None:
    """Mostly one row, sometimes several (a batch), sometimes none (a hole)."""
    roll = rng.random()
    if roll < 0.1:
        return None
    n = 1 if roll < 0.8 else rng.randint(2, 4)
    return [[f"@{writer}-{i}-{k}:hs"] for k in range(n)]


def complete_at_random(rng: random.Random, streams: Sequence[str], local: Mapping[str, LocalStream],
                       committed: Mapping[str, dict[int, list[Any]]], n: int, *tag: Any) -> int:
    """One step of a chaos producer: on a random stream, reserve 1-4 tokens and complete them out of order.

    About 15% become rollback holes; every other one commits a fact of 1, 2 or 5 rows
    ``[*tag, stream, token, row, n]`` (``n`` counts the committed facts), recorded in
    ``committed[stream][token]``. Returns the new ``n``.
    """
    s = rng.choice(streams)
    ls = local[s]
    tokens = [ls.reserve() for _ in range(rng.randint(1, 4))]
    rng.shuffle(tokens)  # complete out of order
    for t in tokens:
        if rng.random() < 0.15:
            ls.complete(t, None)  # rollback: a hole
        else:
            rows = [[*tag, s, t, i, n] for i in range(rng.choice([1, 1, 1, 2, 5]))]
            n += 1
            committed[s][t] = rows
            ls.complete(t, rows)
    return n
