"""A tqdm bar of finished Spark tasks, fed by the status tracker while a job runs."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["task_progress"]


@contextmanager
def task_progress(sc: SparkContext, description: str, *, enabled: bool = True, interval: float = 0.5) -> Iterator[None]:
    """Show completed/total tasks of the jobs started inside the ``with`` block.

    Polls ``sc.statusTracker()`` from a daemon thread; writes to stderr and
    only when ``enabled`` (the CLI disables it when stderr is not a terminal
    unless --progress is given).
    """
    if not enabled:
        yield
        return
    from tqdm import tqdm

    tracker = sc.statusTracker()
    group = f"factstream-{id(description)}-{threading.get_ident()}"
    sc.setJobGroup(group, description)
    stop = threading.Event()
    bar = tqdm(total=0, desc=description, unit="task", file=sys.stderr, dynamic_ncols=True, leave=True)

    def poll_once() -> None:
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        if total:
            bar.total = total
            bar.n = done
            bar.refresh()

    def poll() -> None:
        while True:
            poll_once()
            if stop.wait(interval):
                return

    thread = threading.Thread(target=poll, name="factstream-progress", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        if ok:
            # Stages skipped (cached, or already computed) never complete their tasks: a job that
            # finished has done all the work there was, so the bar ends full.
            try:
                poll_once()
            except Exception:  # noqa: BLE001 - the tracker is gone with the JVM; the bar still closes
                pass
            bar.total = bar.total or 1
            bar.n = bar.total
            bar.refresh()
        bar.close()
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
