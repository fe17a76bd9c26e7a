"""What a settle returns is the job as stored, on both stores.

The PostgreSQL settle reads back only what the database decides (revision,
clock, run_at) and builds the rest from what it sent; this checks that the
job it hands back is exactly what a later `get` reads, for completes
(nested results), failures with a delay, errors
holding a NUL, releases, and a job whose lease was beaten first.
"""

from __future__ import annotations

from collections.abc import Callable

from jobspool import JobState, Spool


def test_complete_many_returns_the_stored_jobs(make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue_many("k", [{"n": 1}, {"n": 2}, {"n": 3}])
    leases = spool.claim(kinds="k", limit=3)
    # A beat first, and the claim's lease (its snapshot) used after it: the stored
    # revision moved past what the settling caller holds.
    spool.heartbeat(leases[0])
    results = [(leases[0], [1, 2]), (leases[1], {"a": [1.5, None]}), (leases[2], None)]
    out = spool.complete_many(results)
    assert [j.state for j in out] == [JobState.COMPLETED] * 3  # type: ignore[union-attr]
    for job in out:
        assert job == spool.get(job.id)  # type: ignore[union-attr]
    assert out[0].result == [1, 2]  # type: ignore[union-attr]


def test_fail_many_and_release_return_the_stored_jobs(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue_many("k", ["a", "b", "c"], max_attempts=3)
    a, b, c = spool.claim(kinds="k", limit=3)
    out = spool.fail_many([(a, "bad\x00byte", True, 60.0), (b, "for good", False, None)])
    for job in out:
        assert job == spool.get(job.id)  # type: ignore[union-attr]
    assert [j.state for j in out] == [JobState.RETRYABLE, JobState.DEAD_LETTER]  # type: ignore[union-attr]
    assert out[0].run_at > out[0].updated_at + 50  # type: ignore[union-attr]
    released = spool.release(c, delay=5.0)
    assert released == spool.get(c.job_id)
    assert (released.state, released.attempts) == (JobState.RETRYABLE, 0)
