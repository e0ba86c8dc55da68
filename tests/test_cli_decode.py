"""``factstream decode``: counts, token ranges and bad lines, as text and JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
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
