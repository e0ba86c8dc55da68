"""The live replication demo: separate processes, a SIGKILLed reader, verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typing import Any

import pytest

from conftest import subprocess_env

from factstream.demo.live import recover_log, verify_log



def check_demo_report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The demo's --json report says every reader got every fact once, in order, unaltered."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["writer"]["facts"] > 1000 and report["writer"]["rolled_back_ids"] > 0
    killed = [r for r in report["readers"] if r["restarts"]]
    assert len(killed) == 1 and len(report["readers"]) == 2
    for r in report["readers"]:
        # a reader the writer dropped says what the writer said, and came back each time
        assert r["connection_ends"] <= r["connects"] <= r["connection_ends"] + 1
        assert r["writer_closes"] <= r["connection_ends"] and bool(r["writer_errors"]) == bool(r["writer_closes"])
        for stream in r["verification"]["streams"].values():
            assert stream["lost"] == stream["duplicated"] == stream["reordered"] == stream.get("altered", 0) == 0
            assert stream["received"] == stream["facts"] > 0
    return report


@pytest.mark.slow
def test_demo_runs_and_verifies(tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, "-m", "factstream.cli", "demo", "--duration", "4", "--json", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    report = check_demo_report(proc)
    # The summary a person reads explains a reader's extra connections when the writer dropped it.
    from factstream.cli.demo import print_summary

    slow, other = report["readers"]
    slow["connection_ends"], slow["writer_closes"] = 3, 2
    slow["writer_errors"] = ["client fell behind: more than 100000 commands buffered"]
    slow["catchup_rows"] = 1234
    other["connection_ends"], other["writer_closes"], other["writer_errors"] = 0, 0, []
    print_summary(report)
    out = capsys.readouterr().out
    assert (f"{slow['name']}: its connection ended 3 times (the writer said: client fell behind: more than 100000 "
            "commands buffered; once without a word from the writer); it reconnected and caught up from the "
            "database (1,234 rows)") in out
    assert f"{other['name']}: its connection" not in out
    assert "PASS" in out
    # Redis tells a subscriber nothing of why it was cut: the summary says only what happened.
    slow.update(carrier="redis", connection_ends=2, writer_closes=0, writer_errors=[])
    print_summary(report)
    out = capsys.readouterr().out
    assert (f"{slow['name']}: its connection to Redis ended twice; it reconnected and caught up from the database "
            "(1,234 rows)") in out
    # The summary says how a reader got what it missed, as its figures say: a NATS reader that fetched
    # nothing from the database replayed the log (the footnote said "caught up from the database").
    for r in report["readers"]:
        r.update(carrier="nats", catchup_rows=0, restarts=0)
    slow.update(connection_ends=1, restarts=1)
    print_summary(report)
    out = capsys.readouterr().out
    assert "* killed with SIGKILL midway and restarted; it resumed from its own log and replayed what it missed " \
        "from the JetStream log (nothing from the database)" in out
    assert "from the database" not in out.replace("(nothing from the database)", "")


def _log(path: str, lines: list[list[object]]) -> None:
    with open(path, "w") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")


def test_verification_catches_lost_duplicated_and_reordered_facts(tmp_path: os.PathLike[str]) -> None:
    truth = {"caches": {2: [["a"]], 3: [["b"], ["c"]], 5: [["d"]]}}
    path = os.path.join(str(tmp_path), "r.log")
    _log(path, [["caches", 2, [["a"]]], ["caches", 3, [["c"], ["b"]]], ["caches", 5, [["d"]]]])
    assert verify_log(path, truth)["ok"]
    _log(path, [["caches", 2, [["a"]]], ["caches", 5, [["d"]]]])
    assert verify_log(path, truth)["streams"]["caches"]["lost"] == 1
    _log(path, [["caches", 2, [["a"]]], ["caches", 3, [["b"], ["c"]]], ["caches", 3, [["b"], ["c"]]], ["caches", 5, [["d"]]]])
    rep = verify_log(path, truth)["streams"]["caches"]
    assert rep["duplicated"] == 1 and not rep["ok"]
    _log(path, [["caches", 3, [["b"], ["c"]]], ["caches", 2, [["a"]]], ["caches", 5, [["d"]]]])
    assert verify_log(path, truth)["streams"]["caches"]["reordered"] == 1
    _log(path, [["caches", 2, [["x"]]], ["caches", 3, [["b"], ["c"]]], ["caches", 5, [["d"]]]])
    assert verify_log(path, truth)["streams"]["caches"]["altered"] == 1


def test_recover_log_drops_a_torn_line(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "r.log")
    with open(path, "w") as fh:
        fh.write('["caches", 2, [["a"]]]\n["to_device", 4, [["x"], ["y"]]]\n["caches", 7, [["tor')
    positions, rows = recover_log(path)
    assert positions == {("caches", "master"): 2, ("to_device", "master"): 4} and rows == 3
    with open(path) as fh:
        assert fh.read().endswith("]]]\n")
