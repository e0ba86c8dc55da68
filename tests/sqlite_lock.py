"""A SQLite file locked by a real second process, for the tests of what a lock does to our paths."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Another process: runs its statements on the file, says "locked", holds on until a line on stdin.
LOCKER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
for sql in sys.argv[2:]:
    c.execute(sql).fetchall()
print("locked", flush=True)
sys.stdin.readline()
"""


@contextmanager
def held(path: Path, *statements: str) -> Iterator[None]:
    """``path`` locked by another process running ``statements`` (default ``BEGIN EXCLUSIVE``) meanwhile."""
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(path), *(statements or ("BEGIN EXCLUSIVE",))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n", "the locker did not get its lock"
        yield
    finally:
        proc.communicate("\n", timeout=10)
        assert proc.returncode == 0
