"""Small, seeded replication archives in every supported format, with what each line holds.

The tests parse these with Spark and compare every column of every line with
what ``wire.parse_line`` says about the payload. Redis quoting is written here
independently of the parser's unquoting (as redis-cli's ``sdscatrepr`` does).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import random
from dataclasses import dataclass

__all__ = ["Expected", "write_archives", "protocol_lines", "redis_quote", "REPORT_ARCHIVE"]


@dataclass(frozen=True)
class Expected:
    """One payload-bearing line of an archive file."""

    line_number: int
    payload: bytes
    ts: str | None = None
    direction: str | None = None
    channel: str | None = None
    error: bool = False  # the archive wrapper itself is broken (not the payload)


def redis_quote(data: bytes) -> bytes:
    """Quote bytes the way redis-cli prints a string reply or MONITOR argument."""
    out = bytearray(b'"')
    for b in data:
        c = bytes((b,))
        if c in (b"\\", b'"'):
            out += b"\\" + c
        elif c == b"\n":
            out += b"\\n"
        elif c == b"\r":
            out += b"\\r"
        elif c == b"\t":
            out += b"\\t"
        elif c == b"\a":
            out += b"\\a"
        elif c == b"\b":
            out += b"\\b"
        elif 32 <= b < 127:
            out += c
        else:
            out += b"\\x%02x" % b
    return bytes(out + b'"')


_EVENT_TYPES = ["m.room.message", "m.room.member", "m.reaction", "m.room.name", "m.room.encrypted"]


def _events_row(rng: random.Random, n: int) -> list:
    kind = rng.choice(["ev", "ev", "ev", "state", "state-all"])
    room = f"!room{rng.randint(1, 30)}:example.com"
    if kind == "ev":
        typ = rng.choice(_EVENT_TYPES)
        state_key = f"@u{n}:example.com" if typ == "m.room.member" else (None if rng.random() < 0.7 else "")
        return [
            "ev",
            [
                f"$ev{n}_{rng.randint(0, 10**6)}:example.com",
                room,
                typ,
                state_key,
                f"$red{n}" if rng.random() < 0.05 else None,
                f"$rel{n}" if typ == "m.reaction" else None,
                rng.choice(["join", "leave"]) if typ == "m.room.member" else None,
                rng.random() < 0.02,
                rng.random() < 0.1,
            ],
        ]
    if kind == "state":
        return ["state", [room, "m.room.topic", "", None if rng.random() < 0.2 else f"$st{n}:example.com"]]
    return ["state-all", [room]]


def _caches_row(rng: random.Random, n: int) -> list:
    keys = rng.choice([None, [f"@u{n}:example.com"], [f"!r{n}:example.com", "m.room.member"], [n, "x"]])
    return [rng.choice(["get_user_by_id", "cs_cache_fake", "get_rooms_for_user"]), keys, 1_700_000_000_000 + n]


_BAD = [
    b"RDATA events master notanumber []",
    b"POSITION events master 5",
    b"HELLO world",
    b'RDATA caches master 9 ["get_user_by_id",',
    b"RDATA events master 99999999999999999999 []",
    "RDATA events master 3 [\"caf\u00e9\"]".encode() + b"\xff",
]


def protocol_lines(seed: int, count: int, bad_every: int = 17) -> list[bytes]:
    """``count`` replication lines (JSON rows as Synapse writes them), some malformed."""
    rng = random.Random(seed)
    out: list[bytes] = []
    tokens = {"events": 100, "caches": 500, "typing": 7}
    for n in range(count):
        if bad_every and n % bad_every == bad_every - 1:
            out.append(_BAD[n % len(_BAD)])
            continue
        r = rng.random()
        writer = rng.choice(["master", "event_persister1"])
        if r < 0.45:
            tokens["events"] += rng.choice([1, 1, 1, 2])
            row = _events_row(rng, n)
            tok = "batch" if rng.random() < 0.1 else str(tokens["events"])
            out.append(f"RDATA events {writer} {tok} {json.dumps(row, separators=(',', ':'))}".encode())
        elif r < 0.7:
            tokens["caches"] += 1
            row = _caches_row(rng, n)
            tok = "batch" if rng.random() < 0.2 else str(tokens["caches"])
            out.append(f"RDATA caches master {tok} {json.dumps(row, separators=(',', ':'))}".encode())
        elif r < 0.78:
            tokens["typing"] += 1
            row = [f"!room{n}:example.com", [f"@u{n}:example.com"]]
            out.append(f"RDATA typing master {tokens['typing']} {json.dumps(row, separators=(',', ':'))}".encode())
        elif r < 0.86:
            s = rng.choice(list(tokens))
            out.append(f"POSITION {s} master {tokens[s]} {tokens[s] + rng.choice([0, 0, 3])}".encode())
        elif r < 0.92:
            out.append(f"PING {1_700_000_000_000 + n}".encode())
        elif r < 0.95:
            out.append(b"REPLICATE")
        elif r < 0.97:
            out.append(f"USER_SYNC worker1 @u{n}:example.com None start {n}".encode())
        else:
            out.append(f"FEDERATION_ACK federation_sender1 {n}".encode())
    return out


def _ts(i: int) -> str:
    base = dt.datetime(2026, 11, 21, 23, 59, 0, tzinfo=dt.timezone.utc)
    return (base + dt.timedelta(seconds=i * 0.75)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def write_archives(root: str, seed: int = 7, count: int = 400) -> dict[str, list[Expected]]:
    """Write one archive per format under ``root``; return file path -> expected lines."""
    os.makedirs(root, exist_ok=True)
    rng = random.Random(seed)
    expected: dict[str, list[Expected]] = {}

    def save(name: str, lines: list[bytes], exp: list[Expected], compress: bool = False) -> None:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = b"".join(line + b"\n" for line in lines)
        with (gzip.open(path, "wb") if compress else open(path, "wb")) as fh:
            fh.write(data)
        expected[path] = exp

    # plain, with a blank line and whitespace-only line the protocol ignores
    lines = protocol_lines(seed, count)
    body = lines[:10] + [b"", b"   "] + lines[10:]
    exp = [Expected(i + 1, line) for i, line in enumerate(body) if line.strip()]
    save("plain.log", body, exp)

    # the same kind of traffic, gzip, no trailing newline issue: ends with newline
    lines = protocol_lines(seed + 1, count)
    save("rotated/plain.log.gz", lines, [Expected(i + 1, line) for i, line in enumerate(lines)], compress=True)

    # timestamp and/or direction prefixes
    lines = protocol_lines(seed + 2, count)
    body, exp = [], []
    for i, line in enumerate(lines):
        style = i % 4
        ts = _ts(i)
        if style == 0:
            body.append(f"{ts} > ".encode() + line)
            exp.append(Expected(i + 1, line, ts, ">"))
        elif style == 1:
            body.append(b"< " + line)
            exp.append(Expected(i + 1, line, None, "<"))
        elif style == 2:
            t2 = ts.replace("T", " ").replace(".", ",").replace("Z", "+00:00")
            body.append(f"{t2} ".encode() + line)
            exp.append(Expected(i + 1, line, t2, None))
        else:
            body.append(line)
            exp.append(Expected(i + 1, line))
    save("prefixed.log", body, exp)

    # redis-cli MONITOR
    lines = protocol_lines(seed + 3, count)
    body, exp = [b"OK"], []
    for i, line in enumerate(lines):
        when = f"{1795310400 + i}.{rng.randint(0, 999999):06d}"
        if i % 50 == 25:
            body.append(f'{when} [0 127.0.0.1:5000] "SUBSCRIBE" "synapse.replication"'.encode())
        if i % 61 == 60:
            body.append(b"1795310400 garbage without brackets")
            exp.append(Expected(len(body), body[-1], None, None, None, error=True))
        body.append(f"{when} [0 127.0.0.1:5000] ".encode() + b'"PUBLISH" "synapse.replication" ' + redis_quote(line))
        exp.append(Expected(len(body), line, when, None, "synapse.replication"))
    save("monitor.txt", body, exp)

    # redis-cli --csv SUBSCRIBE
    lines = protocol_lines(seed + 4, count)
    body = [b"Reading messages... (press Ctrl-C to quit)", b'"subscribe","synapse.replication",1']
    exp = []
    for line in lines:
        body.append(b'"message","synapse.replication",' + redis_quote(line))
        exp.append(Expected(len(body), line, None, None, "synapse.replication"))
    save("capture.csv", body, exp)

    # redis-cli SUBSCRIBE piped: three lines per message
    lines = protocol_lines(seed + 5, count // 4)
    body = [b"subscribe", b"synapse.replication", b"1"]
    exp = []
    for line in lines:
        body += [b"message", b"synapse.replication", line]
        exp.append(Expected(len(body), line, None, None, "synapse.replication"))
    save("capture.raw", body, exp)
    return expected


#: A hand-written archive whose report figures are worked out in test_spark.py.
REPORT_ARCHIVE = """\
2026-11-22T10:00:00Z > POSITION events master 10 10
2026-11-22T10:00:01Z > RDATA events master 11 ["ev",["$a:hs","!r:hs","m.room.message",null,null,null,null,false,false]]
2026-11-22T10:00:02Z > RDATA events master 12 ["ev",["$b:hs","!r:hs","m.room.message",null,null,null,null,false,false]]
2026-11-22T10:00:03Z > RDATA events master 15 ["ev",["$c:hs","!r:hs","m.room.message",null,null,null,null,false,false]]
2026-11-22T10:00:04Z > RDATA events master 14 ["ev",["$d:hs","!r:hs","m.room.message",null,null,null,null,false,false]]
2026-11-22T10:00:05Z > POSITION events master 18 20
2026-11-22T10:00:06Z > RDATA caches master batch ["get_user_by_id",["@a:hs"],1]
2026-11-22T10:00:06Z > RDATA caches master batch ["get_user_by_id",["@b:hs"],1]
2026-11-22T10:00:07Z > RDATA caches master 7 ["get_user_by_id",["@c:hs"],1]
2026-11-22T10:00:08Z > RDATA caches master batch ["get_user_by_id",["@d:hs"],1]
2026-11-22T10:00:09Z > POSITION caches master 7 9
this line is not a command
< PING 1700000000000
"""
