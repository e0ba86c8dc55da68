"""``factstream events-demo``: the event store demo through the CLI, verified end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_events_demo_verifies_every_answer() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "factstream.cli", "events-demo", "--events", "300", "--rooms", "4", "--readers", "1",
         "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    assert summary["events"] >= 300 and len(summary["readers"]) == 1


@pytest.mark.slow
def test_events_demo_keeps_the_database_password_out_of_output_and_ps(postgres_dsn: str) -> None:
    """The demo printed its --db URL (password and all) and put it on every reader's command line."""
    from cli_run import FACTSTREAM

    secret = "s3cr3t-events-pw"
    url = postgres_dsn.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@")
    proc = subprocess.Popen(
        [FACTSTREAM, "events-demo", "--db", url, "--events", "200", "--rooms", "3", "--readers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen_args: list[str] = []
    while proc.poll() is None:  # every process's command line while the demo runs
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        seen_args += [line for line in ps.splitlines() if "factstream.demo.events" in line]
        try:
            proc.wait(0.2)
        except subprocess.TimeoutExpired:
            pass
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "all answers verified" in out
    assert "database postgresql://postgres:***@" in out + err
    assert seen_args, "no reader process was seen"
    for text in (out, err, *seen_args):
        assert secret not in text
