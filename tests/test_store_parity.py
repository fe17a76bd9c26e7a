"""The same answers from both stores, where a parity pass (one script, file spool and
PostgreSQL side by side) found them apart: each failed on PostgreSQL before its fix."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from jobspool import Spool
from jobspool.errors import LeaseLost
from tests.store_params import sleep_past


def test_claim_takes_kinds_from_a_generator(any_spool: Spool) -> None:
    """PostgreSQL checked the kinds by looping over them, spending a generator: the claim
    then saw no kind and claimed nothing, for ever."""
    any_spool.enqueue("c", job_id="c1")
    any_spool.enqueue("k", job_id="k1")
    assert [x.job_id for x in any_spool.claim(kinds=(k for k in ["c"]))] == ["c1"]
    assert [x.job_id for x in any_spool.claim(kinds=map(str, ["k"]))] == ["k1"]


def test_completing_a_lost_lease_with_a_non_json_result_is_lease_lost(
        make_any_spool: Callable[..., Spool]) -> None:
    """PostgreSQL checked the result before the lease: InvalidJob, where the file spool (and
    DESIGN §4) says LeaseLost for a lease that is not current."""
    spool = make_any_spool(lease_seconds=0.2)
    spool.enqueue("k", job_id="j")
    (lease,) = spool.claim()
    sleep_past(lease.expires_at)
    with pytest.raises(LeaseLost):
        spool.complete(lease, {1, 2})
    (current,) = spool.claim(kinds="k", lease_seconds=30.0)  # taken over: current again
    assert current.job_id == "j" and current.token > lease.token
    from jobspool.errors import InvalidJob

    with pytest.raises(InvalidJob, match="not JSON"):  # a current lease: the result's fault
        spool.complete(current, {1, 2})


def test_next_due_at_is_when_a_job_not_yet_due_becomes_claimable(any_spool: Spool) -> None:
    """PostgreSQL counted jobs due already (answering 'now', or a time in the past), so an
    idle worker that could not claim them was told to claim again at once."""
    any_spool.enqueue("k", job_id="due")
    assert any_spool.next_due_at() is None
    any_spool.enqueue("k", job_id="later", delay=100.0)
    due = any_spool.next_due_at()
    assert due is not None and 90.0 < due - time.time() < 110.0


def test_health_figures_have_the_same_keys(any_spool: Spool) -> None:
    """PostgreSQL's health figures lacked most of the file spool's keys (KeyError for a
    consumer of both); the README says those are zero there."""
    keys = {"counts", "due", "oldest_due_age", "fence", "quarantined", "expired_leases",
            "stale_prepared", "projection", "unreadable_files", "no_read_access",
            "ready_not_claimed", "stale_workers", "free_bytes", "free_percent",
            "job_files_read", "job_files"}
    assert keys <= set(any_spool.health().figures)


def test_recover_says_why_an_expired_lease_waits_again(any_spool: Spool) -> None:
    """A job reclaimed from a worker that died is retryable with a reason, on both stores
    (the file spool recorded none)."""
    any_spool.enqueue("k", {}, job_id="r1")
    [_lease] = any_spool.claim(kinds="k", lease_seconds=0.05)
    time.sleep(0.15)
    any_spool.recover()
    job = any_spool.get("r1")
    assert job.state.value == "retryable"
    assert job.last_error == "lease expired (worker died or stalled)"


def test_a_reclaimed_job_says_why_this_run_ended_not_an_earlier_one(any_spool: Spool
                                                                    ) -> None:
    """Found by a README probe: a job failed once, dead-lettered, requeued and then left by
    a dead worker still said "old: bad input" (both stores kept the earlier error)."""
    any_spool.enqueue("k", {}, job_id="r2", max_attempts=1)
    [lease] = any_spool.claim(kinds="k")
    any_spool.fail(lease, "old: bad input")
    any_spool.requeue("r2")
    [_lease] = any_spool.claim(kinds="k", lease_seconds=0.05)
    time.sleep(0.15)
    any_spool.recover()
    job = any_spool.get("r2")
    assert job.state.value == "dead_letter"  # its one attempt is spent
    assert job.last_error == ("attempts exhausted; last: lease expired (worker died or "
                              "stalled); before it: old: bad input")
    any_spool.enqueue("k", {}, job_id="r3", max_attempts=3)
    [lease] = any_spool.claim(kinds="k")
    any_spool.fail(lease, "flaky", delay=0)
    [_lease] = any_spool.claim(kinds="k", lease_seconds=0.05)
    time.sleep(0.15)
    any_spool.recover()
    job = any_spool.get("r3")
    assert (job.state.value, job.rescues) == ("retryable", 1)
    assert job.last_error == "lease expired (worker died or stalled)"


@pytest.mark.parametrize("bad", [-1, True, 2.5, "10"])
def test_health_refuses_a_bad_max_files_read_on_either_store(any_spool: Spool, bad: object
                                                              ) -> None:
    """PostgreSQL read 0 rows for -1 (bad rows unchecked) and 1 for True, where the file
    spool refused both."""
    with pytest.raises(ValueError, match="max_files_read"):
        any_spool.health(max_files_read=bad)


def test_a_claim_takes_the_due_job_behind_an_expired_lease_out_of_attempts(
        make_any_spool: Callable[..., Spool]) -> None:
    """Found by a differential probe: on PostgreSQL, `claim(limit=1)` came back empty when
    an expired lease out of attempts came first in claim order (it held the one place of
    the claim's scan, then the sweep dead-lettered it); `run_until_idle` stopped there,
    calling the queue idle with a due job left. The file spool took the next job."""
    spool = make_any_spool(lease_seconds=0.3)
    spool.enqueue("k", job_id="a", max_attempts=1)
    spool.enqueue("k", job_id="b", max_attempts=3)
    leases = spool.claim(limit=2)
    assert [x.job_id for x in leases] == ["a", "b"]
    sleep_past(max(x.expires_at for x in leases))
    got = spool.claim(limit=1, lease_seconds=30.0)
    assert [x.job_id for x in got] == ["b"]
    assert spool.get("a").state.value == "dead_letter"
    assert got[0].job.attempts == 2


@pytest.mark.parametrize("option", ["max_rescues", "keep_dead", "keep_terminal_seconds"])
def test_none_for_a_nullable_option_is_taken_not_dropped(
        make_any_spool: Callable[..., Spool], option: str) -> None:
    """Found by a differential probe: PostgreSQL dropped `max_rescues=None` (no poison-pill
    cap) and kept the default 10, so long jobs were dead-lettered on that store only."""
    first = make_any_spool(**{option: 3})
    assert getattr(first.settings, option) == 3
    again = make_any_spool(**{option: None})  # given: overrides what was stored
    assert getattr(again.settings, option) is None
    if option == "max_rescues":
        assert again.max_rescues is None


def test_an_expired_lease_behind_leases_out_of_attempts_is_taken_in_claim_order(
        make_any_spool: Callable[..., Spool]) -> None:
    """Found by a regression probe: on PostgreSQL, expired leases out of attempts filled the
    claim's scan of expired leases, so a due job of lower priority was taken over an
    expired lease of higher priority behind them (the file spool took the lease)."""
    spool = make_any_spool(lease_seconds=0.3)
    spool.enqueue("k", job_id="ex1", priority=-20, max_attempts=1)
    spool.enqueue("k", job_id="ex2", priority=-19, max_attempts=1)
    spool.enqueue("k", job_id="ok1", priority=-10, max_attempts=3)
    leases = spool.claim(limit=3)
    assert [x.job_id for x in leases] == ["ex1", "ex2", "ok1"]
    sleep_past(max(x.expires_at for x in leases))
    spool.enqueue("k", job_id="d1")
    spool.enqueue("k", job_id="d2")
    got = spool.claim(limit=2, lease_seconds=30.0)
    assert [x.job_id for x in got] == ["ok1", "d1"]
    assert [spool.get(i).state.value for i in ("ex1", "ex2")] == ["dead_letter"] * 2
