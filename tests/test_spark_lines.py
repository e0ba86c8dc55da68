"""The executor-side pieces of the Spark pipeline, without Spark: formats, chunking, batches."""

from __future__ import annotations

import datetime as dt
import gzip
import os
import random
from pathlib import Path
from typing import Any

import pytest

from conftest import require

pa = require(module="pyarrow", how="it is in the spark extra: pip install 'factstream[spark]' (make install)")

from factstream import wire  # noqa: E402
from factstream.errors import ProtocolError  # noqa: E402
from factstream.spark import lines as L  # noqa: E402
from factstream.spark import sources as S  # noqa: E402

import importlib.util  # noqa: E402
import sys  # noqa: E402

_spec = importlib.util.spec_from_file_location("spark_archives", Path(__file__).with_name("spark_archives.py"))
assert _spec and _spec.loader
spark_archives = importlib.util.module_from_spec(_spec)
sys.modules["spark_archives"] = spark_archives
_spec.loader.exec_module(spark_archives)


def _rows(lines: list[bytes], **kw: object) -> list[dict]:
    out = []
    for batch in L.parse_block(lines, source="f", **kw):  # type: ignore[arg-type]
        assert batch.schema == L.ARROW_SCHEMA
        out.extend(batch.to_pylist())
    return out


def test_import_factstream_spark_is_light() -> None:
    import subprocess

    code = "import sys, factstream, factstream.spark, factstream.cli; print(sorted(m for m in ('pyspark','pyarrow','pandas') if m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


def test_prefixes_timestamp_direction_and_plain() -> None:
    rows = _rows(
        [
            b"2026-11-22T01:02:03.456Z > RDATA events master 5 [\"ev\",[\"$e\",\"!r\",\"t\",null,null,null,null,false,true]]",
            b"< PING 17",
            b"2026-11-22 01:02:03,5+01:00 POSITION caches master 1 4",
            b"",
            b"   ",
            b"RDATA typing master batch [1]",
            b"2026-11-22T01:02:03Z >",
            b"> nonsense here",
        ],
        first_line=10,
    )
    assert [r["line_number"] for r in rows] == [10, 11, 12, 15, 16, 17]
    assert rows[0]["ts"] == dt.datetime(2026, 11, 22, 1, 2, 3, 456000, tzinfo=dt.timezone.utc)
    assert rows[0]["date"] == dt.date(2026, 11, 22) and rows[0]["direction"] == ">"
    assert rows[0]["ev_event_id"] == "$e" and rows[0]["ev_outlier"] is True and rows[0]["ev_rejected"] is False
    assert rows[1]["direction"] == "<" and rows[1]["command"] == "PING" and rows[1]["data"] == "17"
    assert rows[2]["ts"] == dt.datetime(2026, 11, 22, 0, 2, 3, 500000, tzinfo=dt.timezone.utc)
    assert rows[2]["token"] == 4 and rows[2]["prev_token"] == 1 and rows[1]["ts"] is None
    assert rows[3]["token"] is None and rows[3]["row"] == "[1]" and rows[3]["stream"] == "typing"
    assert rows[4]["error"] == "prefix without a replication line"
    with pytest.raises(ProtocolError) as err:
        wire.parse_line(b"nonsense here")
    assert rows[5]["error"] == str(err.value) and rows[5]["raw"] == "nonsense here"


def test_redis_quoting_round_trip() -> None:
    rng = random.Random(3)
    for _ in range(300):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        quoted = spark_archives.redis_quote(data)
        assert L.redis_unquote(quoted[1:-1]) == data


def test_redis_formats() -> None:
    payload = b'RDATA caches master 3 ["f",["\\u00e9 \\"q\\""],1]'
    q = spark_archives.redis_quote(payload)
    mon = [b"OK", b'1795310678.449548 [0 127.0.0.1:42798] "PUBLISH" "chan" ' + q, b'1795310679.0 [0 lua] "GET" "x"', b"junk"]
    assert L.detect_format(mon) == "monitor"
    rows = _rows(mon, fmt="monitor")
    assert [r["line_number"] for r in rows] == [2, 4]
    assert rows[0]["channel"] == "chan"
    assert rows[0]["ts"] == dt.datetime(2026, 11, 22, 1, 24, 38, 449548, tzinfo=dt.timezone.utc)
    assert rows[0]["cache_keys"] == ['\u00e9 "q"'] and rows[0]["row"] == payload.split(b" ", 4)[4].decode()
    assert rows[1]["error"] == "not a redis-cli MONITOR line"
    csv = [b"Reading messages... (press Ctrl-C to quit)", b'"subscribe","chan",1', b'"message","chan",' + q, b'"pmessage","ch*","chan",' + q]
    assert L.detect_format(csv) == "redis-csv"
    rows = _rows(csv, fmt="redis-csv")
    assert [(r["line_number"], r["channel"], r["token"]) for r in rows] == [(3, "chan", 3), (4, "chan", 3)]
    raw = [b"subscribe", b"chan", b"1", b"message", b"chan", payload, b"message", b"chan"]
    assert L.detect_format(raw) == "redis-raw"
    rows = _rows(raw, fmt="redis-raw")
    assert [(r["line_number"], r["channel"], r["error"]) for r in rows] == [
        (6, "chan", None),
        (8, None, "redis-cli message record cut short"),
    ]


def test_unexpected_row_shapes_give_null_typed_columns() -> None:
    rows = _rows(
        [
            b'RDATA events master 1 ["ev",[1,2,3,4,5,6,7,8,9]]',
            b'RDATA events master 2 ["ev",["only","two"]]',
            b'RDATA events master 3 {"not":"a list"}',
            b'RDATA caches master 4 ["f",{"k":1},"ts"]',
            b'RDATA caches master 5 ["f",[1,[2],"s"],99999999999999999999]',
        ]
    )
    assert rows[0]["ev_kind"] == "ev" and rows[0]["ev_event_id"] is None and rows[0]["ev_rejected"] is None
    assert rows[1]["ev_kind"] == "ev" and rows[1]["ev_room_id"] is None
    assert rows[2]["ev_kind"] is None
    assert rows[3]["cache_func"] == "f" and rows[3]["cache_keys"] is None and rows[3]["cache_invalidation_ts"] is None
    assert rows[4]["cache_keys"] == ["1", "[2]", "s"] and rows[4]["cache_invalidation_ts"] is None


def test_header_only_leaves_typed_columns_null() -> None:
    rows = _rows([b'RDATA caches master 4 ["f",["k"],5]'], typed=False)
    assert rows[0]["row"] == '["f",["k"],5]'
    assert all(rows[0][name] is None for name in L.TYPED_COLUMNS)


def test_batches_are_capped() -> None:
    batches = list(L.parse_block([b"PING 1"] * 10, source="x", batch_rows=4))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert [n for b in batches for n in b.column("line_number").to_pylist()] == list(range(1, 11))


def test_parse_options_refuse_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown archive format"):
        L.ParseOptions(format="syslog")


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_chunks_cover_every_line_once(tmp_path: Path, trailing_newline: bool) -> None:
    rng = random.Random(11)
    path = tmp_path / "a.log"
    for trial in range(60):
        lines = [b"x" * rng.randint(0, 40) for _ in range(rng.randint(0, 80))]
        data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
        path.write_bytes(data)
        want = data.split(b"\n")
        if data.endswith(b"\n") or not data:
            want.pop()
        files = S.list_files([str(path)])
        chunks = S.plan_chunks(files, rng.randint(1, 60))
        got, before = [], 0
        for chunk in chunks:
            for first, block in S.read_chunk_lines(chunk, before, block_bytes=rng.randint(1, 25)):
                got.extend((first + i, line) for i, line in enumerate(block))
            before += S.count_newlines(chunk)
        assert got == list(enumerate(want, 1)), (trial, data)


def test_files_are_cut_only_as_far_as_the_cores_need() -> None:
    mib = 1024 * 1024
    eight = [(f"/a/{i}.log", 80 * mib) for i in range(8)]

    def sizes(chunks: list[Any]) -> list[int]:
        return [c.end - c.start for c in chunks]

    # enough files for two chunks per core: one task per file, nothing cut
    assert [(c.path, c.start, c.end) for c in S.plan_chunks(eight, 32 * mib, cores=2)] == [
        (p, 0, n) for p, n in eight]
    assert len(S.plan_chunks(eight, 32 * mib, cores=4)) == 8
    # more cores: files are cut into equal chunks, never below chunk_bytes (80 MiB: two of 40, not three of 26.7)
    assert sizes(S.plan_chunks(eight, 32 * mib, cores=8)) == [40 * mib] * 16
    assert sizes(S.plan_chunks(eight, 32 * mib, cores=1000)) == [40 * mib] * 16
    assert sizes(S.plan_chunks(eight, 16 * mib, cores=1000)) == [16 * mib] * 40
    # without cores: as if there were plenty
    assert S.plan_chunks(eight, 16 * mib) == S.plan_chunks(eight, 16 * mib, cores=10**6)
    # one file, two cores: four equal chunks; the chunks cover the file exactly, in order
    one = S.plan_chunks([("/b.log", 100 * mib + 3)], 8 * mib, cores=2)
    assert [c.start for c in one] == [0, *(c.end for c in one[:-1])] and one[-1].end == 100 * mib + 3
    assert max(sizes(one)) - min(sizes(one)) <= 1 and len(one) == 4
    # a huge file on few cores: no chunk above MAX_CHUNK_BYTES, unless chunk_bytes asks for more
    huge = [("/c.log", 10 * S.MAX_CHUNK_BYTES)]
    assert sizes(S.plan_chunks(huge, 32 * mib, cores=1)) == [S.MAX_CHUNK_BYTES] * 10
    assert sizes(S.plan_chunks(huge, 2 * S.MAX_CHUNK_BYTES, cores=1)) == [2 * S.MAX_CHUNK_BYTES] * 5
    # uneven files: only the big one is cut; gzip files stay whole; chunk_bytes 0 cuts nothing
    mixed = [("/d/big.log", 300 * mib), ("/d/small.log", 1 * mib), ("/d/x.log.gz", 500 * mib)]
    assert [(c.path, c.end - c.start) for c in S.plan_chunks(mixed, 1 * mib, cores=2)] == [
        ("/d/big.log", 75 * mib), ("/d/big.log", 75 * mib), ("/d/big.log", 75 * mib), ("/d/big.log", 75 * mib),
        ("/d/small.log", 1 * mib), ("/d/x.log.gz", 500 * mib)]
    assert len(S.plan_chunks(mixed, 0, cores=1000)) == 3


def test_gzip_is_one_chunk_and_streams(tmp_path: Path) -> None:
    path = tmp_path / "a.log.gz"
    lines = [f"PING {i}".encode() for i in range(5000)]
    with gzip.open(path, "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    files = S.list_files([str(tmp_path)])
    chunks = S.plan_chunks(files, 100)
    assert len(chunks) == 1 and chunks[0].gzip
    got = [line for _, block in S.read_chunk_lines(chunks[0], block_bytes=1000) for line in block]
    assert got == lines


def test_list_files_globs_dirs_and_missing(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    for name in ("d/a.log", "d/e/b.log.gz", "d/.hidden", "d/_SUCCESS", "c.log"):
        (tmp_path / name).write_bytes(b"PING 1\n")
    got = [os.path.relpath(p, tmp_path) for p, _ in S.list_files([str(tmp_path / "d")])]
    assert got == ["d/a.log", "d/e/b.log.gz"]
    got = [os.path.relpath(p, tmp_path) for p, _ in S.list_files([str(tmp_path / "*.log"), str(tmp_path / "d/*/*.gz")])]
    assert got == ["c.log", "d/e/b.log.gz"]
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        S.list_files([str(tmp_path / "nothing-here*")])



def _capture(args: list[str], out: Path, publish: list[bytes], channel: str) -> list[bytes]:
    """Run redis-cli with ``args`` into ``out`` while ``publish`` goes to ``channel``; return its lines."""
    import subprocess
    import time

    import redis

    redis_cli = require(binary="redis-cli", how="apt-get install redis-tools (make prerequisites)")
    with open(out, "wb") as fh:
        proc = subprocess.Popen([redis_cli, "-h", "127.0.0.1", "-p", "6379", *args], stdout=fh)
        try:
            client = redis.Redis(host="127.0.0.1", port=6379)
            deadline = time.monotonic() + 10
            while client.pubsub_numsub(channel)[0][1] == 0 and "MONITOR" not in args and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            for payload in publish:
                client.publish(channel, payload)
            time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return out.read_bytes().split(b"\n")[:-1]


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["monitor", "redis-csv", "redis-raw"])
def test_real_redis_cli_captures(redis_url: str, channel_prefix: str, tmp_path: Path, mode: str) -> None:
    payloads = spark_archives.protocol_lines(21, 60) + ["RDATA caches master 4 [\"\u00e9\\t\",null,1]".encode()]
    args = {"monitor": ["MONITOR"], "redis-csv": ["--csv", "SUBSCRIBE", channel_prefix], "redis-raw": ["SUBSCRIBE", channel_prefix]}
    lines = _capture(args[mode], tmp_path / "cap.txt", payloads, channel_prefix)
    assert L.detect_format(lines) == mode
    rows = _rows(lines, fmt=mode)
    mine = [r for r in rows if r["channel"] == channel_prefix]
    assert len(mine) == len(payloads)
    for row, payload in zip(mine, payloads):
        try:
            cmd = wire.parse_line(payload)
        except ProtocolError as err:
            assert row["error"] == str(err)
            continue
        assert row["error"] is None and row["command"] == cmd.NAME
        if isinstance(cmd, wire.RdataCommand):
            assert (row["stream"], row["token"]) == (cmd.stream_name, cmd.token)
            assert row["row"].encode() == payload.split(b" ", 4)[4]
    if mode == "monitor":
        assert all(r["ts"] for r in mine)


# ------------------------------------------- which files are archives (logs parse DIR)

def test_detect_format_says_none_for_files_that_are_not_archives() -> None:
    assert L.detect_format([b'{"lines": 5000000, "files": 8, "seed": 20261122}']) is None
    assert L.detect_format([b"# Notes", b"", b"Captured on the staging homeserver.", b"- see the runbook"]) is None
    assert L.detect_format([bytes(range(256))]) is None
    assert L.detect_format([]) == "lines"  # an empty file: an archive without lines
    assert L.detect_format([b"2026-11-24T11:00:00.051Z > RDATA events master 5 []"]) == "lines"
    assert L.detect_format([b"2026-11-24T11:00:00.051Z # connected 127.0.0.1:9092"]) == "lines"
    assert L.detect_format([b"nonsense here", b"> PING 5"]) == "lines"  # the first decisive line decides
    assert L.detect_format([b"OK", b'1795310678.4 [0 lua] "PUBLISH" "c" "PING 1"']) == "monitor"


def test_list_files_ignores_the_recorders_part_files(tmp_path: Path) -> None:
    (tmp_path / "hs1-9092.20261124T110000123456Z.000000.log.gz").write_bytes(gzip.compress(b"PING 1\n"))
    (tmp_path / "hs1-9092.20261124T110500123456Z.000001.log.gz.part").write_bytes(b"\x1f\x8b")
    got = [os.path.basename(p) for p, _ in S.list_files([str(tmp_path)])]
    assert got == ["hs1-9092.20261124T110000123456Z.000000.log.gz"]


def test_archive_formats_skips_files_in_no_format_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "MANIFEST.json").write_text('{"lines": 3}\n')
    (tmp_path / "README.md").write_text("# capture of hs1\n\nTaken during the outage.\n")
    (tmp_path / "a.log").write_bytes(b"2026-11-24T11:00:00.051Z > PING 1\n")
    (tmp_path / "b.log.gz").write_bytes(gzip.compress(b'"message","ch","PING 1"\n'))
    cut = gzip.compress(b"2026-11-24T11:00:00.051Z > PING 1\n" * 20000)
    (tmp_path / "c.log.gz").write_bytes(cut[: len(cut) // 2])  # truncated: detected from what is there
    files = S.list_files([str(tmp_path)])
    with caplog.at_level("WARNING"):
        formats, skipped = S.archive_formats(files)
    assert {os.path.basename(p): f for p, f in formats.items()} == {"a.log": "lines", "b.log.gz": "redis-csv",
                                                                     "c.log.gz": "lines"}
    assert sorted(os.path.basename(p) for p in skipped) == ["MANIFEST.json", "README.md"]
    assert "skipped 2 file(s) whose format was not detected" in caplog.text and "MANIFEST.json" in caplog.text
    assert S.archive_formats(files, "lines") == ({p: "lines" for p, _ in files}, [])  # the user said so
    with pytest.raises(FileNotFoundError, match="no replication archives among 1 file"):
        S.archive_formats(S.list_files([str(tmp_path / "MANIFEST.json")]))


@pytest.mark.spark
@pytest.mark.slow
def test_logs_parse_dir_skips_manifest_and_part_files(tmp_path: Path) -> None:
    import subprocess

    exe = Path(sys.executable).parent / "factstream"
    assert exe.exists(), f"{exe} is missing: run 'make install'"
    src = tmp_path / "capture"
    src.mkdir()
    (src / "MANIFEST.json").write_text('{"lines": 3, "files": 1}\n')
    (src / "hs1.20261124T110000000000Z.000000.log.gz").write_bytes(gzip.compress(
        b"2026-11-24T11:00:00.051Z > POSITION events master 1 2\n2026-11-24T11:00:00.052Z > PING 5\n"
        b"2026-11-24T11:00:01Z # disconnected peer went away\n"))
    (src / "hs1.20261124T110500000000Z.000001.log.gz.part").write_bytes(b"\x1f\x8b\x08")
    out = tmp_path / "parquet"
    res = subprocess.run(
        [str(exe), "logs", "parse", str(src), "--out", str(out), "--master", "local[1]", "--conf", "spark.ui.enabled=false"],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "skipped 1 file(s) whose format was not detected" in res.stderr and "MANIFEST.json" in res.stderr
    assert "wrote 3 lines (0 malformed)" in res.stderr


def _recorded_archives() -> dict[str, list[bytes]]:
    """The same wire lines as the recorder, redis-cli MONITOR and --csv would have written them."""
    rng = random.Random(17)
    base = spark_archives.protocol_lines(9, 600)
    zones = ["Z", "", "+01:00", "-0530", ".5Z", ",123456789+00:00"]
    lines = [b"%s > %s" % (b"2026-%02d-%02dT%02d:00:00%s" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                                                               rng.choice(zones).encode()), p) for p in base]
    lines[5:5] = [b"2026-11-24T11:00:00.051Z # disconnected reset", b"2026-11-24T11:00:03Z # connected 10.0.0.4:9092"]
    monitor = [b"OK"] + [b'%d.%06d [0 127.0.0.1:1] "PUBLISH" "ch" ' % (rng.randint(0, 2 * 10**9), rng.randrange(10**6))
                         + spark_archives.redis_quote(p) for p in base]
    csv = [b'"subscribe","ch",1'] + [b'"message","ch",' + spark_archives.redis_quote(p) for p in base]
    return {"lines": lines, "monitor": monitor, "redis-csv": csv}


@pytest.mark.parametrize("zone", ["UTC", "+05:30", "Europe/Berlin"])
@pytest.mark.parametrize("fmt", ["lines", "monitor", "redis-csv"])
def test_recorded_archives_give_the_same_batches_on_both_builders(fmt: str, zone: str) -> None:
    lines = _recorded_archives()[fmt]
    for typed in (True, False):
        got = {impl: pa.Table.from_batches(list(L.parse_block(lines, source="f", fmt=fmt, typed=typed, batch_rows=97,
                                                               session_time_zone=zone, impl=impl)))
               for impl in ("c", "python")}
        assert got["c"].equals(got["python"])
        assert got["c"].num_rows == len(lines) - (0 if fmt == "lines" else 1)  # OK / subscribe carry no payload
        if fmt != "redis-csv":  # --csv output has no timestamps
            assert got["c"].column("ts").null_count < got["c"].num_rows // 10
