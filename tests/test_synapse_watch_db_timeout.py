"""``synapse watch --db-timeout``: a database that stops answering never stalls the watch.

The watch probes Synapse's database at every report. Before, a probe waited
as long as the database let it: behind a table locked by a migration
(Synapse's schema migrations take ACCESS EXCLUSIVE locks) or on a server that
went silent after the connect, the watch printed nothing more, for ever. Now a
probe that has not answered within --db-timeout is cancelled (or its
connection cut), the report says so as it says any failed probe
(``db_error``, "database probe failed"), and the next report probes again; a
database that does not answer at the start is one line and exit 2, as
``synapse check`` says it.

The database is a copy of the Synapse template (made by Synapse itself); the
wire is the real Redis, on a channel nobody else uses (no Synapse runs: the
database probe is what is tested). The ``factstream`` executable runs as a
user runs it.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cli_run import ENV, FACTSTREAM, cli, no_traceback
from freezing_proxy import FreezingProxy, StallingProxy
from synapse_deployment import Watch
from synapse_fixtures import SynapseDb, synapse_db, synapse_template  # noqa: F401
from test_cli_db_timeout import MESSAGE, locked

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

#: The application_name of the watch's database connections (snapshot.connect's).
APPLICATION = "factstream-synapse-check"


def channel() -> str:
    """A server name no Synapse and no other test publishes on."""
    return f"dbtimeout-{uuid.uuid4().hex[:8]}.test"


def waiting(db: SynapseDb) -> int:
    """How many of the watch's queries wait for a lock in ``db`` now."""
    rows = db.sql(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db.name}' "
                  f"AND application_name = '{APPLICATION}' AND wait_event_type = 'Lock'")
    return int(rows[0][0])


def eventually(what: str, ok: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


def quiet(stderr: str) -> bool:
    """Nothing on stderr but the watch's own warning that no writer speaks (no Synapse runs here): no traceback,
    no driver warning about a cancel request left unanswered."""
    return no_traceback(stderr) and all("nothing heard from any writer" in line for line in stderr.splitlines())


def gave_up(report: dict[str, Any], after: float) -> bool:
    return bool(report["db_error"]) and MESSAGE.format(after=after) in report["db_error"]


def test_a_locked_table_is_reported_after_db_timeout_and_the_watch_goes_on(synapse_db: SynapseDb,
                                                                           redis_url: str) -> None:
    """Before: with stream_positions locked by a migration, the probe waited behind the lock and the watch printed
    no report while it was held. Now each report's probe gives up after --db-timeout (a failed probe: not healthy),
    the reports go on, the first after the lock is released is a working probe again, and each cancelled query
    leaves nothing waiting behind the lock. Ctrl-C during a probe behind the lock still ends the watch at once
    (the probe now runs under a deadline of its own, which a Ctrl-C gives up on)."""
    from factstream.redaction import redact_url

    watch = Watch("--redis", redis_url, "--server-name", channel(), "--db", synapse_db.dsn, "--json",
                  "--interval", "1", "--db-timeout", "2")
    try:
        watch.wait_for("a working probe", lambda r: r["redis_subscribed"] and r["db_error"] is None, timeout=30)
        with locked(synapse_db.dsn, "stream_positions"):
            began = time.monotonic()
            first = watch.wait_for("the probe given up on", lambda r: gave_up(r, 2), timeout=30)
            took = time.monotonic() - began
            assert took < 2 + 1 + 4, f"reported {took:.1f} s after the lock (--db-timeout 2, --interval 1)"
            assert first["healthy"] is False and first["redis_subscribed"] is True, first
            assert first["db_error"] == f"{redact_url(synapse_db.dsn)} {MESSAGE.format(after=2)}", first
            # The watch goes on: each report probes again, and gives up again while the lock is held.
            for _ in range(2):
                watch.wait_for("another report behind the lock", lambda r: gave_up(r, 2), timeout=2 + 1 + 4)
        watch.wait_for("a working probe after the lock", lambda r: r["db_error"] is None, timeout=2 + 1 + 4)
        eventually("no query left behind the lock", lambda: waiting(synapse_db) == 0, timeout=5)

        # Ctrl-C while a probe waits behind the lock: the query is cancelled and the watch ends (130).
        with locked(synapse_db.dsn, "stream_positions"):
            eventually("a probe waiting behind the lock", lambda: waiting(synapse_db) == 1)
            began = time.monotonic()
            watch.proc.send_signal(signal.SIGINT)
            try:
                status = watch.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                raise AssertionError("Ctrl-C did not end the watch while its probe waited behind a lock") from None
            took = time.monotonic() - began
            assert status == 130 and took < 4, (status, took)
            assert waiting(synapse_db) == 0
    finally:
        err = watch.stop()
    assert quiet(err), err


def test_the_text_report_says_the_probe_was_given_up_on(synapse_db: SynapseDb, redis_url: str) -> None:
    """Behind a lock held all along: every report says it, and --duration ends the watch on time (it waited for
    ever), exit 1: not healthy."""
    from factstream.redaction import redact_url

    with locked(synapse_db.dsn, "stream_positions"):
        began = time.monotonic()
        out = cli("synapse", "watch", "--redis", redis_url, "--server-name", channel(), "--db", synapse_db.dsn,
                  "--interval", "1", "--duration", "3", "--db-timeout", "1", timeout=60)
        took = time.monotonic() - began
        assert waiting(synapse_db) == 0
    assert out.returncode == 1 and quiet(out.stderr), out.stderr
    failed = f"  database probe failed: {redact_url(synapse_db.dsn)} {MESSAGE.format(after=1)}"
    reports = out.stdout.strip().split("\n\n")
    assert len(reports) >= 2 and all(failed in r.splitlines() for r in reports), out.stdout
    assert took < 3 + 1 + 4, f"--duration 3 ended after {took:.1f} s"


def test_a_database_silent_at_the_start_is_one_line_and_exit_2(synapse_db: SynapseDb, redis_url: str) -> None:
    """The server takes the connect, then answers nothing (a frozen host): the watch names it after --db-timeout
    and exits 2, as synapse check does; before, it never started and never said why."""
    from factstream.redaction import redact_url

    proxy = FreezingProxy()
    try:
        url = proxy.url(synapse_db.dsn)
        began = time.monotonic()
        out = subprocess.run([FACTSTREAM, "synapse", "watch", "--redis", redis_url, "--server-name", channel(),
                              "--db", url, "--db-timeout", "2", "--duration", "60"],
                             capture_output=True, text=True, timeout=90, env=ENV)
        took = time.monotonic() - began
        assert proxy.frozen.is_set()  # it connected, and its first query went unanswered
    finally:
        proxy.close()
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    assert out.stderr == f"factstream synapse watch: {redact_url(url)} {MESSAGE.format(after=2)}\n", out.stderr
    assert took < 2 + 4, f"gave up {took - 2:.1f} s after --db-timeout"


@pytest.fixture
def stalling_proxy() -> Iterator[StallingProxy]:
    proxy = StallingProxy()
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_server_that_stops_answering_mid_watch(synapse_db: SynapseDb, redis_url: str,
                                                 stalling_proxy: StallingProxy) -> None:
    """The server goes silent under the watch (a cancel request unanswered too): each report still comes, saying
    the probe was given up on, then, while the reconnect waits for its connect_timeout (nothing interrupts a
    connect), that it has still not answered, rather than piling up connections; once the server answers again,
    so does the probe. Before: the first probe after the freeze never returned, and nothing more was printed."""
    url = stalling_proxy.url(synapse_db.dsn)
    watch = Watch("--redis", redis_url, "--server-name", channel(), "--db", url, "--json", "--interval", "1",
                  "--db-timeout", "2")
    try:
        watch.wait_for("a working probe", lambda r: r["redis_subscribed"] and r["db_error"] is None, timeout=30)
        stalling_proxy.stall()
        began = time.monotonic()
        watch.wait_for("the probe given up on", lambda r: gave_up(r, 2), timeout=30)
        took = time.monotonic() - began
        # a second to answer the cancel request, then the connection is cut
        assert took < 2 + 1 + 1 + 4, f"reported {took:.1f} s after the server stopped answering"
        still = watch.wait_for("the reconnect still waiting",
                               lambda r: "has still not answered: the probe given up on" in (r["db_error"] or ""),
                               timeout=15)
        assert still["healthy"] is False, still
        # One reconnect at a time, whatever the number of reports meanwhile (and the first probe's cancel request).
        made = stalling_proxy.accepted_while_stalled
        for _ in range(2):
            watch.wait_for("more reports", lambda r: bool(r["db_error"]), timeout=5)
        now = stalling_proxy.accepted_while_stalled
        assert made <= 2 and now == made, (made, now)
        stalling_proxy.resume()
        # the reconnect made while stalled gives up by its connect_timeout (10 s), then the next one works
        watch.wait_for("a working probe again", lambda r: r["db_error"] is None, timeout=30)
    finally:
        err = watch.stop()
    assert quiet(err), err


@pytest.mark.parametrize("value,says", [
    ("0", "must be more than 0"), ("-3", "must be more than 0"), ("soon", "expected a duration"),
    ("inf", "expected a finite duration"), ("nan", "expected a finite duration"),
])
def test_bad_db_timeout_values_are_refused(value: str, says: str) -> None:
    out = cli("synapse", "watch", "--redis", "redis://127.0.0.1:1/0", "--server-name", "x.test",
              "--db", "postgresql://u:pw@127.0.0.1:1/synapse", f"--db-timeout={value}")
    assert out.returncode == 2 and "--db-timeout" in out.stderr and says in out.stderr, out.stderr
    assert no_traceback(out.stderr) and "pw" not in out.stderr


def test_db_timeout_without_a_database_is_refused() -> None:
    """--db-timeout bounds the database: with --no-db, or nothing naming a database, it is a mistake to say."""
    base = ["synapse", "watch", "--redis", "redis://127.0.0.1:1/0", "--server-name", "x.test", "--db-timeout", "5"]
    for extra, says in (([], "--db-timeout applies to the database (--db URL, or the database section of --config)"),
                        (["--no-db"], "which --no-db leaves out")):
        out = cli(*base, *extra)
        assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr
