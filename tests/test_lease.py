"""Leases: heartbeat extends, expiry ends, release gives back without counting the attempt;
complete and fail move the job where DESIGN §3 says, with backoff and dead-lettering."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import InvalidTransition, LeaseLost
from tests.helpers_spool import assert_disk_consistent, read_raw
from tests.spools import make_spool


def test_heartbeat_extends_the_lease_and_keeps_the_token(spool: Spool, spool_root: Path,
                                                         clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    clock.advance(20.0)
    renewed = spool.heartbeat(lease)
    assert renewed.token == lease.token
    assert renewed.job_id == "j"
    assert renewed.expires_at == pytest.approx(clock.now + 30.0)
    assert renewed.expires_at > lease.expires_at
    assert read_raw(spool_root, "leased", "j")["lease"]["expires_at"] == pytest.approx(
        renewed.expires_at)
    clock.advance(20.0)  # past the first expiry, inside the renewed one
    assert spool.claim() == []
    assert spool.complete(renewed).state is JobState.COMPLETED


def test_the_old_lease_object_still_works_after_a_heartbeat_until_the_new_expiry(
    spool: Spool, clock: Any
) -> None:
    # The token is the identity of the hold; the lease object is only a handle.
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    clock.advance(20.0)
    spool.heartbeat(lease)
    clock.advance(20.0)
    assert spool.complete(lease).state is JobState.COMPLETED


def test_heartbeat_keeps_the_per_claim_lease_length(spool: Spool, clock: Any) -> None:
    spool.enqueue("note")
    (lease,) = spool.claim(lease_seconds=5.0)
    clock.advance(4.0)
    renewed = spool.heartbeat(lease)
    # Either the claim's own length or the spool default; never shorter than asked at claim.
    assert renewed.expires_at >= clock.now + 5.0 - 1e-6


def test_heartbeat_after_expiry_raises_lease_lost(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    clock.advance(30.0)
    with pytest.raises(LeaseLost) as info:
        spool.heartbeat(lease)
    assert info.value.job_id == "j"
    assert info.value.token == lease.token


def test_complete_records_the_result_and_clears_the_lease(spool: Spool, spool_root: Path,
                                                          clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    clock.advance(3.0)
    job = spool.complete(lease, {"rows": 3})
    assert job.state is JobState.COMPLETED
    assert job.result == {"rows": 3}
    assert job.attempts == 1
    assert job.updated_at == clock.now
    assert assert_disk_consistent(spool_root) == {"j": "completed"}
    assert read_raw(spool_root, "completed", "j")["result"] == {"rows": 3}
    assert spool.get("j") == job


def test_complete_twice_raises_lease_lost_the_second_time(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    done = spool.complete(lease)
    with pytest.raises(LeaseLost):
        spool.complete(lease)
    assert spool.get("j") == done


def test_complete_many_completes_each_and_reports_lost_leases(spool: Spool,
                                                              clock: Any) -> None:
    for i in range(3):
        spool.enqueue("note", job_id=f"j{i}")
    a, b, c = spool.claim(limit=3)
    spool.cancel(b.job_id)
    out = spool.complete_many([(a, 1), (b, 2), (c, 3)])
    assert len(out) == 3
    assert getattr(out[0], "state", None) is JobState.COMPLETED and out[0].result == 1
    assert isinstance(out[1], LeaseLost)
    assert getattr(out[2], "state", None) is JobState.COMPLETED and out[2].result == 3
    assert spool.get("j1").state is JobState.CANCELED


def test_fail_retryable_moves_to_retryable_with_backoff(spool: Spool, spool_root: Path,
                                                        clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    job = spool.fail(lease, "db down")
    assert job.state is JobState.RETRYABLE
    assert job.last_error is not None and "db down" in job.last_error
    assert job.lease is None
    assert job.attempts == 1
    assert job.run_at > clock.now
    assert assert_disk_consistent(spool_root) == {"j": "retryable"}


def test_fail_accepts_an_exception_as_the_error(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    job = spool.fail(lease, ValueError("bad value 42"))
    assert job.last_error is not None and "bad value 42" in job.last_error


def test_fail_with_an_explicit_delay_uses_it(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    job = spool.fail(lease, "later", delay=42.0)
    assert job.state is JobState.RETRYABLE
    assert job.run_at == pytest.approx(clock.now + 42.0)


def _backoffs(tmp_path: Path, clock: Any, *, base: float, cap: float, n: int,
              tag: str) -> list[float]:
    """Delay chosen by the spool after each of n consecutive retryable failures of one job."""
    s = make_spool(tmp_path / tag, clock=clock, retry_base_seconds=base,
              retry_max_seconds=cap, max_attempts=n + 1, lease_seconds=30.0)
    try:
        s.enqueue("note", job_id="j")
        out = []
        for _ in range(n):
            clock.advance(10 * cap + 100)
            (lease,) = s.claim()
            job = s.fail(lease, "again")
            assert job.state is JobState.RETRYABLE
            out.append(job.run_at - clock.now)
        return out
    finally:
        s.close()


def test_backoff_grows_exponentially_from_base_with_bounded_jitter(tmp_path: Path,
                                                                   clock: Any) -> None:
    # DESIGN §3: exponential from retry_base_seconds, capped, with jitter. The bound
    # asserted is loose (any jitter within [0.5x, 1.5x] of base * 2**(n-1)) but it
    # fails for a constant delay, a linear one, a missing base, or no cap.
    for trial in range(8):
        delays = _backoffs(tmp_path, clock, base=2.0, cap=10_000.0, n=7, tag=f"t{trial}")
        for n, d in enumerate(delays, start=1):
            nominal = 2.0 * 2 ** (n - 1)
            assert 0.5 * nominal <= d <= 1.5 * nominal, (n, d, delays)
        assert delays[-1] > 8 * delays[0]


def test_backoff_is_capped_at_retry_max_seconds(tmp_path: Path, clock: Any) -> None:
    delays = _backoffs(tmp_path, clock, base=1.0, cap=20.0, n=10, tag="cap")
    assert all(0 < d <= 20.0 + 1e-6 for d in delays), delays
    assert max(delays[6:]) >= 10.0, delays  # the cap is reached, not undershot forever


def test_backoff_has_jitter(tmp_path: Path, clock: Any) -> None:
    # Two jobs failing at the same attempt should not all retry in lockstep.
    firsts = {round(_backoffs(tmp_path, clock, base=100.0, cap=10_000.0, n=3,
                              tag=f"j{i}")[2], 6) for i in range(12)}
    assert len(firsts) > 1


def test_fail_permanent_moves_to_dead_letter(spool: Spool, spool_root: Path) -> None:
    spool.enqueue("note", job_id="j", max_attempts=5)
    (lease,) = spool.claim()
    job = spool.fail(lease, "bad input", retryable=False)
    assert job.state is JobState.DEAD_LETTER
    assert job.last_error is not None and "bad input" in job.last_error
    assert job.attempts == 1
    assert assert_disk_consistent(spool_root) == {"j": "dead_letter"}


def test_fail_when_attempts_are_exhausted_moves_to_dead_letter(spool: Spool,
                                                               clock: Any) -> None:
    spool.enqueue("note", job_id="j", max_attempts=3)
    for attempt in (1, 2, 3):
        clock.advance(10_000)
        (lease,) = spool.claim()
        assert lease.job.attempts == attempt
        job = spool.fail(lease, f"try {attempt}")
        expected = JobState.DEAD_LETTER if attempt == 3 else JobState.RETRYABLE
        assert job.state is expected
    assert job.last_error is not None and "try 3" in job.last_error
    clock.advance(10_000)
    assert spool.claim() == []


def test_max_attempts_one_dead_letters_on_first_failure(spool: Spool) -> None:
    spool.enqueue("note", job_id="j", max_attempts=1)
    (lease,) = spool.claim()
    assert spool.fail(lease, "x").state is JobState.DEAD_LETTER


def test_release_gives_the_job_back_without_counting_the_attempt(spool: Spool,
                                                                 spool_root: Path,
                                                                 clock: Any) -> None:
    spool.enqueue("note", job_id="j", max_attempts=1)
    (lease,) = spool.claim()
    job = spool.release(lease)
    assert job.state is JobState.READY
    assert job.attempts == 0
    assert job.lease is None
    assert assert_disk_consistent(spool_root) == {"j": "ready"}
    (again,) = spool.claim()
    assert again.job.attempts == 1
    assert again.token > lease.token
    # With max_attempts=1 a counted release would dead-letter here.
    assert spool.fail(again, "x").state is JobState.DEAD_LETTER


def test_release_with_delay_defers_the_job(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    job = spool.release(lease, delay=15.0)
    assert job.state is JobState.RETRYABLE
    assert job.run_at == pytest.approx(clock.now + 15.0)
    assert job.attempts == 0
    clock.advance(14.0)
    assert spool.claim() == []
    clock.advance(1.0)
    assert [x.job_id for x in spool.claim()] == ["j"]


def test_release_refuses_a_negative_delay(spool: Spool) -> None:
    from jobspool.errors import InvalidJob

    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    with pytest.raises(InvalidJob):
        spool.release(lease, delay=-1.0)
    assert spool.get("j").state is JobState.LEASED


@pytest.mark.parametrize("start", ["ready", "retryable", "leased", "prepared"])
def test_cancel_from_each_cancelable_state(spool: Spool, spool_root: Path, clock: Any,
                                           start: str) -> None:
    if start == "prepared":
        spool.prepare("note", job_id="j")
    else:
        spool.enqueue("note", job_id="j", delay=100 if start == "retryable" else 0)
        if start == "leased":
            spool.claim()
    assert str(spool.get("j").state) == start
    job = spool.cancel("j")
    assert job.state is JobState.CANCELED
    assert job.lease is None
    assert assert_disk_consistent(spool_root) == {"j": "canceled"}
    clock.advance(1000)
    assert spool.claim() == []


@pytest.mark.parametrize("end", ["completed", "dead_letter", "canceled"])
def test_cancel_of_a_terminal_job_raises_invalid_transition(spool: Spool, spool_root: Path,
                                                            end: str) -> None:
    from tests.helpers_spool import file_bytes

    spool.enqueue("note", job_id="j")
    if end == "canceled":
        spool.cancel("j")
    else:
        (lease,) = spool.claim()
        if end == "completed":
            spool.complete(lease)
        else:
            spool.fail(lease, "x", retryable=False)
    before = file_bytes(spool_root, "j")
    with pytest.raises(InvalidTransition) as info:
        spool.cancel("j")
    assert info.value.job_id == "j"
    assert file_bytes(spool_root, "j") == before


@pytest.mark.parametrize("end", ["dead_letter", "canceled"])
def test_requeue_moves_dead_letter_and_canceled_back_to_ready(spool: Spool, spool_root: Path,
                                                              end: str) -> None:
    spool.enqueue("note", {"p": 1}, job_id="j", max_attempts=1)
    (lease,) = spool.claim()
    if end == "dead_letter":
        spool.fail(lease, "x")
    else:
        spool.cancel("j")
    job = spool.requeue("j")
    assert job.state is JobState.READY
    assert job.payload == {"p": 1}
    assert job.lease is None
    assert assert_disk_consistent(spool_root) == {"j": "ready"}
    (again,) = spool.claim()
    assert again.token > lease.token
    assert spool.complete(again).state is JobState.COMPLETED


def test_a_requeued_dead_letter_gets_a_fresh_set_of_attempts(spool: Spool,
                                                             clock: Any) -> None:
    spool.enqueue("note", job_id="j", max_attempts=2)
    for _ in range(2):
        clock.advance(10_000)
        (lease,) = spool.claim()
        spool.fail(lease, "x")
    assert spool.get("j").state is JobState.DEAD_LETTER
    spool.requeue("j")
    (lease,) = spool.claim()
    # Were attempts not reset, this one failure would dead-letter it again at once.
    assert spool.fail(lease, "y").state is JobState.RETRYABLE


@pytest.mark.parametrize("start", ["ready", "retryable", "leased", "prepared"])
def test_requeue_of_any_other_state_raises_invalid_transition(spool: Spool, spool_root: Path,
                                                              start: str) -> None:
    from tests.helpers_spool import file_bytes

    if start == "prepared":
        spool.prepare("note", job_id="j")
    else:
        spool.enqueue("note", job_id="j", delay=100 if start == "retryable" else 0)
        if start == "leased":
            spool.claim()
    before = file_bytes(spool_root, "j")
    with pytest.raises(InvalidTransition):
        spool.requeue("j")
    assert file_bytes(spool_root, "j") == before


@pytest.mark.timeout(20)
def test_wait_returns_at_once_for_a_terminal_job(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    done = spool.complete(lease, 7)
    assert spool.wait("j", timeout=5.0) == done


@pytest.mark.timeout(20)
def test_wait_returns_the_terminal_job_once_another_thread_finishes_it(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    go = threading.Event()

    def finish() -> None:
        go.wait(5)
        spool.complete(lease, "late")

    t = threading.Thread(target=finish)
    t.start()
    go.set()
    try:
        job = spool.wait("j", timeout=10.0)
    finally:
        t.join(10)
    assert job.state is JobState.COMPLETED
    assert job.result == "late"


@pytest.mark.timeout(20)
def test_wait_times_out_on_a_job_that_does_not_finish(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    with pytest.raises(TimeoutError):
        spool.wait("j", timeout=0.2)
    assert spool.get("j").state is JobState.READY


@pytest.mark.timeout(20)
def test_wait_on_an_unknown_job_raises_job_not_found(spool: Spool) -> None:
    from jobspool.errors import JobNotFound

    with pytest.raises(JobNotFound):
        spool.wait("ghost", timeout=0.2)
