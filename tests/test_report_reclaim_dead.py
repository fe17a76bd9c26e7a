"""A run's report counts the jobs its own claims dead-lettered.

A claim that takes over an expired lease whose job is out of attempts dead-letters it
instead of leasing it. Those never reached the worker as leases: `RunReport.dead_lettered`
(and `run-until-idle`'s summary, and the worker's metrics) said 0 over a job the run had
just dead-lettered, on both stores (found in the slow-machinery probe).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobspool import JobState, Spool, Worker


def test_dead_letters_made_by_the_runs_claims_are_in_its_report(any_spool: Spool) -> None:
    any_spool.enqueue("k", None, job_id="spent", max_attempts=1)
    any_spool.enqueue("k", None, job_id="again", max_attempts=2)
    leases = any_spool.claim(limit=2, lease_seconds=0.2)
    assert len(leases) == 2
    # Both leases expire: their holder stalled (it never settles).
    deadline = time.monotonic() + 30
    while any(any_spool.get(x.job_id).lease.expires_at > any_spool.now()  # type: ignore[union-attr]
              for x in leases) and time.monotonic() < deadline:
        time.sleep(0.05)
    report = Worker(any_spool, {"k": lambda job, ctx: None}, maintenance=False).run_until_idle()
    assert any_spool.get("spent").state is JobState.DEAD_LETTER
    assert any_spool.get("again").state is JobState.COMPLETED
    assert (report.claimed, report.completed, report.dead_lettered) == (1, 1, 1)


def test_a_claim_that_dead_letters_nothing_adds_nothing(any_spool: Spool) -> None:
    any_spool.enqueue_many("k", [None] * 3)
    report = Worker(any_spool, {"k": lambda job, ctx: None}, maintenance=False).run_until_idle()
    assert (report.claimed, report.completed, report.dead_lettered) == (3, 3, 0)


def test_dead_letters_made_taking_back_a_dead_holders_lease_are_in_the_report(
        tmp_path: Path) -> None:
    # The file spool takes back the leases of provably dead worker processes at once
    # (`reclaim_dead`); a job out of attempts is dead-lettered there, and went uncounted.
    root = tmp_path / "spool"
    with Spool(root, durable=False) as spool:
        spool.enqueue("k", None, job_id="spent", max_attempts=1)
    pid = os.fork()
    if pid == 0:  # a worker process that claims, starts its handler, and dies
        try:
            child = Spool(root, durable=False, lease_seconds=300)
            [lease] = child.claim(kinds=["k"])
            child.note_running([lease.token], started=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    with Spool(root, durable=False) as spool:
        report = Worker(spool, {"k": lambda job, ctx: None}, maintenance=False).run_until_idle()
        assert spool.get("spent").state is JobState.DEAD_LETTER
    assert (report.claimed, report.dead_lettered) == (0, 1)
