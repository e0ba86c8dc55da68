"""A factstream writer in its own process, for bench_tcp.py's reader-in-its-own-process rows.

``LocalStream`` -> ``Publisher`` -> hub -> ``TcpServer``, the same path as the
in-process rows. Prints its port; once a reader replicates it prints
``ready``; on ``go`` (stdin) it writes N one-row facts, one ``write`` each and
256 per loop turn, then prints ``done <cpu seconds>`` when the last one was
handed to the socket, and serves until stdin closes.

Usage: python tcp_writer.py N LOOP IMPL  (LOOP: uvloop|asyncio, IMPL: c|py)
"""

from __future__ import annotations

import asyncio
import sys
import time

from factstream import _compat
from factstream.replication import LocalStream, MemoryUpdateSource, Publisher, ReplicationHub
from factstream.transport.tcp import TcpServer

TURN = 256


def rows(n: int) -> list[list[object]]:
    """The rows bench_tcp.py's in-process rows write (``ev`` rows of the events stream)."""
    return [
        ["ev", [f"$ev{i}abcdefghij:bench.hs", f"!room{i % 50}:bench.hs", "m.room.message", None, None, None, None, False, False]]
        for i in range(n)
    ]


async def serve(n: int, impl: str) -> None:
    codec, relay = _compat.load("_wire", impl), _compat.load("replication._relay", impl)
    facts = rows(n)
    ls = LocalStream("events", "master", source=MemoryUpdateSource(capacity=n * 2, relay=relay))
    pub = Publisher("master", relay=relay)
    pub.add_stream("events", ls.source, 0)
    ls.add_listener(pub.notify)
    hub = ReplicationHub("master", publisher=pub)
    server = await TcpServer(hub, "bench", codec=codec, relay=relay, max_buffered=100_000_000).start()
    print(server.port, flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while not hub._replicating:
        await asyncio.sleep(0.005)
    print("ready", flush=True)
    assert (await stdin.readline()).strip() == b"go"
    c0 = time.process_time()
    write = ls.write
    for i in range(n):
        write((facts[i],))
        if i % TURN == TURN - 1:
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    print(f"done {time.process_time() - c0:.6f}", flush=True)
    await stdin.read()  # until the benchmark closes our stdin
    await server.stop()


def main() -> None:
    n, loop_kind, impl = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if loop_kind == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(serve(n, impl))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
