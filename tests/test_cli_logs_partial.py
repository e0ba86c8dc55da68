"""Archives that are not whole: files cut mid-line, hidden directories, directories given to decode.

A file still being written, or cut short (a recorder killed, a copy
interrupted), ends without a newline: its last line is no line yet (the wire
has a line only once its newline arrives), and a token cut short can look
valid (``POSITION events master 1 12`` cut from ``123``). ``logs parse``
makes it a malformed row, the same in both column builder twins, and
``decode`` counts it as a bad line, with the same reason. Directories walked
for archives leave hidden ones out (``.git``, ``_temporary``, ``.snapshots``:
named on their own they are read), saying so once. ``decode DIR`` is a usage
error pointing to ``logs parse``. The closing count of inputs not read to
their end says what it counts when non-archives were found. The Spark cases
share one run (a JVM start costs ~10 s); its rows are read back with pyarrow.
"""

from __future__ import annotations

import collections
import gzip
import json
import logging
import os
import shutil
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, cli, no_traceback, require_spark_cli
from conftest import require

SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
CUT = "ends mid-line (no newline after its last line): cut short, or still being written"
EV = '["ev",["$e{t}:hs","!r:hs","m.room.message",null,null,null,null,false,false]]'


def _wire(n: int, first: int) -> list[str]:
    """n wire lines: RDATA, and every fifth a POSITION (whose last field is a token)."""
    return [f"POSITION events master {first + i - 1} {first + i}" if i % 5 == 4
            else f"RDATA events master {first + i} {EV.format(t=first + i)}" for i in range(n)]


def _recorded(n: int, first: int) -> list[str]:
    return [f"2026-11-24T10:{(i // 60) % 60:02d}:{i % 60:02d}.000Z > {line}" for i, line in enumerate(_wire(n, first))]


def _monitor(lines: list[str]) -> list[str]:
    return [f'1795300000.{i:06d} [0 127.0.0.1:5555] "PUBLISH" "repl" "{line.replace(chr(34), chr(92) + chr(34))}"'
            for i, line in enumerate(lines)]


def _text(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


#: Whole lines, then the last one cut short (no newline): format -> (archive bytes, the cut bytes).
def _cut_archives() -> dict[str, tuple[bytes, bytes]]:
    rdata = f"RDATA events master 123 {EV.format(t=123)}"
    cut_rdata = rdata[: len("RDATA events master 12")]  # the token looks valid, the row is gone
    monitor_cut = _monitor([rdata])[0][:-40]
    return {
        "lines": (_text(_recorded(40, 1)) + b"2026-11-24T11:00:00.000Z > " + cut_rdata.encode(),
                  b"2026-11-24T11:00:00.000Z > " + cut_rdata.encode()),
        "lines-crlf": (_text(_wire(12, 1)).replace(b"\n", b"\r\n") + b"POSITION events master 1 12",
                       b"POSITION events master 1 12"),
        "monitor": (_text(_monitor(_wire(30, 1))) + monitor_cut.encode(), monitor_cut.encode()),
        "redis-csv": (b'"subscribe","repl",1\n' + b"".join(b'"message","repl","%s"\n' % w.encode()
                                                          for w in _wire(20, 1) if w.startswith("POSITION"))
                      + b'"message","repl","POSITION events master 1 12', b'"message","repl","POSITION events master 1 12'),
        "redis-raw": (b"subscribe\nrepl\n1\n" + b"".join(b"message\nrepl\n%s\n" % w.encode() for w in _wire(10, 1))
                      + b"message\nrepl\nPOSITION events master 1 12", b"POSITION events master 1 12"),
    }


# ------------------------------------------------------------- without Spark


def test_a_cut_last_line_is_malformed_in_both_builder_twins(tmp_path: Path) -> None:
    pa = require(module="pyarrow", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")
    from factstream.spark import lines as L
    from factstream.spark import sources as S

    for name, (data, cut) in _cut_archives().items():
        fmt = name.split("-crlf")[0]
        for gz in (False, True):
            path = tmp_path / (name + (".log.gz" if gz else ".log"))
            path.write_bytes(gzip.compress(data) if gz else data)
            whole = tmp_path / ("whole-" + path.name)
            whole.write_bytes(gzip.compress(data + b"\n") if gz else data + b"\n")
            for typed in (True, False):
                tables = {}
                for impl in ("c", "python"):
                    for block_bytes in (7, 1 << 20):
                        size = path.stat().st_size
                        chunk = S.Chunk(str(path), 0, size, size)
                        first, blocks = S.read_chunk_blocks(chunk, block_bytes=block_bytes)
                        batches = list(L.parse_file_blocks(blocks, source=str(path), first_line=first, fmt=fmt,
                                                           typed=typed, batch_rows=5, impl=impl))
                        tables[impl, block_bytes] = pa.Table.from_batches(batches, schema=L.ARROW_SCHEMA)
                first_table = tables["c", 7]
                assert all(t.equals(first_table) for t in tables.values()), name
                rows = first_table.to_pylist()
                last = rows[-1]
                assert last["line_number"] == data.count(b"\n") + 1, name
                assert last["error"] == "the file " + CUT and last["raw"] == cut.decode(), (name, last)
                assert last["command"] is None and last["token"] is None and last["stream"] is None, (name, last)
                if fmt != "redis-raw":  # there the record it ends is cut short too (one row earlier)
                    assert all(r["error"] is None for r in rows[:-1]), (name, [r for r in rows if r["error"]][:2])
                # the same file with its newline: the last line is parsed as usual
                chunk = S.Chunk(str(whole), 0, whole.stat().st_size, whole.stat().st_size)
                first, blocks = S.read_chunk_blocks(chunk)
                done = pa.Table.from_batches(list(L.parse_file_blocks(blocks, source="w", first_line=first, fmt=fmt,
                                                                      typed=typed)), schema=L.ARROW_SCHEMA).to_pylist()
                assert done[-1]["line_number"] == last["line_number"], name
                assert all(r["error"] != "the file " + CUT for r in done), name
                if cut == b"POSITION events master 1 12":  # what the cut line passed for before
                    assert (done[-1]["command"], done[-1]["token"], done[-1]["error"]) == ("POSITION", 12, None), name


def test_a_split_file_numbers_its_cut_line_exactly(tmp_path: Path) -> None:
    pa = require(module="pyarrow", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")
    from factstream.spark import lines as L
    from factstream.spark import sources as S

    path = tmp_path / "big.log"
    path.write_bytes(_text(_recorded(3000, 1)) + b"POSITION events master 1 12")
    size = path.stat().st_size
    chunks = S.plan_chunks([(str(path), size)], chunk_bytes=20_000)
    assert len(chunks) > 5
    for impl in ("c", "python"):
        rows: list[dict[str, Any]] = []
        before = 0
        for chunk in chunks:
            first, blocks = S.read_chunk_blocks(chunk, before, block_bytes=4096)
            rows += pa.Table.from_batches(list(L.parse_file_blocks(blocks, source="f", first_line=first, impl=impl)),
                                          schema=L.ARROW_SCHEMA).to_pylist()
            before += S.count_newlines(chunk)
        assert [r["line_number"] for r in rows] == list(range(1, 3002)), impl
        assert [r["line_number"] for r in rows if r["error"]] == [3001], impl
        assert rows[-1]["raw"] == "POSITION events master 1 12" and rows[-1]["token"] is None


def test_walks_leave_hidden_directories_out_and_say_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from factstream.spark import sources as S

    src = tmp_path / "archives"
    for rel in ("ok.log", "sub/more.log", ".git/objects/pack.log", "_temporary/0/part-0.log", ".snapshots/old.log",
                "sub/_tmp/x.log", "_explicit/a.log", "_explicit/.cache/b.log"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(_text(_recorded(3, 1)))
    with caplog.at_level(logging.INFO, logger="factstream.spark.sources"):
        got = S.list_files([str(src), str(src / "_explicit")])
    assert sorted(os.path.relpath(p, src) for p, _ in got) == ["_explicit/a.log", "ok.log", "sub/more.log"]
    said = [r for r in caplog.records if "hidden director" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO, caplog.text
    for rel in (".git", "_temporary", ".snapshots", "sub/_tmp", "_explicit/.cache"):
        assert str(src / rel) in said[0].getMessage(), said[0].getMessage()
    # a wildcard does not reach into them either; a directory named literally in a glob is read
    assert [os.path.relpath(p, src) for p, _ in S.list_files([str(src / "*" / "*.log")], quiet=True)] == ["sub/more.log"]
    assert [os.path.relpath(p, src) for p, _ in S.list_files([str(src / "_temporary/*/*.log")], quiet=True)] == [
        "_temporary/0/part-0.log"]
    # named on its own, a hidden directory is walked (below it, "objects" is no hidden name) ...
    assert [os.path.relpath(p, src) for p, _ in S.list_files([str(src / ".git")])] == [".git/objects/pack.log"]
    # ... and one holding only hidden directories is named as such
    shutil.rmtree(src / ".git" / "objects")
    (src / ".git" / "_x").mkdir()
    (src / ".git" / "_x" / "a.log").write_bytes(b"PING 1\n")
    with pytest.raises(FileNotFoundError, match="holds only hidden directories"):
        S.list_files([str(src / ".git")])


# --------------------------------------------------------------------- decode


def test_decode_counts_a_cut_last_line_as_bad(tmp_path: Path) -> None:
    archives = _cut_archives()
    paths = []
    for name, (data, _) in archives.items():
        path = tmp_path / f"{name}.log"
        path.write_bytes(data)
        paths.append(path)
    gz = tmp_path / "cut.log.gz"
    gz.write_bytes(gzip.compress(archives["lines"][0]))
    paths.append(gz)
    done = cli("decode", "--json", *map(str, paths))
    assert done.returncode == 1 and no_traceback(done.stderr), done.stdout + done.stderr
    summary = json.loads(done.stdout)
    cut = [(os.path.basename(e["file"]), e["line"]) for e in summary["errors"] if e["reason"] == "the file " + CUT]
    assert cut == [(p.name, (gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()).count(b"\n") + 1)
                   for p in paths], summary["errors"]
    others = [e for e in summary["errors"] if e["reason"] != "the file " + CUT]
    assert [(os.path.basename(e["file"]), e["reason"]) for e in others] == [
        ("redis-raw.log", "redis-cli message record cut short")], others
    assert summary["error_count"] == len(paths) + 1
    assert all(p is None for p in (i["problem"] for i in summary["inputs"]))
    # text output says the same
    done = cli("decode", str(paths[1]))
    assert done.returncode == 1 and f"{paths[1]}:13: the file {CUT}" in done.stdout, done.stdout
    # and so does stdin; the cut token counts nowhere (it was 12345, not 1234)
    done = cli("decode", "--json", "-", stdin="\n".join(_wire(4, 1)) + "\nPOSITION events master 4 1234")
    summary = json.loads(done.stdout)
    assert done.returncode == 1 and summary["errors"] == [{"file": "-", "line": 5, "reason": "the input " + CUT}]
    assert summary["lines"] == 5 and summary["commands"] == {"RDATA": 4}, summary
    assert [(s["min_token"], s["max_token"]) for s in summary["streams"]] == [(1, 4)], summary
    # with its newline the same input is whole: nothing bad
    whole = tmp_path / "whole.log"
    whole.write_bytes(archives["lines-crlf"][0] + b"\r\n")
    done = cli("decode", "--json", str(whole))
    assert done.returncode == 0 and json.loads(done.stdout)["error_count"] == 0, done.stdout


def test_decode_of_a_directory_is_a_usage_error_pointing_to_logs_parse(tmp_path: Path) -> None:
    folder = tmp_path / "captures"
    folder.mkdir()
    (folder / "a.log").write_bytes(_text(_wire(3, 1)))
    done = cli("decode", str(folder / "a.log"), str(folder))
    assert done.returncode == 2 and no_traceback(done.stderr), done.stderr
    assert done.stdout == "", done.stdout  # nothing read: the command line is wrong
    assert f"factstream decode: {folder}: a directory; decode reads files" in done.stderr, done.stderr
    assert f"factstream decode {folder}/*.log" in done.stderr, done.stderr
    assert f"factstream logs parse {folder} --out PARQUET_DIR" in done.stderr, done.stderr
    assert "Is a directory" not in done.stderr


# ---------------------------------------------------------------- logs parse




def _rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["source_file", "line_number", "command", "token", "error", "raw"])
    return table.to_pylist()


def test_parse_cut_files_hidden_directories_and_the_count_of_inputs(tmp_path: Path) -> None:
    require_spark_cli()
    src = tmp_path / "archives"
    src.mkdir()
    archives = _cut_archives()
    expected: dict[str, tuple[int, bytes]] = {}  # file -> (lines, the cut line)
    for name, (data, cut) in archives.items():
        (src / f"{name}.log").write_bytes(data)
        expected[f"{name}.log"] = (data.count(b"\n") + 1, cut)
    (src / "cut.log.gz").write_bytes(gzip.compress(archives["lines"][0]))  # whole gzip, its text cut
    expected["cut.log.gz"] = expected["lines.log"]
    big = _text(_recorded(20_000, 1)) + b"POSITION events master 1 12"  # cut into chunks: numbering stays exact
    (src / "big.log").write_bytes(big)
    expected["big.log"] = (20_001, b"POSITION events master 1 12")
    (src / "whole.log").write_bytes(_text(_recorded(40, 1)))
    broken = gzip.compress(_text(_recorded(2000, 1)))
    (src / "broken.log.gz").write_bytes(broken[: len(broken) // 2])  # truncated gzip: an input not read to its end
    broken_text = zlib.decompressobj(wbits=31).decompress(broken[: len(broken) // 2])  # what is there before the cut
    broken_lines = broken_text.count(b"\n")
    assert not broken_text.endswith(b"\n")  # cut mid-line: that line is a malformed row too
    # cut in its first member before any whole line: read, but nothing in it is a line
    (src / "early.log.gz").write_bytes(broken[:40])
    (src / "README").write_text("capture of hs1, see the runbook\n")
    (src / "MANIFEST.json").write_text(json.dumps({"files": ["lines.log"]}))  # no newline: json.dump writes none
    for rel in (".git/objects/pack.log", "_temporary/0/part-0.log", ".snapshots/old.log"):
        (src / rel).parent.mkdir(parents=True)
        (src / rel).write_bytes(_text(_recorded(7, 1)))
    named = tmp_path / "_explicit"  # a hidden directory named on its own is read; hidden ones inside it are not
    (named / ".cache").mkdir(parents=True)
    (named / "a.log").write_bytes(_text(_recorded(9, 1)))
    (named / ".cache" / "b.log").write_bytes(_text(_recorded(9, 1)))
    out = tmp_path / "pq"
    cmd = [FACTSTREAM, "logs", "parse", str(src), str(named), "--out", str(out), "--chunk-mb", "0.5", "-v", *SPARK]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    err = done.stderr
    assert no_traceback(err) and "Exception" not in err, err
    assert done.returncode == 2, err
    rows = _rows(out)
    by_file = collections.defaultdict(list)
    for r in rows:
        by_file[os.path.relpath(r["source_file"], tmp_path)].append(r)
    assert sorted(by_file) == sorted(["_explicit/a.log", "archives/whole.log", "archives/broken.log.gz"]
                                     + [f"archives/{name}" for name in expected]), sorted(by_file)
    assert not [r for r in by_file["archives/whole.log"] + by_file["_explicit/a.log"] if r["error"]]
    for name, (count, cut) in expected.items():
        got = sorted(by_file[f"archives/{name}"], key=lambda r: r["line_number"])
        last = got[-1]
        assert last["line_number"] == count and last["error"] == "the file " + CUT, (name, last)
        assert last["raw"] == cut.decode() and last["command"] is None and last["token"] is None, (name, last)
        bad = [r["line_number"] for r in got if r["error"]]
        assert bad == ([count - 1, count] if name == "redis-raw.log" else [count]), (name, bad)
    assert [r["line_number"] for r in sorted(by_file["archives/big.log"], key=lambda r: r["line_number"])] == list(
        range(1, 20_002))
    broken_rows = sorted(by_file["archives/broken.log.gz"], key=lambda r: r["line_number"])
    assert [r["line_number"] for r in broken_rows] == list(range(1, broken_lines + 2))
    assert [r["line_number"] for r in broken_rows if r["error"]] == [broken_lines + 1]
    assert broken_rows[-1]["raw"].encode() == broken_text[broken_text.rfind(b"\n") + 1:]
    malformed = sum(1 for r in rows if r["error"])
    assert f"({malformed} malformed)" in err and malformed == len(expected) + 2, err  # redis-raw's two, broken's one
    # the hidden directories left out are said once, at INFO, not as a warning
    said = [line for line in err.splitlines() if "hidden director" in line]
    assert len(said) == 1 and " INFO " in said[0], said
    for rel in ("archives/.git", "archives/_temporary", "archives/.snapshots", "_explicit/.cache"):
        assert str(tmp_path / rel) in said[0], said
    # a file cut before its first line is not said to have had "the lines before it" parsed
    early = [line for line in err.splitlines() if "early.log.gz" in line and "gzip" in line]
    assert early == [f"factstream logs: {src}/early.log.gz: truncated gzip (the file ends inside a "
                     "compressed member); it holds no whole line"], early
    # the count says what it counts: 13 found, of which 2 are no archives
    assert "whose format was not detected" in err and f"{src}/MANIFEST.json" in err and f"{src}/README" in err, err
    assert (f"{src}/broken.log.gz: truncated gzip (the file ends inside a compressed member) after line "
            f"{broken_lines}; the lines before it were parsed") in err, err
    assert ("factstream logs: 2 of 13 inputs could not be read to their end "
            "(13 found: 11 to parse, 2 not replication archives, skipped)") in err, err
