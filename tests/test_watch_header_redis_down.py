"""``synapse watch``: the header of a report without Redis still gives the count of its problems.

Before: a report whose watch was not subscribed to Redis had the header
``<server> via <redis>: NOT SUBSCRIBED to Redis`` and no count, though the
lines under it listed the ``redis_down`` problem (and a failed database probe,
or a configured writer missing, when there were some): the one report where
something is surely wrong was the one whose header did not say how much. Now
the header says the Redis state (never reached or lost, for how long, retried,
and that ``frozen`` and ``writer_behind`` are not judged meanwhile) and ends,
as every unhealthy header does, with ``: N problem(s)``, N counting the
``redis_down`` problem, the other problems and a failed database probe (with
``--json``: ``len(problems)`` plus one when ``db_error`` is set).

Two ways Redis is missing, each against real services: a port nothing
listens on (never reached), and a private redis-server stopped under a
running watch (lost), with a factstream ``serve --redis`` as the writer the
watch heard before. The ``factstream`` executable runs as a user runs it.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli_run import free_port, no_traceback, start, stop
from synapse_deployment import PrivateRedis
from synapse_fixtures import SynapseDb, synapse_db, synapse_template  # noqa: F401
from test_watch_header_counts_probe import failed_line, watch_behind_a_lock

pytestmark = [pytest.mark.redis]

#: A problem line of the text report: "  KIND: ..." or "  KIND stream/writer: ...".
PROBLEM_LINE = re.compile(r"^  [A-Z_]+( \S+)?: ")


def counted(report: str) -> int:
    """The problems a text report lists under its header: problem lines, and a failed database probe."""
    lines = report.splitlines()[1:]
    return sum(1 for line in lines if PROBLEM_LINE.match(line) or line.startswith("  database probe failed: "))


def test_never_reached_the_header_counts_redis_down_and_a_failed_probe(synapse_db: SynapseDb) -> None:
    """A port nothing listens on, the database probe given up on: two problems in the header, not none."""
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    out = watch_behind_a_lock(synapse_db, nowhere, "never-reached.example")
    assert out.returncode == 2 and "never subscribed" in out.stderr and no_traceback(out.stderr), out.stderr
    reports = out.stdout.strip().split("\n\n")
    assert len(reports) >= 2, out.stdout
    for report in reports:
        lines = report.splitlines()
        header = lines[0]
        assert f"never-reached.example via {nowhere}: NOT SUBSCRIBED to Redis (not reached in " in header, header
        assert "retrying; frozen and writer_behind not judged meanwhile" in header, header
        assert header.endswith(": 2 problem(s)") and counted(report) == 2, report
        assert failed_line(synapse_db) in lines and any(line.startswith("  REDIS_DOWN: ") for line in lines), report


class _Reports:
    """The text reports of a running watch, one at a time, as they come (a thread reads its stdout)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        lines: list[str] = []
        for line in self.proc.stdout:
            if line.strip():
                lines.append(line.rstrip("\n"))
            elif lines:
                self.queue.put("\n".join(lines))
                lines = []
        self.queue.put(None)

    def wait_for(self, what: str, ok: Callable[[str], bool], timeout: float = 30) -> str:
        """The first report for which ``ok`` holds (AssertionError after ``timeout`` or when the watch ends)."""
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            try:
                report = self.queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if report is None:
                raise AssertionError(f"the watch ended before {what}; last report:\n{seen}")
            if ok(report):
                return report
            seen = report
        raise AssertionError(f"no report of {what} within {timeout}s; last report:\n{seen}")


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    redis = PrivateRedis()
    redis.start()  # no redis-server: fails (never skips)
    try:
        yield redis
    finally:
        redis.stop()


def test_lost_the_header_says_so_and_keeps_the_count(private_redis: PrivateRedis, channel_prefix: str,
                                                     tmp_path: Path) -> None:
    """Healthy with a writer, then the Redis stopped: 'lost Ns ago' and '1 problem(s)'; the writer still listed."""
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    writer = start("serve", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--redis", url, "--server-name",
                   channel_prefix, "--status")
    watch = None
    try:
        assert writer.stdout is not None
        line = writer.stdout.readline()
        while line and json.loads(line).get("subscribed") is not True:
            line = writer.stdout.readline()
        assert line, f"serve exited: {stop(writer)[1]}"
        watch = start("synapse", "watch", "--redis", url, "--server-name", channel_prefix, "--interval", "1")
        reports = _Reports(watch)
        healthy = reports.wait_for("a healthy report", lambda r: r.splitlines()[0].endswith(": healthy"))
        assert counted(healthy) == 0, healthy

        private_redis.stop()
        for _ in range(3):
            report = reports.wait_for("a report without Redis",
                                      lambda r: "NOT SUBSCRIBED" in r.splitlines()[0])
            lines = report.splitlines()
            assert f"{channel_prefix} via {url}: NOT SUBSCRIBED to Redis (lost " in lines[0], report
            assert "s ago, retrying; frozen and writer_behind not judged meanwhile)" in lines[0], report
            assert lines[0].endswith(": 1 problem(s)") and counted(report) == 1, report
            assert lines[2:] and lines[-1].startswith("  REDIS_DOWN: "), report
            assert len(lines) > 3, report  # the writer's streams, as last heard, are still listed
    finally:
        err = stop(watch)[1] if watch is not None else ""
        stop(writer)
    assert no_traceback(err), err
