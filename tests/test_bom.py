"""A UTF-8 byte-order mark at the start of an archive is an encoding mark, not part of line 1.

Windows tools (PowerShell's ``Out-File``/``Set-Content``, Notepad) start a
text file with EF BB BF. Left in, the first line read ``\\ufeffRDATA ...``:
``decode`` and ``logs parse`` made it malformed ("unknown command"), and a
file whose every line is prefixed (the recorder's timestamps, redis-cli
MONITOR) could not even be detected when its first line was its only one.
The mark is left out at the start of a file (plain, or of a gzip file's
decompressed bytes), wherever the reader reads it, and line numbers stay as
they were (the mark's line is line 1). A mark anywhere else is data, as before.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, no_traceback, require_spark_cli
from conftest import require
from spark_stream_run import run_stream

BOM = b"\xef\xbb\xbf"
SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
PYARROW = "it is in the spark extra: pip install 'factstream[spark]' (make install)"
CACHES = b'RDATA caches master 7 ["get_user_by_id",["@a:x"],1700000000000]'
#: Every twin a CLI run can use (FACTSTREAM_IMPL), so both give the same rows.
IMPLS = ["c", "python"]


def _wire(n: int, first: int) -> list[bytes]:
    """n wire lines of the events stream, tokens first .. first+n-1 (POSITION every 5th)."""
    out = []
    for t in range(first, first + n):
        if (t - first) % 5 == 4:
            out.append(b"POSITION events master %d %d" % (t - 1, t))
        else:
            row = b'["ev",["$e%d:hs","!r:hs","m.room.message",null,null,null,null,false,false]]' % t
            out.append(b"RDATA events master %d %s" % (t, row))
    return out


def _recorded(lines: list[bytes]) -> list[bytes]:
    return [b"2026-11-21T10:00:%02d.051Z > %s" % (i % 60, line) for i, line in enumerate(lines)]


def _monitor(lines: list[bytes]) -> list[bytes]:
    return [b'1795300000.%06d [0 127.0.0.1:5555] "PUBLISH" "repl" "%s"' % (i, line.replace(b'"', b'\\"'))
            for i, line in enumerate(lines)]


def _file(lines: list[bytes]) -> bytes:
    """A Windows tool's file of ``lines``: the mark, then the lines."""
    return BOM + b"".join(line + b"\n" for line in lines)


def _run(*args: str, impl: str = "c", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, "FACTSTREAM_IMPL": impl})


# ------------------------------------------------------------------ decode


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_decode_leaves_out_a_mark_at_the_start(tmp_path: Path, gz: bool, impl: str) -> None:
    cases = {
        "bare.log": (_file([CACHES, b"PING 123"]), "lines", 2),
        # one prefixed line only: the mark used to hide the only line that says what the file is
        "recorded.log": (_file(_recorded([CACHES])), "lines", 1),
        "monitor.log": (_file(_monitor([CACHES])), "monitor", 1),
        "only-the-mark.log": (BOM, "lines", 0),
    }
    for name, (data, _, _) in cases.items():
        (tmp_path / name).write_bytes(gzip.compress(data) if gz else data)
    done = _run("decode", "--json", *(str(tmp_path / name) for name in cases), impl=impl)
    assert no_traceback(done.stderr), done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout)
    assert got["error_count"] == 0 and got["errors"] == [], got["errors"]
    assert [(i["format"], i["problem"]) for i in got["inputs"]] == [(fmt, None) for _, fmt, _ in cases.values()]
    assert got["lines"] == sum(n for _, _, n in cases.values())
    caches = [s for s in got["streams"] if s["stream"] == "caches"]
    assert caches == [{"stream": "caches", "instance": "master", "rows": 3, "batch_rows": 0, "positions": 0,
                       "min_token": 7, "max_token": 7}]


def test_decode_keeps_a_mark_after_the_start_and_numbers_lines_as_before(tmp_path: Path) -> None:
    # the mark's own line (blank once it is left out) is line 1; a mark on line 3 is data, as it always was
    path = tmp_path / "x.log"
    path.write_bytes(BOM + b"\n" + CACHES + b"\n" + BOM + b"PING 1\n")
    done = _run("decode", "--json", str(path))
    assert no_traceback(done.stderr), done.stderr
    got = json.loads(done.stdout)
    assert got["commands"] == {"RDATA": 1}
    assert [(e["line"], e["reason"].split(":")[0]) for e in got["errors"]] == [(3, "unknown command '\\ufeffPING'")]
    assert done.returncode == 1


# ------------------------------------------------------------------ reading, both twins


@pytest.mark.parametrize("block_bytes", [1, 2, 1 << 20])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_read_chunk_blocks_leave_out_the_mark(tmp_path: Path, impl: str, gz: bool, block_bytes: int) -> None:
    require(module="pyarrow", how=PYARROW)
    from factstream.spark.lines import parse_file_blocks
    from factstream.spark.sources import Chunk, archive_formats, read_chunk_blocks, read_head

    data = _file([CACHES, b"PING 123"])
    path = tmp_path / "bom.log"
    path.write_bytes(gzip.compress(data) if gz else data)
    size = path.stat().st_size
    assert read_head(str(path), size=size)[0] == CACHES
    first, blocks = read_chunk_blocks(Chunk(str(path), 0, size, size), 0, block_bytes=block_bytes)
    got = list(blocks)
    assert (first, b"".join(got)) == (1, data[len(BOM):])
    rows = [r for b in parse_file_blocks(got, source=str(path), first_line=first, impl=impl) for r in b.to_pylist()]
    assert [(r["line_number"], r["command"], r["stream"], r["token"], r["error"]) for r in rows] == [
        (1, "RDATA", "caches", 7, None), (2, "PING", None, None, None)]
    assert rows[0]["cache_func"] == "get_user_by_id"
    # a file whose every line is prefixed, its first (only) line behind the mark, is still that format
    for name, lines, fmt in (("r.log", _recorded([CACHES]), "lines"), ("m.log", _monitor([CACHES]), "monitor")):
        one = tmp_path / name
        one.write_bytes(gzip.compress(_file(lines)) if gz else _file(lines))
        assert archive_formats([(str(one), one.stat().st_size)]) == ({str(one): fmt}, [])


def test_a_plain_file_cut_into_chunks_leaves_out_the_mark_of_the_first_only(tmp_path: Path) -> None:
    require(module="pyarrow", how=PYARROW)
    from factstream.spark.sources import count_newlines, plan_chunks, read_chunk_lines

    lines = _wire(2000, 1)
    data = _file(lines)
    path = tmp_path / "big.log"
    path.write_bytes(data)
    chunks = plan_chunks([(str(path), len(data))], chunk_bytes=len(data) // 7)
    assert len(chunks) > 3
    got: list[tuple[int, bytes]] = []
    before = 0
    for chunk in chunks:
        for n, block in read_chunk_lines(chunk, before, block_bytes=3):  # 3: the mark comes in pieces
            got.extend(enumerate(block, n))
        before += count_newlines(chunk)
    assert got == list(enumerate(lines, 1))


# ------------------------------------------------------------------ logs parse, logs stream --files


def _rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.dataset as ds

    # the partition columns' types given: an output whose rows all lack a stream has nothing to infer them from
    hive = ds.partitioning(pa.schema([("date", pa.string()), ("stream", pa.string())]), flavor="hive")
    table = ds.dataset(str(out), format="parquet", partitioning=hive).to_table(
        columns=["source_file", "line_number", "command", "stream", "instance", "token", "error", "raw"])
    return sorted(table.to_pylist(), key=lambda r: (r["source_file"], r["line_number"]))


def _archives(src: Path) -> dict[str, list[bytes]]:
    """Files with the mark (plain, gzip, prefixed, MONITOR, cut into chunks, nothing else): name -> wire lines."""
    src.mkdir()
    wire = {
        "bom.log": [CACHES, b"PING 123"],
        "bom.log.gz": [CACHES, b"PING 124"],
        "recorded.log": [CACHES],
        "recorded.log.gz": [CACHES],
        "monitor.log": [CACHES],
        "big.log": _wire(20000, 100),
        "only-the-mark.log": [],  # an empty file, as decode reads it: no line, no row
        "only-the-mark.log.gz": [],
    }
    for name, lines in wire.items():
        shaped = {"recorded": _recorded, "monitor": _monitor}.get(name.split(".")[0], list)(lines)
        data = _file(shaped)
        (src / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return wire


def _check(rows: list[dict[str, Any]], wire: dict[str, list[bytes]]) -> None:
    assert [r for r in rows if r["error"] is not None] == []
    for name, lines in wire.items():
        mine = [r for r in rows if r["source_file"].endswith("/" + name)]
        numbers = [r["line_number"] for r in mine]
        assert numbers == list(range(1, len(lines) + 1)), (name, numbers[:5])
        if not lines:
            continue
        first = mine[0]
        if lines[0] == CACHES:
            assert (first["command"], first["stream"], first["instance"], first["token"]) == (
                "RDATA", "caches", "master", 7)
        else:
            assert (first["command"], first["stream"], first["token"]) == ("RDATA", "events", 100)
    assert len(rows) == sum(map(len, wire.values()))


@pytest.mark.parametrize("impl", IMPLS)
def test_logs_parse_leaves_out_the_mark(tmp_path: Path, impl: str) -> None:
    require_spark_cli()
    src, out = tmp_path / "in", tmp_path / "out"
    wire = _archives(src)
    # chunks of ~100 KB: big.log (~2 MB) is cut, the mark in its first chunk only
    done = _run("logs", "parse", str(src), "--out", str(out), "--chunk-mb", "0.1", *SPARK, impl=impl)
    assert no_traceback(done.stderr), done.stderr
    assert done.returncode == 0, done.stderr
    _check(_rows(out), wire)
    assert "skipped" not in done.stderr, done.stderr


def test_logs_stream_files_leaves_out_the_mark(tmp_path: Path) -> None:
    require_spark_cli()
    src, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    wire = {name: lines for name, lines in _archives(src).items() if name.endswith(".gz")}
    done = run_stream("--files", str(src), "--out", str(out), "--checkpoint", str(ck), "--stop-when-idle", "3")
    assert no_traceback(done.stderr), done.stderr
    assert done.returncode == 0, done.stderr
    _check(_rows(out), wire)
