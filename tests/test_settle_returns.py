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


def test_completions_keep_nul_odd_numbers_and_the_earlier_error(
        make_any_spool: Callable[..., Spool]) -> None:
    """A completion keeps what it does not change (the last error of an earlier attempt,
    attempts, run_at) and stores the result exactly: NUL inside strings (PostgreSQL's
    JSON functions refuse it, so that batch takes the array form), numbers the server
    prints its own way, unicode and nesting."""
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue_many("k", ["first", "second", "third"], max_attempts=3)
    first = spool.claim(kinds="k", limit=1)[0]
    spool.fail(first, "transient", retryable=True, delay=0.0)
    leases = spool.claim(kinds="k", limit=3)
    by_payload = {lease.job.payload: lease for lease in leases}
    assert set(by_payload) == {"first", "second", "third"}
    nul = {"s": "a\x00b", "n": [1e300, -0.0, 2**53]}
    plain = {"é": "ü", "deep": [[[{"x": None}]]], "big": 1e300}
    out = spool.complete_many([(by_payload["first"], plain), (by_payload["second"], nul),
                               (by_payload["third"], "ok")])
    for job in out:
        assert job == spool.get(job.id)  # type: ignore[union-attr]
    done = {j.payload: j for j in out}  # type: ignore[union-attr]
    assert done["first"].result == plain and done["second"].result == nul
    assert done["first"].last_error == "transient" and done["first"].attempts == 2
    assert done["third"].last_error is None and done["third"].attempts == 1
    # Without the NUL the batch goes the plain-completion way: same stored jobs.
    spool.enqueue_many("k", ["x", "y"])
    x, y = spool.claim(kinds="k", limit=2)
    out = spool.complete_many([(x, plain), (y, None)])
    assert [j == spool.get(j.id) for j in out] == [True, True]  # type: ignore[union-attr]
    assert spool.get(y.job_id).result is None


def test_a_completion_batch_refuses_what_it_must_and_writes_the_rest(
        make_any_spool: Callable[..., Spool]) -> None:
    """In one batch of completions: the same lease twice (the second refused), a lease
    taken over by another claim, a result too large (that job dead-lettered); the others
    complete."""
    from jobspool.errors import JobTooLarge, LeaseLost

    spool = make_any_spool(lease_seconds=30.0, max_job_bytes=4096)
    spool.enqueue_many("k", ["a", "b", "c"])
    a, b, c = spool.claim(kinds="k", limit=3)
    spool.release(b)
    b2 = spool.claim(kinds="k", limit=1)[0]
    assert b2.job_id == b.job_id and b2.token > b.token
    out = spool.complete_many([(a, 1), (a, 2), (b, "late"), (c, "x" * 8000)])
    assert out[0] == spool.get(a.job_id) and out[0].result == 1  # type: ignore[union-attr]
    assert isinstance(out[1], LeaseLost) and isinstance(out[2], LeaseLost)
    assert isinstance(out[3], JobTooLarge) and "dead-lettered" in str(out[3])
    assert spool.get(b.job_id).state is JobState.LEASED  # still the new holder's
    assert spool.get(c.job_id).state is JobState.DEAD_LETTER  # that job alone (DESIGN §9)
    assert spool.complete(b2, "mine").result == "mine"


def test_a_job_failed_under_its_kinds_policy_shows_the_limit_applied(
        make_any_spool: Callable[..., Spool]) -> None:
    """A kind's `Policy(max_attempts=2)` dead-lettered the job after 2 attempts while the job
    still said `max_attempts: 5` (`list`: attempts=2/5): the limit applied is now recorded,
    on both stores, and what the settle returned is what `get` reads."""
    from jobspool import Policy, Worker

    def boom(job: object, ctx: object) -> None:
        raise RuntimeError("boom")

    spool = make_any_spool(lease_seconds=30.0, retry_base_seconds=0.01,
                           retry_max_seconds=0.01)
    job = spool.enqueue("boom", {})
    assert job.max_attempts == 5
    worker = Worker(spool, handlers={"boom": boom}, policies={"boom": Policy(max_attempts=2)})
    worker.run_until_idle(wait_for_retries=5.0)
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER
    assert (done.attempts, done.max_attempts) == (2, 2)
