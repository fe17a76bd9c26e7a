"""A backfill (a job enqueued with a `run_at` in the past) has waited no time: `health`
said the queue was not draining ("the oldest due job has waited 86402 s", exit 2) right
after one, while backpressure (`max_lag_seconds`) already measured it from its arrival."""

from __future__ import annotations

import time
from pathlib import Path

from jobspool import JobState
from tests.cli_harness import run_cli
from tests.spools import make_spool


def test_a_backfilled_job_is_not_an_old_one(store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("k", {}, job_id="backfill", run_at=time.time() - 86_400)
        spool.enqueue("k", {}, job_id="late", delay=0.05)  # a delayed job: due, then waiting
        time.sleep(0.1)
        age = spool.stats().oldest_due_age
        assert age is not None and age < 60, age
        assert spool.get("backfill").state is JobState.READY
    code, out, err = run_cli("health", root=str(store_root))
    assert code == 0, out + err
