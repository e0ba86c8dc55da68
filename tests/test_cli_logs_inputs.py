"""``factstream logs parse`` and ``factstream decode`` on the inputs operators really have.

gzip files are recognised by their first bytes, not by their names (logrotate's
``capture.1``, a ``traffic.log`` that is gzip, a plain file called ``.gz``);
CRLF line endings end a line; files compressed with something else, files that
cannot be read and directories that cannot be listed are named, with what to
do, and make the exit status 2 while the rest is parsed; symbolic links never
make a file count twice (nor a link loop make it count forty times); a path
holding glob characters, or named on its own whatever its name, is read; '-'
is refused before the JVM starts. The Spark cases share one run (a JVM start
costs ~10 s); the parsed rows are read back with pyarrow, not Spark.
"""

from __future__ import annotations

import collections
import gzip
import json
import lzma
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, IN_CI, cli, no_traceback, require_spark_cli

SPARK = ("--master", "local[2]", "--conf", "spark.ui.enabled=false")
#: A Java that does not exist: a command that started the JVM would fail on it, not with its usage error.
NO_JAVA = {"JAVA_HOME": "/nonexistent/java-home"}
#: Root reads mode-000 files; without these capabilities it cannot (setpriv drops them for the run).
NO_DAC = ("--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search")




def _wire(n: int, first: int) -> list[str]:
    """n wire lines: RDATA and POSITION (whose last field is a token, what a stray CR breaks)."""
    out = []
    for i in range(n):
        t = first + i
        if i % 5 == 4:
            out.append(f"POSITION events master {t - 1} {t}")
        else:
            out.append(f'RDATA events master {t} ["ev",["$e{t}:hs","!r:hs","m.room.message",null,null,null,null,false,false]]')
    return out


def _recorded(n: int, first: int) -> list[str]:
    return [f"2026-11-24T10:{(i // 60) % 60:02d}:{i % 60:02d}.000Z > {line}" for i, line in enumerate(_wire(n, first))]


def _monitor(n: int, first: int) -> list[str]:
    return [f'1795300000.{i:06d} [0 127.0.0.1:5555] "PUBLISH" "repl" "{line.replace(chr(34), chr(92) + chr(34))}"'
            for i, line in enumerate(_wire(n, first))]


def _text(lines: list[str], eol: str = "\n") -> bytes:
    return "".join(line + eol for line in lines).encode()


def _rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["source_file", "line_number", "command", "token", "error"])
    return table.to_pylist()


def test_parse_reads_gzip_by_content_and_names_every_input_it_skips(tmp_path: Path) -> None:
    require_spark_cli()
    src = tmp_path / "archives"
    (src / "sub").mkdir(parents=True)
    (src / "rotated").mkdir()
    (src / "traffic.log").write_bytes(gzip.compress(_text(_recorded(300, 1))))  # gzip, not named so
    (src / "capture.1").write_bytes(gzip.compress(_text(_monitor(200, 1000), "\r\n")))  # logrotate's; and CRLF
    (src / "plain.gz").write_bytes(_text(_recorded(250, 2000)))  # plain, named .gz
    (src / "crlf.log").write_bytes(_text(_recorded(400, 3000), "\r\n"))
    raw = "".join(f"message\r\nrepl\r\n{line}\r\n" for line in _wire(50, 4000))  # redis-cli SUBSCRIBE, CRLF
    (src / "raw-subscribe.txt").write_bytes(("subscribe\r\nrepl\r\n1\r\n" + raw).encode())
    (src / "ok.log").write_bytes(_text(_recorded(120, 5000)))
    (src / "rotated" / "current.log").symlink_to("../ok.log")  # the same file again: parsed once
    (src / "sub" / "loop").symlink_to("..")  # a link loop: followed, the files used to be parsed ~40 times over
    (src / "dangling.log").symlink_to("nowhere.log")
    (src / "capture[2].log").write_bytes(_text(_recorded(30, 6000)))  # named on its own below: glob characters
    (src / "empty.log").write_bytes(b"")
    (src / "empty.log.gz").write_bytes(b"")
    (src / "README").write_text("capture of hs1, see the runbook\n")
    (src / "old.log.xz").write_bytes(lzma.compress(_text(_recorded(10, 7000))))
    secret = src / "secret.log"
    secret.write_bytes(_text(_recorded(10, 8000)))
    secret.chmod(0)
    locked = src / "locked"
    locked.mkdir()
    (locked / "inside.log").write_bytes(_text(_recorded(10, 9000)))
    locked.chmod(0)
    hidden = tmp_path / "_named.log"  # hidden names are skipped in directories, not when named on their own
    hidden.write_bytes(_text(_recorded(20, 10000)))
    out = tmp_path / "pq"
    cmd = [FACTSTREAM, "logs", "parse", str(src), str(src / "capture[2].log"), str(hidden), "--out", str(out), *SPARK]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            msg = "running as root: setpriv (util-linux) is needed to make a file unreadable"
            if IN_CI:
                pytest.fail(msg + " (CI=true: this test must run)")
            pytest.skip(msg)
        cmd = [setpriv, *NO_DAC, *cmd]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    finally:
        locked.chmod(0o755)
        secret.chmod(0o644)
    err = done.stderr
    assert no_traceback(err) and "Exception" not in err, err
    assert done.returncode == 2, err
    rows = _rows(out)
    lines = collections.Counter(os.path.relpath(r["source_file"], tmp_path) for r in rows)
    bad = collections.Counter(os.path.relpath(r["source_file"], tmp_path) for r in rows if r["error"] is not None)
    assert lines == {
        "archives/traffic.log": 300, "archives/capture.1": 200, "archives/plain.gz": 250, "archives/crlf.log": 400,
        "archives/raw-subscribe.txt": 50, "archives/ok.log": 120, "archives/capture[2].log": 30, "_named.log": 20,
    }, err
    assert not bad, [r for r in rows if r["error"] is not None][:3]
    positions = sorted(r["token"] for r in rows if r["command"] == "POSITION" and r["source_file"].endswith("crlf.log"))
    assert positions == [3000 + i for i in range(4, 400, 5)]
    # what was not parsed is named at the end, with what to do, and counted
    assert f"{src}/old.log.xz: not parsed: compressed with xz" in err and f"unxz {src}/old.log.xz" in err, err
    assert f"{secret}: not parsed: cannot read: Permission denied" in err, err
    assert f"{locked}: not parsed: cannot read the directory: Permission denied" in err, err
    assert "3 of 14 inputs could not be read to their end" in err, err
    # the links left out are logged once (the listing before the JVM starts says nothing)
    assert err.count("broken symbolic link") == 1 and f"{src}/dangling.log" in err, err
    assert f"{src}/rotated/current.log (= {src}/ok.log)" in err and f"{src}/sub/loop" in err, err
    assert "whose format was not detected" in err and f"{src}/README" in err, err


def test_parse_refuses_stdin_and_names_broken_links_before_the_jvm_starts(tmp_path: Path) -> None:
    done = cli("logs", "parse", "-", "--out", str(tmp_path / "o"), **NO_JAVA)
    assert done.returncode == 2 and no_traceback(done.stderr), done.stderr
    assert "logs parse reads files, not stdin ('-')" in done.stderr and "factstream decode -" in done.stderr
    (tmp_path / "current.log").symlink_to("hs1.2026-11-24.log")
    done = cli("logs", "parse", str(tmp_path / "current.log"), "--out", str(tmp_path / "o"), **NO_JAVA)
    assert done.returncode == 2 and no_traceback(done.stderr), done.stderr
    assert "(a broken symbolic link to hs1.2026-11-24.log)" in done.stderr, done.stderr


def test_decode_takes_crlf_as_a_line_ending(tmp_path: Path) -> None:
    path = tmp_path / "crlf.log"
    path.write_bytes(_text(_recorded(50, 1), "\r\n") + b"2026-11-24T11:00:00.000Z > PING 17\r\n")
    done = cli("decode", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["error_count"] == 0 and summary["lines"] == 51
    assert summary["streams"] == [{"stream": "events", "instance": "master", "rows": 40, "batch_rows": 0,
                                   "positions": 10, "min_token": 1, "max_token": 50}]


def test_decode_names_other_compressions_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "old.log"
    path.write_bytes(lzma.compress(_text(_recorded(10, 1))))
    done = cli("decode", str(path))
    assert done.returncode == 2 and no_traceback(done.stderr), done.stderr
    assert f"{path}: compressed with xz, which is not read (only gzip is): decompress it first (unxz {path})" in done.stderr
    piped = subprocess.run([FACTSTREAM, "decode", "-"], input=path.read_bytes(), capture_output=True, env=ENV, timeout=60)
    assert piped.returncode == 2, piped.stderr
    assert b"-: compressed with xz" in piped.stderr and b"pipe it through unxz" in piped.stderr, piped.stderr


@pytest.mark.parametrize(("uri", "said"), [
    ("s3a://bucket/in.log", "no filesystem for s3a://: write s3:// for s3a://"),
    ("gopher://host/in.log", "no filesystem for gopher:// (it reads s3://, gs://, hdfs:// and local paths)"),
    ("hdfs://127.0.0.1:1/in.log", "pyarrow reads hdfs:// through a JVM and Hadoop's libhdfs; set JAVA_HOME"),
])
def test_an_input_uri_pyarrow_cannot_open_is_one_line_before_the_jvm(tmp_path: Path, uri: str, said: str) -> None:
    """Inputs are read with pyarrow.fs: Hadoop's s3a:// was "Unrecognized filesystem type in URI" (exit 1), and
    hdfs:// without a JVM and libhdfs printed 88 lines of dlopen attempts."""
    out = cli("logs", "parse", uri, "--out", str(tmp_path / "pq"), *SPARK, JAVA_HOME="/nonexistent/java-home",
              timeout=120)
    assert out.returncode == 2 and no_traceback(out.stderr), out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"factstream logs: {uri}: "), out.stderr
    assert said in out.stderr and "dlopen" not in out.stderr, out.stderr
    assert not (tmp_path / "pq").exists()
