"""Seeded generator of large replication archives for benchmarks/bench_spark.py.

Two archives, each written twice (plain files and gzip files):

- *unprefixed* (``OUT/plain``, ``OUT/gzip``): bare wire lines split into
  ``--files`` files, as a rotated capture of a raw stream would be;
- *recorded* (``OUT/recorded/plain``, ``OUT/recorded/gzip``): what users
  have: 75% of the lines in files written the way ``factstream record``
  writes them (``2026-11-21T10:00:00.051Z > RDATA ...``; ``<`` for what the
  client sent; ``# disconnected``/``# connected`` notes around a reconnect),
  10% in a bare wire-line file, 10% in a ``redis-cli MONITOR`` capture and
  5% in a ``redis-cli --csv SUBSCRIBE`` capture.

Lines look like Synapse's: events rows (``ev``/``state``/``state-all``) about
half of them, caches rows, typing/receipts/presence/to_device rows, batches,
POSITION, PING, USER_SYNC and about 0.1% malformed lines. Big archives go under
build/ or /tmp, never into git; each archive's MANIFEST.json sits next to its
plain/ and gzip/ directories, not inside them.

    python benchmarks/gen_archive.py --lines 1000000 --out build/bench-archive
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time

SEED = 20261122
#: Bumped when what a seed generates changes, so that an archive generated before is generated again.
VERSION = 2

_TYPES = ["m.room.message"] * 6 + ["m.room.member", "m.reaction", "m.room.encrypted", "m.room.name", "m.room.redaction"]
_CACHES = ["get_user_by_id", "cs_cache_fake", "get_rooms_for_user", "get_room_summary", "_get_joined_users_from_context"]
_BAD = [
    "RDATA events master notanumber []",
    "POSITION events master 5",
    "HELLO world",
    'RDATA caches master 9 ["get_user_by_id",',
]


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def generate(n: int, seed: int = SEED):  # type: ignore[no-untyped-def]
    """Yield ``n`` replication lines (str, no newline), deterministic for ``seed``."""
    rng = random.Random(seed)
    rand = rng.random
    tokens = {"events": 1_000_000, "caches": 5_000_000, "typing": 10, "receipts": 2_000, "presence": 700, "to_device": 50_000}
    writers = ["event_persister1", "event_persister2", "master"]
    ts = 1_795_300_000_000
    open_runs: set[tuple[str, str]] = set()  # (stream, writer) with batch rows not yet closed
    for i in range(n):
        r = rand()
        ts += 3
        if r < 0.001:
            yield _BAD[i % len(_BAD)]
        elif r < 0.50:
            w = writers[i % 3]
            room = f"!r{rng.randrange(5000):05d}abcdefgh:example.com"
            k = rand()
            if k < 0.8:
                typ = _TYPES[rng.randrange(len(_TYPES))]
                sk = f"@user{rng.randrange(100000)}:example.com" if typ == "m.room.member" else None
                row = ["ev", [f"${rng.getrandbits(96):024x}", room, typ, sk, None,
                              f"${rng.getrandbits(64):016x}" if typ == "m.reaction" else None,
                              ("join" if k < 0.5 else "leave") if sk else None, False, k < 0.05]]
            elif k < 0.95:
                row = ["state", [room, "m.room.member", f"@user{rng.randrange(100000)}:example.com", f"${rng.getrandbits(96):024x}"]]
            else:
                row = ["state-all", [room]]
            if rand() < 0.05:
                tok = "batch"  # a batch row carries the token of the row that closes its run: it uses none
                open_runs.add(("events", w))
            else:
                tokens["events"] += 1
                tok = str(tokens["events"])
                open_runs.discard(("events", w))
            yield f"RDATA events {w} {tok} {_dumps(row)}"
        elif r < 0.70:
            keys = None if rand() < 0.1 else [f"@user{rng.randrange(100000)}:example.com"]
            row = [_CACHES[rng.randrange(len(_CACHES))], keys, ts]
            if rand() < 0.1:
                tok = "batch"
                open_runs.add(("caches", "master"))
            else:
                tokens["caches"] += 1
                tok = str(tokens["caches"])
                open_runs.discard(("caches", "master"))
            yield f"RDATA caches master {tok} {_dumps(row)}"
        elif r < 0.85:
            s = ("typing", "receipts", "presence", "to_device")[rng.randrange(4)]
            tokens[s] += 1
            if s == "typing":
                row = [f"!r{rng.randrange(5000):05d}abcdefgh:example.com", [f"@user{rng.randrange(100000)}:example.com"]]
            elif s == "receipts":
                row = [f"!r{rng.randrange(5000):05d}abcdefgh:example.com", "m.read", f"@user{rng.randrange(100000)}:example.com",
                       f"${rng.getrandbits(96):024x}", None, {"ts": ts}]
            elif s == "presence":
                row = [f"@user{rng.randrange(100000)}:example.com", "online", ts, ts, ts, None, True]
            else:
                row = [f"@user{rng.randrange(100000)}:example.com"]
            yield f"RDATA {s} master {tokens[s]} {_dumps(row)}"
        elif r < 0.92:
            s = ("events", "caches", "typing", "receipts")[rng.randrange(4)]
            w = writers[i % 3] if s == "events" else "master"
            if (s, w) in open_runs:  # a writer sends no POSITION inside a batch run: its closing row comes first
                yield f"PING {ts}"
                continue
            prev = tokens[s]
            # a single writer advancing over ids it used for nothing (they are gone); the events writers share
            # one sequence, where such ids would show in every writer's POSITION: theirs say where they are
            if s != "events" and rand() < 0.2:
                tokens[s] += 3
            yield f"POSITION {s} {w} {prev} {tokens[s]}"
        elif r < 0.97:
            yield f"PING {ts}"
        else:
            yield f"USER_SYNC worker1 @user{rng.randrange(100000)}:example.com None start {ts}"


def write(out: str, lines: int, files: int, seed: int = SEED, level: int = 6) -> tuple[str, str]:
    """Write ``out``/plain/part-NN.log and ``out``/gzip/part-NN.log.gz; return both directories."""
    plain_dir, gz_dir = os.path.join(out, "plain"), os.path.join(out, "gzip")
    os.makedirs(plain_dir, exist_ok=True)
    os.makedirs(gz_dir, exist_ok=True)
    per_file = -(-lines // files)
    it = generate(lines, seed)
    for f in range(files):
        chunk = []
        for _ in range(min(per_file, lines - f * per_file)):
            chunk.append(next(it))
        data = ("\n".join(chunk) + "\n").encode()
        with open(os.path.join(plain_dir, f"part-{f:02d}.log"), "wb") as fh:
            fh.write(data)
        with gzip.open(os.path.join(gz_dir, f"part-{f:02d}.log.gz"), "wb", compresslevel=level) as fh:
            fh.write(data)
    with open(os.path.join(out, "MANIFEST.json"), "w") as fh:
        json.dump({"lines": lines, "files": files, "seed": seed, "version": VERSION}, fh)
    return plain_dir, gz_dir


# ------------------------------------------------------------ recorded traffic

#: (kind, share of the lines) of the recorded archive's files.
RECORDED_FILES = [("prefixed", 0.125)] * 6 + [("bare", 0.10), ("monitor", 0.10), ("csv", 0.05)]
_CLIENT = ("USER_SYNC", "FEDERATION_ACK", "REPLICATE", "CLEAR_USER_SYNC", "USER_IP", "REMOTE_SERVER_UP")
_START_MS = 1_795_255_200_000  # 2026-11-21T10:00:00Z


def _redis_quote(line: str) -> str:
    return '"' + line.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _iso(ms: int, cache: dict[int, str] = {}) -> str:  # noqa: B006 (a per-second cache)
    sec, milli = divmod(ms, 1000)
    head = cache.get(sec)
    if head is None:
        cache.clear()
        head = cache[sec] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    return f"{head}.{milli:03d}Z"


def recorded_lines(kind: str, lines: list[str], start_ms: int, seed: int) -> list[str]:
    """``lines`` as a file of ``kind`` would hold them (see RECORDED_FILES)."""
    rng = random.Random(seed)
    ms = start_ms
    out = []
    for i, line in enumerate(lines):
        ms += rng.randrange(3)
        if kind == "bare":
            out.append(line)
        elif kind == "monitor":
            us = rng.randrange(1000)
            out.append(f'{ms // 1000}.{ms % 1000:03d}{us:03d} [0 10.0.0.7:51234] "PUBLISH" "example.com" {_redis_quote(line)}')
        elif kind == "csv":
            out.append(f'"message","example.com",{_redis_quote(line)}')
        else:
            direction = "<" if line.startswith(_CLIENT) or (line.startswith("PING") and i % 2) else ">"
            out.append(f"{_iso(ms)} {direction} {line}")
            if i == len(lines) // 2:  # a reconnect in each file: the recorder's notes around the hole
                ms += 2_000
                out.append(f"{_iso(ms)} # disconnected connection reset by peer")
                ms += 1_500
                out.append(f"{_iso(ms)} # connected 10.0.0.4:9092")
    if kind == "monitor":
        out.insert(0, "OK")
    elif kind == "csv":
        out[:0] = ["Reading messages... (press Ctrl-C to quit)", '"subscribe","example.com",1']
    return out


def write_recorded(out: str, lines: int, seed: int = SEED, level: int = 6) -> tuple[str, str]:
    """Write the recorded archive under ``out``/plain and ``out``/gzip; return both directories."""
    plain_dir, gz_dir = os.path.join(out, "plain"), os.path.join(out, "gzip")
    os.makedirs(plain_dir, exist_ok=True)
    os.makedirs(gz_dir, exist_ok=True)
    it = generate(lines, seed + 1)
    left = lines
    for f, (kind, share) in enumerate(RECORDED_FILES):
        count = left if f == len(RECORDED_FILES) - 1 else round(lines * share)
        left -= count
        chunk = [next(it) for _ in range(count)]
        # the recorder's names: the six prefixed files are one capture rotated hourly (<capture>.<start>.<seq>)
        start = time.strftime("%Y%m%dT%H%M%S", time.gmtime((_START_MS + f * 3_600_000) // 1000))
        name = {"prefixed": f"hs1-9092.{start}000000Z.{f:06d}.log", "bare": "raw-tcp.log", "monitor": "redis-monitor.txt",
                "csv": "redis-subscribe.csv"}[kind]
        data = ("\n".join(recorded_lines(kind, chunk, _START_MS + f * 3_600_000, seed + f)) + "\n").encode()
        with open(os.path.join(plain_dir, name), "wb") as fh:
            fh.write(data)
        with gzip.open(os.path.join(gz_dir, name + ".gz"), "wb", compresslevel=level) as fh:
            fh.write(data)
    with open(os.path.join(out, "MANIFEST.json"), "w") as fh:
        json.dump({"lines": lines, "seed": seed, "files": RECORDED_FILES, "version": VERSION}, fh)
    return plain_dir, gz_dir


def ensure_recorded(out: str, lines: int, seed: int = SEED) -> tuple[str, str]:
    """Generate the recorded archive under ``out``/recorded unless it already holds the same one."""
    root = os.path.join(out, "recorded")
    try:
        with open(os.path.join(root, "MANIFEST.json")) as fh:
            if json.load(fh) == json.loads(json.dumps({"lines": lines, "seed": seed, "files": RECORDED_FILES,
                                                             "version": VERSION})):
                return os.path.join(root, "plain"), os.path.join(root, "gzip")
    except (OSError, ValueError):
        pass
    return write_recorded(root, lines, seed)


def ensure(out: str, lines: int, files: int, seed: int = SEED) -> tuple[str, str]:
    """Generate the archive unless ``out`` already holds the same one."""
    manifest = os.path.join(out, "MANIFEST.json")
    try:
        with open(manifest) as fh:
            if json.load(fh) == {"lines": lines, "files": files, "seed": seed, "version": VERSION}:
                return os.path.join(out, "plain"), os.path.join(out, "gzip")
    except (OSError, ValueError):
        pass
    return write(out, lines, files, seed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--out", default="build/bench-archive")
    args = p.parse_args()
    t = time.perf_counter()
    plain, gz = ensure(args.out, args.lines, args.files, args.seed)
    rplain, rgz = ensure_recorded(args.out, args.lines, args.seed)
    print(f"{args.lines} lines in {plain} and {gz}, recorded in {rplain} and {rgz} ({time.perf_counter() - t:.1f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
