"""logs report on what a real Synapse deployment sent: no gap where nothing was lost.

The deployment (tests/synapse_deployment.py) has two receipts writers (the
main process and worker1) sharing one sequence, as Synapse's multi-writer
streams do; the recorder hears its Redis channel while the test sends
messages and read receipts. Every row reached the recording, so the report
must find no gap on any stream, and it must see that receipts' writers share
a sequence.
"""

from __future__ import annotations

import gzip
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_run import cli, require_spark_cli, start, stop
from conftest import REDIS_HOST, REDIS_PORT
from synapse_deployment import SynapseDeployment, running_deployment

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

REDIS = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[SynapseDeployment]:
    with running_deployment(tmp_path / "synapse", "factstream_synr_") as dep:
        yield dep


def test_a_recorded_synapse_deployment_has_no_gaps(deployment: SynapseDeployment, tmp_path: Path) -> None:
    require_spark_cli()
    rec_dir = tmp_path / "rec"
    rec = start("record", "--redis", REDIS, "--server-name", deployment.server_name, "--dir", str(rec_dir))
    try:
        time.sleep(2.0)  # subscribed
        token = deployment.register("alice")
        room = deployment.create_room(token)
        for i in range(20):
            deployment.receipt(token, room, deployment.send(token, room, f"hello {i}"))
        time.sleep(2.0)  # the last rows and positions published
    finally:
        _, err = stop(rec, signal.SIGTERM)
    assert rec.returncode == 0, err
    pq = tmp_path / "pq"
    parsed = cli("logs", "parse", str(rec_dir), "--out", str(pq), timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    done = cli("logs", "report", str(pq), "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    rows = {(s["stream"], s["writer"]): s["rows"] for s in report["streams"]}
    assert rows.get(("events", "master"), 0) >= 20 and rows.get(("receipts", "master"), 0) >= 20, rows
    sequences = {q["stream"]: q for q in report["sequences"]}
    assert sequences["receipts"]["writers"] == 2 and sequences["receipts"]["shared"], sequences["receipts"]
    lost = {q["stream"]: (q["gaps"], q["skipped_tokens"]) for q in report["sequences"] if q["gaps"]}
    assert lost == {}, (lost, report["marks"]["sequence"][:20])

    # The same recording with one receipts row taken out: exactly that token is missing, at the row after it.
    cut = tmp_path / "cut"
    cut.mkdir()
    files = sorted(rec_dir.iterdir())
    texts = [gzip.decompress(f.read_bytes()).decode() for f in files]
    receipts = [(n, line) for n, text in enumerate(texts) for line in text.splitlines()
                if " > RDATA receipts master " in line and line.split(" ")[5].isdigit()]
    tokens = [int(line.split(" ")[5]) for _, line in receipts]
    n, dropped = receipts[len(receipts) // 2]
    assert tokens.count(int(dropped.split(" ")[5])) == 1, "the token dropped is carried by that row alone"
    for f, text in zip(files, texts):
        (cut / f.name).write_bytes(gzip.compress(text.replace(dropped + "\n", "").encode()))
    assert sum(t.count(dropped) for t in texts) == 1
    parsed = cli("logs", "parse", str(cut), "--out", str(tmp_path / "pq-cut"), timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    done = cli("logs", "report", str(tmp_path / "pq-cut"), "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    sequences = {q["stream"]: q for q in report["sequences"]}
    assert (sequences["receipts"]["gaps"], sequences["receipts"]["skipped_tokens"]) == (1, 1), sequences["receipts"]
    assert [(m["stream"], m["kind"], m["tokens"]) for m in report["marks"]["sequence"]] == [("receipts", "gap", 1)]
