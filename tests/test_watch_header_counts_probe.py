"""``synapse watch``: a report whose database probe failed counts it among the problems its header names.

Before: the text report's header counted only the other problems, so with a
writer answering and the probe given up on (a table locked by a migration,
past --db-timeout) the header said "healthy" while the line under it said
"database probe failed", and the exit status said unhealthy (1). Now the
failed probe is one more problem in the header's count. With --json the
report already said ``"healthy": false`` and gives the failure in
``db_error`` (not in ``problems``, whose entries are the wire's and the
database's findings): the header's count is ``len(problems)`` plus one when
``db_error`` is set.

The database is a copy of the Synapse template (made by Synapse itself), its
``stream_positions`` locked as a migration locks it; the writer is a
factstream ``serve --redis`` on a channel of its own, answering the watch's
REPLICATE as a Synapse writer does. The ``factstream`` executable runs as a
user runs it.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from cli_run import cli, no_traceback
from synapse_fixtures import SynapseDb, synapse_db, synapse_template  # noqa: F401
from test_cli_db_timeout import MESSAGE, locked
from test_synapse_cli import redis_writer  # noqa: F401

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def watch_behind_a_lock(db: SynapseDb, redis_url: str, channel: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """A 3 s watch of ``channel`` whose every probe is given up on after --db-timeout 1 (the table stays locked)."""
    with locked(db.dsn, "stream_positions"):
        return cli("synapse", "watch", "--redis", redis_url, "--server-name", channel, "--db", db.dsn,
                   "--interval", "1", "--duration", "3", "--db-timeout", "1", *extra, timeout=60)


def failed_line(db: SynapseDb) -> str:
    from factstream.redaction import redact_url

    return f"  database probe failed: {redact_url(db.dsn)} {MESSAGE.format(after=1)}"


def test_a_failed_probe_is_a_problem_in_the_header_while_a_writer_answers(synapse_db: SynapseDb, redis_url: str,
                                                                          redis_writer: str) -> None:
    """Nothing else wrong: the header said 'healthy' above 'database probe failed'; now '1 problem(s)'. The same
    watch with --json agrees: not healthy, the failure in db_error, no other problem."""
    out = watch_behind_a_lock(synapse_db, redis_url, redis_writer)
    assert out.returncode == 1 and out.stderr == "", (out.returncode, out.stderr)
    reports = out.stdout.strip().split("\n\n")
    assert reports, out.stdout
    for report in reports:
        lines = report.splitlines()
        assert failed_line(synapse_db) in lines, report
        assert lines[0].endswith(f"{redis_writer} via {redis_url}: 1 problem(s)"), report
        assert "healthy" not in lines[0], report
        assert len(lines) > 3, report  # the writer's streams are listed: it answered

    out = watch_behind_a_lock(synapse_db, redis_url, redis_writer, "--json")
    assert out.returncode == 1 and out.stderr == "", (out.returncode, out.stderr)
    docs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert docs, out.stdout
    for doc in docs:
        assert doc["healthy"] is False and doc["redis_subscribed"] is True and doc["writers"], doc
        assert doc["db_error"] and MESSAGE.format(after=1) in doc["db_error"], doc
        assert doc["problems"] == [], doc  # the header's count: len(problems) + 1 for db_error


def test_a_failed_probe_adds_to_the_other_problems(synapse_db: SynapseDb, redis_url: str,
                                                   channel_prefix: str) -> None:
    """No writer on the channel (silent) and the probe given up on: two problems, the header said one."""
    out = watch_behind_a_lock(synapse_db, redis_url, channel_prefix)
    assert out.returncode == 1 and no_traceback(out.stderr), out.stderr
    last = out.stdout.strip().split("\n\n")[-1].splitlines()
    assert failed_line(synapse_db) in last and any(line.startswith("  SILENT: ") for line in last), last
    assert last[0].endswith(f"{channel_prefix} via {redis_url}: 2 problem(s)"), last
