"""gzip archives cut short lose no line: every line decompressed before the cut is read, and the cut is named.

A ``.log.gz`` of ``factstream record`` is a run of gzip members (one
finished every ``--flush-interval``). Cut short (the recorder killed inside
a member, a copy interrupted, a file still being written), it still holds
everything before the cut, and zlib decompresses all of it. ``logs parse``,
``decode`` and ``logs stream --files`` must give each whole line before the
cut, the line the cut cut short as a malformed row ("the file ends
mid-line"), and name the file with the line after which it breaks. They
used to read gzip with Python's ``GzipFile`` in 64 KiB pieces and drop the
piece being read when it raised: up to 64 KiB of lines before the cut, and
every line of a small file ("0 files published", no warning, in the
stream). Damage in the middle of a member (not a cut) still ends the file
there, with every line before it read, whatever the sizes of the reads.

The expected text of each file is what ``zlib.decompressobj(wbits=31)``
gives member by member from the bytes that are there: the oracle.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import random
import re
import subprocess
import zlib
from pathlib import Path
from typing import Any

from cli_run import ENV, FACTSTREAM, no_traceback, require_spark_cli
from conftest import require
from spark_stream_run import SPARK, run_stream

PYARROW = "it is in the spark extra: pip install 'factstream[spark]' (make install)"
ENDS_MID_LINE = "the file ends mid-line (no newline after its last line): cut short, or still being written"
NL = b"\n"
TRUNCATED = "truncated gzip (the file ends inside a compressed member)"
EV = '["ev",["$e{t}:hs","!r:hs","m.room.message",null,null,null,null,false,false],"@u{u}:hs"]'


def _text(n: int, first: int) -> bytes:
    """n recorded lines (as ``factstream record`` writes them): RDATA, and every fifth a POSITION."""
    out = []
    for i in range(n):
        t = first + i
        wire = (f"POSITION events master {t - 1} {t}" if i % 5 == 4
                else f"RDATA events master {t} {EV.format(t=t, u=(t * 7919) % 100_003)}")
        out.append(f"2026-11-24T10:{(t // 60) % 60:02d}:{t % 60:02d}.{t % 1000:03d}Z > {wire}\n")
    return "".join(out).encode()


def _record(directory: Path, members: list[bytes]) -> Path:
    """A closed capture file written by the recorder's own writer, one gzip member per item of ``members``."""
    from factstream.cli.capture import CaptureWriter

    writer = CaptureWriter(str(directory), "hs1", flush_interval=3600.0, rotate_seconds=3600.0)
    for text in members:
        writer.write(text, text.count(b"\n"))
        writer.finish_member()  # what --flush-interval does
    writer.rotate()
    return Path(writer.files[-1])


def _given(data: bytes) -> tuple[bytes, bool]:
    """The oracle: (what zlib decompresses from ``data``, member by member; whether it ends inside a member)."""
    out = b""
    while data:
        d = zlib.decompressobj(wbits=31)
        out += d.decompress(data)
        if not d.eof:
            return out, True
        data = d.unused_data
    return out, False


def _boundaries(data: bytes) -> list[int]:
    """Where each member of a whole file ends."""
    ends, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        d.decompress(data[pos:])
        assert d.eof
        pos = len(data) - len(d.unused_data)
        ends.append(pos)
    return ends


class Cut:
    """A file cut at ``at`` bytes and what must be read of it."""

    def __init__(self, name: str, whole: bytes, at: int, full_text: bytes) -> None:
        self.name, self.data = name, whole[:at]
        self.text, self.truncated = _given(self.data)
        assert full_text.startswith(self.text)
        self.lines = self.text.count(b"\n")  # whole lines
        self.partial = self.text[self.text.rfind(b"\n") + 1:]  # the line the cut cut short (b"": none)

    @property
    def rows(self) -> int:
        return self.lines + (1 if self.partial else 0)

    @property
    def problem(self) -> str | None:
        if not self.truncated:
            return None
        return f"{TRUNCATED} after line {self.lines}" if self.lines else TRUNCATED


def _first_cut(whole: bytes, start: int, want_newline: bool, lines: int = 1) -> int:
    """The first offset from ``start`` where the text given (``lines`` lines at least) ends just after a newline
    (or does not)."""
    for at in range(start, len(whole)):
        text, truncated = _given(whole[:at])
        if truncated and text.count(b"\n") >= lines and text.endswith(b"\n") == want_newline:
            return at
    raise AssertionError("no such cut")


def _cuts(tmp: Path) -> tuple[list[Cut], Path, bytes]:
    """Cuts of a recorder file of four members (~125 KB of text each) and of a small one-member file."""
    members = [_text(1000, 1 + 1000 * k) for k in range(4)]
    full_text = b"".join(members)
    src = _record(tmp / "rec", members)
    whole = src.read_bytes()
    ends = _boundaries(whole)
    assert len(ends) == 4 and ends[-1] == len(whole)
    assert all(len(m) > 100_000 for m in members)  # more than one 64 KiB read per member
    # deflate rarely stops just after a newline (its matches run across lines), except where the writer
    # flushed (GzipFile.flush: a sync point): cut there, the text given ends with a whole line
    flushed_text = members[0] + members[1]
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(members[0])
    gz = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
    line_end = members[1].index(b"\n", 70_000) + 1
    gz.write(members[1][:line_end])
    gz.flush()
    flushed_at = raw.tell()
    gz.write(members[1][line_end:])
    gz.close()
    flushed = raw.getvalue()
    small_text = _text(12, 1)
    small = _record(tmp / "small", [small_text]).read_bytes()
    cuts = [
        Cut("inside-member", whole, (ends[0] + ends[1]) // 2, full_text),
        Cut("member-boundary", whole, ends[1], full_text),  # a whole member ends here: nothing tells it was cut
        Cut("next-header", whole, ends[1] + 5, full_text),  # inside the next member's header
        Cut("mid-line", whole, _first_cut(whole, (ends[1] + ends[2]) // 2, want_newline=False), full_text),
        Cut("after-newline", flushed, flushed_at, flushed_text),
        Cut("last-trailer", whole, len(whole) - 3, full_text),  # only the last member's length is missing
        Cut("small", small, _first_cut(small, 10, want_newline=False, lines=6), small_text),
        Cut("uncut", whole, len(whole), full_text),
    ]
    kinds = {c.name: (c.truncated, bool(c.partial)) for c in cuts}
    assert kinds == {"inside-member": (True, True), "member-boundary": (False, False), "next-header": (True, False),
                     "mid-line": (True, True), "after-newline": (True, False), "last-trailer": (True, False),
                     "small": (True, True), "uncut": (False, False)}, kinds
    assert 0 < next(c for c in cuts if c.name == "small").lines < 12
    return cuts, src, full_text


def _write_cuts(cuts: list[Cut], directory: Path) -> dict[str, Cut]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for cut in cuts:
        path = directory / f"{cut.name}.log.gz"
        path.write_bytes(cut.data)
        files[str(path)] = cut
    return files


# ------------------------------------------------------------- without Spark


def test_the_reader_gives_every_byte_before_any_cut(tmp_path: Path) -> None:
    """read_chunk_blocks (what each Spark task reads) and gzip_problem (what the driver names), cut anywhere."""
    require(module="pyarrow", how=PYARROW)
    from factstream.spark.sources import Chunk, gzip_problem, read_chunk_blocks

    _, src, full_text = _cuts(tmp_path)
    whole = src.read_bytes()
    offsets = sorted(set(range(2, len(whole) + 1, 211)) | {len(whole) - k for k in range(12)})  # 2: gzip's magic
    path = tmp_path / "cut.log.gz"
    for at in offsets:
        cut = Cut(f"at {at}", whole, at, full_text)
        path.write_bytes(cut.data)
        size = len(cut.data)
        damage: list[tuple[str, str]] = []
        first, blocks = read_chunk_blocks(Chunk(str(path), 0, size, size), on_damage=lambda *d: damage.append(d))
        got = b"".join(blocks)
        assert first == 1 and got == cut.text, (at, len(got), len(cut.text))
        # the reader names its own damage once, as the driver's check would: a whole file is read once
        assert damage == ([] if cut.problem is None else [(str(path), cut.problem)]), (at, damage)
        assert gzip_problem(str(path)) == cut.problem, at
        assert gzip_problem(str(src), size=at) == cut.problem, at  # the whole file read as far as a listing saw it


def test_damage_inside_a_member_keeps_every_line_before_it(tmp_path: Path) -> None:
    """Corrupt bytes in the middle (not a cut): the file ends where zlib finds the damage, to the byte."""
    require(module="pyarrow", how=PYARROW)
    from factstream.spark.sources import Chunk, gzip_problem, read_chunk_blocks

    _, src, _ = _cuts(tmp_path)
    whole = src.read_bytes()
    rng = random.Random(5)
    path = tmp_path / "corrupt.log.gz"
    checked = 0
    for _ in range(40):
        data = bytearray(whole)
        at = rng.randrange(200, len(data) - 200)
        data[at: at + 16] = bytes(rng.randrange(256) for _ in range(16))
        path.write_bytes(bytes(data))
        before, corrupt = _salvage(bytes(data))
        if not corrupt:
            continue  # zlib saw no damage (or the damage reads as a cut, e.g. a stored block's length)
        checked += 1
        lines = before[: before.rfind(b"\n") + 1]  # the line the damage broke is no line
        damage: list[tuple[str, str]] = []
        first, blocks = read_chunk_blocks(Chunk(str(path), 0, len(data), len(data)), on_damage=lambda *d: damage.append(d))
        got = b"".join(blocks)
        assert got == lines, (at, len(got), len(lines))
        problem = gzip_problem(str(path))
        assert damage == [(str(path), problem)], (at, damage)
        assert problem is not None and problem.startswith("corrupt gzip ("), problem
        assert problem.endswith(f"after line {lines.count(NL)}") or not lines, (at, problem)
    assert checked > 20


def _salvage(data: bytes) -> tuple[bytes, bool]:
    """The oracle for damage: zlib fed one byte at a time, member by member; (output before the damage, whether
    zlib found damage)."""
    out: list[bytes] = []
    d = None
    for k in range(len(data)):
        if d is None:
            d = zlib.decompressobj(wbits=31)
        try:
            out.append(d.decompress(data[k: k + 1]))
        except zlib.error:
            return b"".join(out), True
        if d.eof:
            d = None
    return b"".join(out), False


# ------------------------------------------------------------- decode


def test_decode_reads_every_line_before_the_cut(tmp_path: Path) -> None:
    cuts, _, _ = _cuts(tmp_path)
    files = _write_cuts(cuts, tmp_path / "in")
    for path, cut in files.items():
        res = subprocess.run([FACTSTREAM, "decode", "--json", path], capture_output=True, text=True, timeout=120, env=ENV)
        assert no_traceback(res.stderr), res.stderr
        doc = json.loads(res.stdout)
        assert doc["lines"] == cut.rows, (cut.name, doc["lines"], cut.rows)
        assert doc["error_count"] == (1 if cut.partial else 0), (cut.name, doc["errors"])
        if cut.partial:
            assert doc["errors"] == [{"file": path, "line": cut.rows, "reason": ENDS_MID_LINE}], cut.name
        assert doc["inputs"] == [{"file": path, "format": "lines", "problem": cut.problem}], cut.name
        assert doc["commands"].get("RDATA", 0) + doc["commands"].get("POSITION", 0) == cut.lines, cut.name
        if cut.problem:
            assert res.returncode == 2 and f"factstream decode: {path}: {cut.problem}\n" in res.stderr, res.stderr
        else:
            assert res.returncode == 0 and not res.stderr, (cut.name, res.stderr)
    # stdin alike
    small = next(path for path, cut in files.items() if cut.name == "small")
    cut = files[small]
    res = subprocess.run([FACTSTREAM, "decode", "--json"], input=Path(small).read_bytes(), capture_output=True,
                         timeout=120, env=ENV)
    doc = json.loads(res.stdout)
    assert res.returncode == 2 and doc["lines"] == cut.rows and doc["inputs"][0]["problem"] == cut.problem, doc


# ------------------------------------------------------------- logs parse


def _rows(out: Path) -> dict[str, list[dict[str, Any]]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["source_file", "line_number", "command", "token", "error", "raw"])
    by_file: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in table.to_pylist():
        by_file[r["source_file"]].append(r)
    return {f: sorted(rows, key=lambda r: r["line_number"]) for f, rows in by_file.items()}


def _check_rows(by_file: dict[str, list[dict[str, Any]]], files: dict[str, Cut]) -> None:
    for path, cut in files.items():
        rows = by_file.get(path, [])
        assert [r["line_number"] for r in rows] == list(range(1, cut.rows + 1)), (cut.name, len(rows), cut.rows)
        good = rows[: cut.lines]
        assert not [r for r in good if r["error"]], cut.name
        # line n of every file holds token n: RDATA, every fifth a POSITION
        assert [(r["command"], r["token"]) for r in good] == [
            ("POSITION" if n % 5 == 0 else "RDATA", n) for n in range(1, cut.lines + 1)], cut.name
        if cut.partial:
            last = rows[-1]
            assert last["error"] == ENDS_MID_LINE and last["raw"].encode() == cut.partial, (cut.name, last)
            assert last["command"] is None and last["token"] is None, (cut.name, last)


def test_logs_parse_parses_every_line_before_the_cut(tmp_path: Path) -> None:
    require_spark_cli()
    cuts, _, _ = _cuts(tmp_path)
    files = _write_cuts(cuts, tmp_path / "in")
    out = tmp_path / "pq"
    done = subprocess.run([FACTSTREAM, "logs", "parse", str(tmp_path / "in"), "--out", str(out), *SPARK],
                          capture_output=True, text=True, timeout=600, env=ENV)
    err = done.stderr
    assert done.returncode == 2 and no_traceback(err), err
    _check_rows(_rows(out), files)
    rows = sum(c.rows for c in cuts)
    assert f"wrote {rows} lines ({sum(1 for c in cuts if c.partial)} malformed) to {out}" in err, err
    for path, cut in files.items():
        said = [line for line in err.splitlines() if path in line]
        if cut.problem:
            assert said == [f"factstream logs: {path}: {cut.problem}; the lines before it were parsed"], said
        else:
            assert not said, said
    bad = sum(1 for c in cuts if c.problem)
    assert f"factstream logs: {bad} of {len(cuts)} inputs could not be read to their end" in err, err


# ------------------------------------------------------------- logs stream --files


def test_logs_stream_files_parses_every_line_before_the_cut_and_names_the_file(tmp_path: Path) -> None:
    require_spark_cli()
    cuts, _, _ = _cuts(tmp_path)
    chosen = [c for c in cuts if c.name in ("small", "mid-line", "after-newline", "uncut")]
    files = _write_cuts(chosen, tmp_path / "in")
    out, ck = tmp_path / "out", tmp_path / "ck"
    done = run_stream("--files", str(tmp_path / "in"), "--out", str(out), "--checkpoint", str(ck),
                      "--stop-when-idle", "3")
    err = done.stderr
    assert no_traceback(err), err
    _check_rows(_rows(out), files)
    rows = sum(c.rows for c in chosen)
    malformed = sum(1 for c in chosen if c.partial)
    counted = [re.search(r"files published, (\d+) lines \((\d+) malformed\)", line) for line in err.splitlines()]
    assert [sum(int(m.group(k)) for m in counted if m) for k in (1, 2)] == [rows, malformed], err
    for path, cut in files.items():
        said = [line for line in err.splitlines() if f"{path}: truncated gzip" in line]
        if cut.problem:
            assert len(said) == 1 and f": {path}: {cut.problem}; the lines before it were parsed" in said[0], said
        else:
            assert not said, said
