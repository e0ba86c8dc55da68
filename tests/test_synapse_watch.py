"""``factstream synapse watch`` against a real Synapse: a main process and a generic worker on Redis.

The deployment (tests/synapse_deployment.py) has two receipts writers
(``master`` and ``worker1``); the test drives the client API (messages and
read receipts through the main process) while the installed ``factstream``
executable watches the deployment's Redis channel and database. It must say
healthy under normal traffic, then name each problem the test provokes:

* a writer stopped with SIGSTOP (worker1 stops echoing the receipts stream's
  progress): ``writer_behind``;
* a receipt committed behind Synapse's back under an id the wire had already
  covered (the element-hq/synapse#19795 shape): ``unpublished``, with its id;
* a receipt committed behind Synapse's back above the wire's token, which
  Synapse never announces (#20080's shape): ``frozen``, until Synapse's next
  receipt carries the stream past it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import REDIS_HOST, REDIS_PORT, pg_dsn
from synapse_deployment import SynapseDeployment, Watch, free_port, running_deployment
from synapse_fixtures import factstream

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

REDIS = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


def writer(report: dict[str, Any], stream: str, name: str) -> dict[str, Any] | None:
    return next((w for w in report["writers"] if w["stream"] == stream and w["writer"] == name), None)


def problem(report: dict[str, Any], kind: str, stream: str, name: str) -> dict[str, Any] | None:
    return next((p for p in report["problems"] if (p["kind"], p["stream"], p["writer"]) == (kind, stream, name)), None)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[SynapseDeployment]:
    with running_deployment(tmp_path / "synapse", "factstream_synw_") as dep:
        yield dep


def _insert_receipt(dsn: str, stream_id: str, user: str) -> int:
    """A read receipt committed behind Synapse's back; returns its id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO receipts_linearized (stream_id, room_id, receipt_type, user_id, event_id, data, instance_name) "
            f"VALUES ({stream_id}, '!behind:x', 'm.read', %s, '$behind', '{{}}', 'master') RETURNING stream_id",
            (user,)).fetchone()
    assert row is not None
    return int(row[0])


def test_watch_a_live_synapse_deployment(deployment: SynapseDeployment) -> None:
    dsn = pg_dsn(deployment.dbname)
    token = deployment.register("alice")
    room = deployment.create_room(token)
    metrics_port = free_port()
    watch = Watch("--redis", REDIS, "--server-name", deployment.server_name, "--db", dsn, "--json",
                  "--interval", "1", "--frozen-after", "3", "--metrics-port", str(metrics_port))
    try:
        # 1. Normal traffic: healthy, both receipts writers on the wire, nothing behind in the database.
        watch.wait_for("a first report", lambda r: r["redis_subscribed"], timeout=30)
        last_event = ""
        for i in range(8):
            last_event = deployment.send(token, room, f"hello {i}")
            deployment.receipt(token, room, last_event)
        report = watch.wait_for(
            "healthy traffic",
            lambda r: r["healthy"] and (writer(r, "receipts", "master") or {}).get("rows_total", 0) >= 8
            and writer(r, "receipts", "worker1") is not None and writer(r, "events", "master") is not None)
        events = writer(report, "events", "master")
        assert events is not None and events["token"] > 0 and events["db_lag"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        assert 'factstream_synapse_stream_token{stream="events",writer="master"}' in scraped
        assert "factstream_synapse_watch_healthy 1.0" in scraped
        assert 'factstream_synapse_stream_rows_total{stream="receipts",writer="master"}' in scraped

        # 2. A writer stopped: worker1 no longer follows the receipts stream, master moves on.
        deployment.pause("worker1")
        try:
            def behind(r: dict[str, Any]) -> bool:
                deployment.receipt(token, room, deployment.send(token, room, "while worker1 sleeps"))
                return problem(r, "writer_behind", "receipts", "worker1") is not None
            report = watch.wait_for("worker1 behind", behind, timeout=60)
            assert "worker1" in problem(report, "writer_behind", "receipts", "worker1")["summary"]  # type: ignore[index]
        finally:
            deployment.resume("worker1")

        def recovered(r: dict[str, Any]) -> bool:
            deployment.receipt(token, room, deployment.send(token, room, "worker1 is back"))
            return bool(r["healthy"])
        watch.wait_for("recovery", recovered, timeout=60)

        # 3. A committed row the wire skipped: steal an id, let Synapse cover it, then commit a row under it.
        with psycopg.connect(dsn, autocommit=True) as conn:
            stolen = int(conn.execute("SELECT nextval('receipts_sequence')").fetchone()[0])  # type: ignore[index]
        deployment.receipt(token, room, deployment.send(token, room, "covers the stolen id"))
        watch.wait_for("the stolen id covered", lambda r: (writer(r, "receipts", "master") or {}).get("token", 0) > stolen)
        _insert_receipt(dsn, str(stolen), "@skipped:x")
        report = watch.wait_for("an unpublished row",
                                lambda r: problem(r, "unpublished", "receipts", "master") is not None)
        assert problem(report, "unpublished", "receipts", "master")["ids"] == [stolen]  # type: ignore[index]

        # 4. A row above the wire's token that Synapse never announces: frozen, until Synapse writes again.
        sneaked = _insert_receipt(dsn, "nextval('receipts_sequence')", "@sneaked:x")
        report = watch.wait_for("a frozen stream", lambda r: problem(r, "frozen", "receipts", "master") is not None)
        assert f"up to id {sneaked}" in problem(report, "frozen", "receipts", "master")["summary"]  # type: ignore[index]
        assert writer(report, "receipts", "master")["db_lag"] >= 1  # type: ignore[index]
        deployment.receipt(token, room, deployment.send(token, room, "carries the stream on"))
        watch.wait_for("the frozen stream moving again",
                       lambda r: problem(r, "frozen", "receipts", "master") is None
                       and (writer(r, "receipts", "master") or {}).get("token", 0) > sneaked)
    finally:
        err = watch.stop()
    assert "Traceback" not in err, err

    # Human output on a terminal (one report), then a clean exit after --duration.
    text = factstream("synapse", "watch", "--redis", REDIS, "--server-name", deployment.server_name,
                      "--db", dsn, "--interval", "1", "--duration", "2", timeout=60)
    assert f"{deployment.server_name} via {REDIS}" in text.stdout
    assert "receipts" in text.stdout and "db lag" in text.stdout, text.stdout

    # --duration shorter than --interval (default 5): one report when the duration ends; Synapse's writers have
    # answered the REPLICATE by then, so it is healthy.
    began = time.monotonic()
    quick = factstream("synapse", "watch", "--redis", REDIS, "--server-name", deployment.server_name,
                       "--duration", "2", "--json", timeout=60)
    assert quick.returncode == 0 and 2 <= time.monotonic() - began < 3.5, (quick.stdout, quick.stderr)
    [doc] = [json.loads(line) for line in quick.stdout.splitlines()]
    assert doc["healthy"] is True and writer(doc, "receipts", "worker1") is not None, doc

    # A mistyped server name: the deployment's Redis answers, none of its writers does. Not healthy.
    typo = factstream("synapse", "watch", "--redis", REDIS, "--server-name", deployment.server_name + "x",
                      "--duration", "3", "--interval", "1", "--json", timeout=60)
    assert typo.returncode == 1, (typo.stdout, typo.stderr)
    last = json.loads(typo.stdout.splitlines()[-1])
    assert last["healthy"] is False and [p["kind"] for p in last["problems"]] == ["silent"], last


def test_watch_errors_are_one_line(tmp_path: Path) -> None:
    cases = [
        ["--redis", REDIS, "--server-name", "x.test", "--db", "sqlite:///x.db"],
        ["--redis", REDIS, "--server-name", "x.test", "--db", "postgresql://u:pw123@127.0.0.1:1/x", "--duration", "1"],
        ["--redis", REDIS, "--server-name", "x.test", "--interval", "0"],
    ]
    for args in cases:
        proc = factstream("synapse", "watch", *args, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "pw123" not in proc.stderr


def test_watch_ends_quietly_when_its_stdout_closes() -> None:
    """`synapse watch --json | head -1`: the reader has what it asked for (it printed 'Broken pipe', exit 2)."""
    import subprocess

    from synapse_fixtures import FACTSTREAM

    pipeline = (f"'{FACTSTREAM}' synapse watch --redis {REDIS} --server-name closed-stdout.example --no-db "
                "--json --interval 0.3 | head -1")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["server_name"] == "closed-stdout.example"
    assert done.returncode == 0 and done.stderr == "", done.stderr
