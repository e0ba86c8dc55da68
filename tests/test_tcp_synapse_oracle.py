"""What our writer puts on the wire, read back by Synapse 1.163's own parsers (test-only oracle).

A raw client records a whole session from a factstream writer publishing
typed rows of several Synapse streams (events of all three kinds, caches,
typing, receipts, account_data); Synapse's ``parse_command_from_line`` parses
every line and each stream class's ``parse_row`` turns every RDATA row into
Synapse's own row object.
"""

from __future__ import annotations

import asyncio
import json
import subprocess


from factstream.replication import LocalStream, Publisher, ReplicationHub
from factstream.streams import (
    AccountDataRow,
    AllStateRow,
    CachesRow,
    CurrentStateRow,
    EventRow,
    EventsRow,
    ReceiptsRow,
    TypingRow,
)
from factstream.transport.tcp import TcpServer

from conftest import synapse_python


ORACLE = r"""
import json, sys
from synapse.replication.tcp.commands import parse_command_from_line, RdataCommand, PositionCommand
from synapse.replication.tcp.streams import STREAMS_MAP
out = {"commands": {}, "rows": {}, "types": set()}
for line in sys.stdin.read().splitlines():
    if not line.strip():
        continue
    cmd = parse_command_from_line(line)
    out["commands"][cmd.NAME] = out["commands"].get(cmd.NAME, 0) + 1
    if isinstance(cmd, RdataCommand):
        row = STREAMS_MAP[cmd.stream_name].parse_row(cmd.row)
        out["rows"][cmd.stream_name] = out["rows"].get(cmd.stream_name, 0) + 1
        data = getattr(row, "data", None)
        out["types"].add(type(data).__name__ if cmd.stream_name == "events" else type(row).__name__)
out["types"] = sorted(out["types"])
print(json.dumps(out))
"""


async def test_synapse_parses_every_line_and_row_we_send() -> None:
    pub = Publisher("master")
    streams = {}
    for name in ("events", "caches", "typing", "receipts", "account_data"):
        ls = LocalStream(name, "master")
        pub.add_stream(name, ls.source, 0)
        ls.add_listener(pub.notify)
        streams[name] = ls
    server = await TcpServer(ReplicationHub("master", publisher=pub), "oracle.hs").start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"NAME oracle\nPING 1\nREPLICATE\n")
    await asyncio.sleep(0.05)
    streams["events"].write([
        EventsRow.of(EventRow("$e1:hs", "!r:hs", "m.room.member", "@a:hs", None, None, "join", False, False)),
        EventsRow.of(CurrentStateRow("!r:hs", "m.room.member", "@a:hs", "$e1:hs")),
    ])
    streams["events"].write([EventsRow.of(AllStateRow("!r:hs"))])
    streams["events"].write([EventsRow.of(EventRow("$e2:hs", "!r:hs", "m.room.message", None, None, "$e1:hs", None, False, True))])
    streams["caches"].write([CachesRow("get_user_by_id", ["@é:hs"], 1), CachesRow("cs_cache_fake", None, 2)])
    streams["typing"].write([TypingRow("!r:hs", ["@a:hs", "@b:hs"])])
    streams["receipts"].write([ReceiptsRow("!r:hs", "m.read", "@a:hs", "$e2:hs", None, {"ts": 5, "thread_id": None})])
    t = streams["account_data"].reserve()
    streams["account_data"].complete(t, None)  # a hole: POSITION
    streams["account_data"].write([AccountDataRow("@a:hs", None, "m.direct")])
    await asyncio.sleep(0.1)
    writer.close()
    data = b""
    while chunk := await asyncio.wait_for(reader.read(65536), 2):
        data += chunk
    await server.stop()

    proc = subprocess.run([synapse_python(), "-c", ORACLE], input=data.decode(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["commands"]["SERVER"] == 1 and seen["commands"]["POSITION"] >= 6
    assert seen["rows"] == {"events": 4, "caches": 2, "typing": 1, "receipts": 1, "account_data": 1}
    assert {"EventsStreamEventRow", "EventsStreamCurrentStateRow", "EventsStreamAllStateRow"} <= set(seen["types"])
    assert {"CachesStreamRow", "TypingStreamRow", "ReceiptsStreamRow", "AccountDataStreamRow"} <= set(seen["types"])
