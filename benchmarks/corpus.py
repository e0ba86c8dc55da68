"""A seeded, realistic mixed replication corpus for the codec benchmarks.

About 70% RDATA spread over the busy streams (events, caches, receipts,
typing, presence, to_device, account_data, device_lists) with their Synapse
row shapes, runs of ``batch`` rows, POSITION, PING, USER_SYNC, USER_IP,
FEDERATION_ACK and the odd rarer command. Non-ASCII text appears as Synapse
writes it (``\\uXXXX``), so the lines are canonical.
"""

from __future__ import annotations

import json
import random

_ENC = json.JSONEncoder(separators=(",", ":"))

WRITERS = ["master", "event_persister1", "event_persister2"]
EVENT_TYPES = ["m.room.message", "m.room.member", "m.reaction", "m.room.encrypted", "m.room.name", "m.typing"]
NAMES = ["alice", "bob", "carol", "dave", "zoë", "mallory", "chloé", "ünal", "наталья", "李"]


def _user(rng: random.Random) -> str:
    return f"@{rng.choice(NAMES)}{rng.randrange(1000)}:example.org"


def _room(rng: random.Random) -> str:
    return f"!{rng.getrandbits(64):016x}:example.org"


def _event_id(rng: random.Random) -> str:
    return "$" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(43))


def _row(rng: random.Random, stream: str) -> object:
    if stream == "events":
        if rng.random() < 0.8:
            etype = rng.choice(EVENT_TYPES)
            member = etype == "m.room.member"
            return ["ev", [_event_id(rng), _room(rng), etype, _user(rng) if member else None, None,
                           rng.choice([None, None, "m.thread", "m.annotation"]), "join" if member else None, False, False]]
        return ["state", [_room(rng), "m.room.member", _user(rng), _event_id(rng)]]
    if stream == "caches":
        return [rng.choice(["get_user_by_id", "cs_cache_fake", "get_room_summary", "get_users_in_room"]),
                [_user(rng)] if rng.random() < 0.9 else None, 1_700_000_000_000 + rng.randrange(10**9)]
    if stream == "receipts":
        return [_room(rng), "m.read", _user(rng), _event_id(rng), None, {"ts": 1_700_000_000_000 + rng.randrange(10**9)}, None]
    if stream == "typing":
        return [_room(rng), [_user(rng) for _ in range(rng.randrange(3))]]
    if stream == "presence":
        return [_user(rng), rng.choice(["online", "unavailable", "offline"]), 1_700_000_000_000, 1_700_000_000_000,
                1_700_000_000_000, None, rng.random() < 0.5]
    if stream == "to_device":
        return [_user(rng) if rng.random() < 0.7 else "federation.example.com"]
    if stream == "account_data":
        return [_user(rng), _room(rng) if rng.random() < 0.5 else None, "m.fully_read"]
    return [_user(rng), None]  # device_lists


STREAM_WEIGHTS = {"events": 30, "caches": 25, "receipts": 12, "typing": 10, "presence": 10, "to_device": 6,
                  "account_data": 4, "device_lists": 3}


def generate(n_lines: int, seed: int = 1234) -> list[bytes]:
    """``n_lines`` replication lines (no newlines), the same for the same seed."""
    rng = random.Random(seed)
    streams = list(STREAM_WEIGHTS)
    weights = list(STREAM_WEIGHTS.values())
    tokens = {(s, w): 1 for s in streams for w in WRITERS}
    out: list[bytes] = []
    while len(out) < n_lines:
        r = rng.random()
        if r < 0.70:
            stream = rng.choices(streams, weights)[0]
            writer = rng.choice(WRITERS) if stream in ("events", "caches") else "master"
            tokens[stream, writer] += rng.randrange(1, 4)
            token = tokens[stream, writer]
            batch = rng.randrange(1, 4) if rng.random() < 0.1 else 0
            for _ in range(batch):
                out.append(f"RDATA {stream} {writer} batch {_ENC.encode(_row(rng, stream))}".encode())
            out.append(f"RDATA {stream} {writer} {token} {_ENC.encode(_row(rng, stream))}".encode())
        elif r < 0.80:
            stream = rng.choice(streams)
            prev = tokens[stream, "master"]
            tokens[stream, "master"] += rng.randrange(0, 3)
            out.append(f"POSITION {stream} master {prev} {tokens[stream, 'master']}".encode())
        elif r < 0.88:
            out.append(f"PING {1_700_000_000_000 + len(out)}".encode())
        elif r < 0.94:
            state = rng.choice(["start", "end"])
            device = rng.choice(["None", "ABCDEFGHIJ"])
            out.append(f"USER_SYNC generic_worker1 {_user(rng)} {device} {state} {1_700_000_000_000 + len(out)}".encode())
        elif r < 0.98:
            fields = ["syt_" + "x" * 20, f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
                      "Mozilla/5.0 (X11; Linux x86_64) Element/1.11", rng.choice([None, "ABCDEFGHIJ"]), 1_700_000_000_000]
            out.append(f"USER_IP {_user(rng)} {_ENC.encode(fields)}".encode())
        else:
            out.append(rng.choice([b"FEDERATION_ACK federation_sender1 %d" % len(out), b"REMOTE_SERVER_UP other.example.org",
                                   b'LOCK_RELEASED ["master","purge_room","!abc:example.org"]', b"NAME generic_worker1"]))
    return out[:n_lines]
