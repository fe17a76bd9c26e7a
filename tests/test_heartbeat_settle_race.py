"""A heartbeat that meets its own settle is no lost lease, on both stores.

Found in a probe: a worker logged "lease lost on job … its result will be discarded" for
jobs it had just completed. The heartbeat thread took the run as live, the settle moved
the job to `completed/`, and the heartbeat then found it gone from `leased/` before the
settle had marked the run settled. The job was fine; the warning was false, and the run
was flagged lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from jobspool import Context, Job, JobState, Lease, Spool, Worker


def test_a_heartbeat_racing_the_settle_does_not_call_the_lease_lost(
        make_any_spool: Callable[..., Spool], caplog: pytest.LogCaptureFixture) -> None:
    spool = make_any_spool()
    job = spool.enqueue("k", {})
    moved = threading.Event()
    beats: list[Any] = []
    complete_many, heartbeat_many = spool.complete_many, spool.heartbeat_many

    def completing(items: Any) -> Any:
        out = complete_many(items)
        moved.set()
        time.sleep(0.5)  # the job is in completed/, the run not yet marked settled
        return out

    def beating(leases: Sequence[Lease], **options: Any) -> Any:
        # A beat that took the run for live while its handler ran lands after the move.
        if not moved.is_set():
            moved.wait(5)
        out = heartbeat_many(leases, **options)
        beats.extend(out)
        return out

    spool.complete_many = completing  # type: ignore[method-assign]
    spool.heartbeat_many = beating  # type: ignore[method-assign]

    def handler(job: Job, ctx: Context) -> str:
        time.sleep(0.4)  # past the first beat (lease 0.6 s: a beat every 0.2 s)
        return "done"

    with caplog.at_level(logging.WARNING, logger="jobspool"):
        report = Worker(spool, {"k": handler}, lease_seconds=0.6).run_until_idle()
    assert beats, "no heartbeat met the settle: the race was not set up"
    assert (report.completed, report.lease_lost) == (1, 0)
    assert spool.get(job.id).state is JobState.COMPLETED
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()], caplog.text
