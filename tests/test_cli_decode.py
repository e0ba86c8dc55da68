"""``factstream decode``: counts, token ranges and bad lines, as text and JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

LOG = b"""SERVER hs
REPLICATE
POSITION events master 1 3
RDATA events master batch ["ev",["$a:hs","!r:hs","m.room.message",null,null,null,null,false,false]]
RDATA events master 4 ["ev",["$b:hs","!r:hs","m.room.message",null,null,null,null,false,false]]

RDATA caches worker1 7 ["get_user_by_id",["@u:hs"],1]
RDATA caches worker1 1_000 []
NOPE
"""


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "factstream.cli", "decode", *args], input=stdin, capture_output=True)


def test_json_summary(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(LOG)
    res = run("--json", str(path))
    assert res.returncode == 1  # bad lines present
    doc = json.loads(res.stdout)
    assert doc["lines"] == 8
    assert doc["commands"] == {"POSITION": 1, "RDATA": 3, "REPLICATE": 1, "SERVER": 1}
    streams = {(s["stream"], s["instance"]): s for s in doc["streams"]}
    assert streams["events", "master"] == {"stream": "events", "instance": "master", "rows": 2, "batch_rows": 1,
                                           "positions": 1, "min_token": 1, "max_token": 4}
    assert streams["caches", "worker1"]["min_token"] == 7
    assert [(e["line"], "not an integer" in e["reason"] or "unknown command" in e["reason"]) for e in doc["errors"]] == [
        (8, True), (9, True)]
    assert all(e["file"] == str(path) for e in doc["errors"])


def test_text_output_stdin_and_gzip(tmp_path: Path) -> None:
    gz = tmp_path / "b.log.gz"
    gz.write_bytes(gzip.compress(LOG))
    res = run(str(gz))
    text = res.stdout.decode()
    assert "8 lines, 2 bad" in text and f"{gz}:9: unknown command 'NOPE'" in text
    clean = run(stdin=b"PING 1\nPOSITION s w 1 2\n")
    assert clean.returncode == 0 and b"2 lines, 0 bad" in clean.stdout


def test_missing_file_says_so(tmp_path: Path) -> None:
    res = run(str(tmp_path / "nope.log"))
    assert res.returncode == 2 and b"cannot read" in res.stderr


def test_help_explains_itself() -> None:
    res = run("--help")
    assert res.returncode == 0 and b"bad line" in res.stdout


def test_sample_log_ships_and_decodes() -> None:
    res = run("--sample", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["error_count"] == 4  # the sample holds four deliberately bad lines
    assert doc["commands"]["RDATA"] == 10 and {e["line"] for e in doc["errors"]} == {26, 27, 28, 29}


# ------------------------------------------------ every archive format, the installed executable

def factstream_exe() -> str:
    """The ``factstream`` console script installed next to this Python (what users run)."""
    exe = Path(sys.executable).parent / "factstream"
    assert exe.exists(), f"{exe} is missing: run 'make install'"
    return str(exe)


def decode(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([factstream_exe(), "decode", *args], capture_output=True, timeout=120)


PAYLOADS = [
    b"POSITION events master 1 3",
    b'RDATA events master 4 ["ev",["$b:hs","!r:hs","m.room.message",null,null,null,null,false,false]]',
    b'RDATA caches worker1 7 ["get_user_by_id",["@u:hs"],1]',
    b"PING 1700000000000",
    b"NOPE",
]


def _quote(payload: bytes) -> bytes:
    sys.path.insert(0, str(Path(__file__).parent))
    import spark_archives

    return spark_archives.redis_quote(payload)


def _formats() -> dict[str, bytes]:
    prefixed = [b"2026-11-24T11:00:00.%03dZ > " % i + p for i, p in enumerate(PAYLOADS)]
    prefixed.insert(2, b"2026-11-24T11:00:00.100Z # disconnected connection reset by peer")
    prefixed.insert(3, b"2026-11-24T11:00:05.000Z # connected 127.0.0.1:9092")
    mixed = [p if i % 2 else b"< " + p for i, p in enumerate(PAYLOADS)]
    monitor = [b"OK"] + [b'1795310678.%06d [0 127.0.0.1:42798] "PUBLISH" "ch" ' % i + _quote(p) for i, p in enumerate(PAYLOADS)]
    monitor.insert(2, b'1795310679.000001 [0 127.0.0.1:42798] "GET" "x"')
    csv = [b"Reading messages... (press Ctrl-C to quit)", b'"subscribe","ch",1'] + [
        b'"message","ch",' + _quote(p) for p in PAYLOADS]
    raw = [b"subscribe", b"ch", b"1"] + [x for p in PAYLOADS for x in (b"message", b"ch", p)]
    return {name: b"\n".join(lines) + b"\n" for name, lines in
            {"plain": PAYLOADS, "prefixed": prefixed, "mixed": mixed, "monitor": monitor, "csv": csv, "raw": raw}.items()}


def test_decode_reads_every_format_logs_parse_reads(tmp_path: Path) -> None:
    for name, data in _formats().items():
        for path, blob in ((tmp_path / f"{name}.log", data), (tmp_path / f"{name}.log.gz", gzip.compress(data))):
            path.write_bytes(blob)
            res = decode("--json", str(path))
            assert res.returncode == 1, (name, res.stderr)  # NOPE is the one bad line
            doc = json.loads(res.stdout)
            counts = {"POSITION": 1, "RDATA": 2, "PING": 1}
            if name == "prefixed":
                counts.update({"#disconnected": 1, "#connected": 1})
            assert doc["commands"] == counts, name
            assert doc["error_count"] == 1 and "unknown command 'NOPE'" in doc["errors"][0]["reason"], name
            fmt = {"monitor": "monitor", "csv": "redis-csv", "raw": "redis-raw"}.get(name, "lines")
            assert doc["inputs"] == [{"file": str(path), "format": fmt, "problem": None}]
            streams = {(s["stream"], s["instance"]): s for s in doc["streams"]}
            assert streams["events", "master"]["max_token"] == 4 and streams["caches", "worker1"]["rows"] == 1


def test_decode_names_a_broken_gzip_and_reads_the_other_inputs(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.write_bytes(b"PING 1\nPING 2\n")
    data = b"".join(b"2026-11-24T11:00:00.%03dZ > PING %d\n" % (i % 1000, i) for i in range(50_000))
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(gzip.compress(data)[:-4000])
    given = zlib.decompressobj(wbits=31).decompress(truncated.read_bytes())  # everything before the cut
    assert not given.endswith(b"\n")  # cut mid-line
    corrupt = tmp_path / "corrupt.log.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage!" * 64)
    manifest = tmp_path / "MANIFEST.json"
    manifest.write_text('{"lines": 5}\n')
    res = decode(str(truncated), str(good), str(corrupt), str(manifest), str(tmp_path / "missing.log"))
    assert res.returncode == 2
    err = res.stderr.decode()
    assert "Traceback" not in err
    assert f"{truncated}: truncated gzip" in err and "after line" in err
    assert f"{corrupt}: corrupt gzip" in err
    assert f"{manifest}: not a replication archive" in err
    assert "missing.log: cannot read" in err
    out = res.stdout.decode()
    cut_after = int(err.split(f"{truncated}: ")[1].split("after line ")[1].split()[0])
    assert cut_after == given.count(b"\n") and 40_000 < cut_after < 50_000
    # every line before the cut, the line it cut short (a bad line: it ends mid-line), and the good file
    assert f"{cut_after + 3} lines, 1 bad" in out
    assert f"{truncated}:{cut_after + 1}: the file ends mid-line" in out
    assert "inputs not read to the end:" in out


def test_stdin_named_twice_is_a_usage_error_not_a_closed_file(tmp_path: Path) -> None:
    ok = tmp_path / "ok.log"
    ok.write_bytes(b"PING 1\n")
    for args in (("-", "-"), (str(ok), "-", str(ok), "-")):
        res = run(*args, stdin=b"PING 1\n")
        err = res.stderr.decode()
        assert res.returncode == 2, err
        assert err == "factstream decode: '-' (stdin) given 2 times; stdin can be read once: give '-' once\n"
        assert res.stdout == b""


def test_gzip_is_recognised_by_its_content_not_its_name(tmp_path: Path) -> None:
    packed = tmp_path / "capture.log"  # gzip data without .gz
    packed.write_bytes(gzip.compress(LOG))
    for res in (run(str(packed)), run("-", stdin=gzip.compress(LOG))):
        assert res.returncode == 1, res.stderr  # LOG's two bad lines, not an unreadable input
        assert res.stdout.startswith(b"8 lines, 2 bad") and b"not a replication archive" not in res.stderr
    cut = tmp_path / "cut.log"
    cut.write_bytes(gzip.compress(LOG)[:20])
    res = run(str(cut))
    assert res.returncode == 2 and b"truncated gzip" in res.stderr


def test_sample_with_piped_stdin_reads_stdin_only_when_asked() -> None:
    """--sample alone reads the sample only (its help says so); '-' adds stdin."""
    alone = json.loads(run("--sample", "--json", stdin=b"PING 1\n").stdout)
    both = json.loads(run("--sample", "-", "--json", stdin=b"PING 1\n").stdout)
    assert both["lines"] == alone["lines"] + 1
    assert [i["file"] for i in both["inputs"]][0] == "-"
    assert "stdin only if '-' is one" in " ".join(run("--help").stdout.decode().split())
