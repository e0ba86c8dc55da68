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
