"""A run that returned within its time limit keeps its lease beaten until its settle lands.

Found by a chaos probe: the heartbeat's time-limit check did not ask whether the run had
ended, so a job of a kind with a time limit whose settle was slow (a projection commit on a
loaded disk or object storage; a fresh worker's first LanceDB merge) was called "past its
time limit and still running", its lease no longer extended: it expired, the job ran again,
and after max_attempts such successes it was dead-lettered.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jobspool import Context, Job, JobState, Policy, Worker
from jobspool.queue.sink import LanceSink
from tests.spools import make_spool


def test_a_run_done_in_time_keeps_its_lease_through_a_slow_settle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = LanceSink.apply

    def slow_apply(self: LanceSink, *args: Any, **kwargs: Any) -> Any:
        time.sleep(3.0)  # past the 1.5 s lease, and past the 0.5 s limit by far
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LanceSink, "apply", slow_apply)
    runs: list[int] = []

    def handler(job: Job, ctx: Context) -> str:
        runs.append(ctx.token)
        ctx.upsert("t", {"id": "a", "x": 1})
        return "ok"

    spool = make_spool(tmp_path / "s", lease_seconds=1.5)
    spool.enqueue("k", {}, job_id="j", max_attempts=3)
    report = Worker(spool, {"k": handler}, policies={"k": Policy(timeout=0.5)},
                    projection=str(tmp_path / "proj"), concurrency=1,
                    maintenance=False).run_until_idle()
    assert len(runs) == 1
    assert report.completed == 1 and report.lease_lost == 0
    job = spool.get("j")
    assert job.state is JobState.COMPLETED and job.result == "ok"
