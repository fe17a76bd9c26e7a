"""A kind's backoff of 0 is its own, as the spool's is.

`Spool(retry_base_seconds=0)` retries at once, while `Policy(retry_base_seconds=0)` was
refused ("must be a positive finite number"): a kind could not have what the spool's
default could. Where a policy's fields were read with `or`, a 0 also fell back to the
spool's backoff; and a worker pool's dead-child failures raised the cap to a policy's
base where a Worker caps the base (DESIGN §3): one kind, two backoffs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobspool import Policy, Spool, Worker
from jobspool.errors import PolicyError
from jobspool.queue.config import kind_backoff
from jobspool.queue.machine import RetryPolicy
from jobspool.queue.states import JobState


def test_a_policy_may_retry_at_once(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", retry_base_seconds=60.0, retry_max_seconds=600.0) as spool:
        job = spool.enqueue("flaky", {}, max_attempts=3)
        calls = []

        def flaky(j: object, ctx: object) -> None:
            calls.append(time.monotonic())
            if len(calls) < 3:
                raise RuntimeError("not yet")

        worker = Worker(spool, handlers={"flaky": flaky},
                        policies={"flaky": Policy(retry_base_seconds=0, retry_max_seconds=0)})
        # Without waiting: every retry is due at once, none 60 s away.
        report = worker.run_until_idle(wait_for_retries=5.0)
        assert report.completed == 1 and len(calls) == 3
        done = spool.get(job.id)
        assert done.state is JobState.COMPLETED and done.attempts == 3


@pytest.mark.parametrize("fields, spool, expected", [
    ({"retry_base_seconds": 0.0}, (5.0, 300.0), RetryPolicy(0.0, 300.0)),
    ({"retry_max_seconds": 0.0}, (5.0, 300.0), RetryPolicy(0.0, 0.0)),
    ({"retry_base_seconds": 500.0}, (5.0, 300.0), RetryPolicy(300.0, 300.0)),
    ({"retry_base_seconds": 2.0, "retry_max_seconds": 9.0}, (5.0, 300.0), RetryPolicy(2.0, 9.0)),
    ({}, (5.0, 300.0), None),
])
def test_one_backoff_per_policy_for_the_worker_and_the_pool(
        fields: dict[str, float], spool: tuple[float, float],
        expected: RetryPolicy | None) -> None:
    assert kind_backoff(Policy(**fields), *spool) == expected


@pytest.mark.parametrize("fields", [{"retry_base_seconds": -1.0}, {"retry_max_seconds": -0.5},
                                    {"timeout": 0}])
def test_negative_backoffs_and_a_zero_timeout_stay_refused(fields: dict[str, float]) -> None:
    with pytest.raises(PolicyError, match=next(iter(fields))):
        Policy(**fields)
