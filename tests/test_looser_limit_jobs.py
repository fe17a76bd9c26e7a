"""A job admitted under a looser `max_job_bytes` (an older setting, a spool migrated into
a store created with a smaller one) must still move through its life on both stores.

On PostgreSQL its failure could not be recorded and its dead letter for "result too
large" could not be written: the worker logged "dead-lettered", the job stayed leased,
and it ran again at every lease expiry until its attempts ran out, five runs in all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobspool import Spool, Worker
from jobspool.queue.states import JobState

BIG = {"blob": "x" * 30_000}


def _reopened_with_a_smaller_limit(make_any_spool: Callable[..., Spool]) -> tuple[Spool, str,
                                                                                   str, str]:
    wide = make_any_spool(lease_seconds=30.0, max_job_bytes=65_536)
    ok = wide.enqueue("ok", BIG).id
    bad = wide.enqueue("bad", BIG).id
    huge = wide.enqueue("huge", BIG).id
    # the options given at open override the stored ones for this process (both stores)
    return make_any_spool(lease_seconds=30.0, max_job_bytes=8192), ok, bad, huge


def test_a_job_over_the_limit_completes_fails_and_dead_letters_once(
        make_any_spool: Callable[..., Spool]) -> None:
    spool, ok, bad, huge = _reopened_with_a_smaller_limit(make_any_spool)
    assert spool.max_job_bytes == 8192
    runs: dict[str, int] = {}

    def count(job: Any) -> None:
        runs[job.kind] = runs.get(job.kind, 0) + 1

    def ok_h(job: Any, ctx: Any) -> dict[str, bool]:
        count(job)
        return {"done": True}  # a small result: fits the room a new job keeps

    def bad_h(job: Any, ctx: Any) -> None:
        count(job)
        raise ValueError("boom " * 2000)  # an error far over what is left: cut to fit

    def huge_h(job: Any, ctx: Any) -> str:
        count(job)
        return "r" * 20_000  # a result that fits no room: refused, dead-lettered

    handlers = {"ok": ok_h, "bad": bad_h, "huge": huge_h}
    Worker(spool, handlers, maintenance=False).run_until_idle(wait_for_retries=0)
    assert runs == {"ok": 1, "bad": 1, "huge": 1}
    done, failed, dead = spool.get(ok), spool.get(bad), spool.get(huge)
    assert done.state is JobState.COMPLETED and done.result == {"done": True}
    assert failed.state in (JobState.RETRYABLE, JobState.DEAD_LETTER) and failed.attempts == 1
    assert failed.last_error and failed.last_error.startswith("ValueError: boom")
    assert dead.state is JobState.DEAD_LETTER and dead.attempts == 1
    assert "max_job_bytes" in (dead.last_error or "")
    assert not list(spool.jobs(JobState.LEASED))
