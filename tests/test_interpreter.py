"""factstream.interpreter.settle: what ``factstream serve`` sets once it has started (in a process of its own)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, sys
from factstream.interpreter import settle
before = [gc.get_threshold(), sys.getswitchinterval(), gc.get_freeze_count()]
settle()
cycle = []
cycle.append(cycle)
del cycle
found = gc.collect()  # cycles are still collected
print(json.dumps([before, [gc.get_threshold(), sys.getswitchinterval(), gc.get_freeze_count()], found]))
"""


def test_settle_freezes_start_up_and_sets_the_collector_and_the_gil() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    before, after, found = json.loads(out)
    assert before[0][0] == 700 and before[1] == 0.005 and before[2] == 0  # CPython's defaults
    assert after[0] == [50_000, before[0][1], before[0][2]]
    assert after[1] == 0.0005
    assert after[2] > 1000  # the modules and classes imported so far are out of the collector's walks
    assert found >= 1
