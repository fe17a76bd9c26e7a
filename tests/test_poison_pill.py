"""Poison pills: every expired-lease reclaim is counted on the job (`rescues`), and a job
reclaimed more than `max_rescues` times is dead-lettered instead of crashing workers forever."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from tests.conftest import FakeClock
from tests.helpers_spool import read_raw
from tests.spools import make_spool

LEASE = 10.0


@pytest.fixture
def spool(spool_root: Path, clock: FakeClock) -> Iterator[Spool]:
    # Plenty of attempts, so only the rescue bound can dead-letter the job.
    s = make_spool(spool_root, clock=clock, lease_seconds=LEASE, max_attempts=100,
              max_rescues=3, retry_base_seconds=1.0, retry_max_seconds=1.0)
    yield s
    s.close()


def test_a_claim_that_reclaims_an_expired_lease_counts_a_rescue(
        spool: Spool, clock: FakeClock, spool_root: Path) -> None:
    job = spool.enqueue("render")
    (first,) = spool.claim()
    assert first.job.rescues == 0
    clock.advance(LEASE)  # the worker died holding it
    (second,) = spool.claim()
    assert second.job_id == job.id and second.token > first.token
    assert second.job.rescues == 1 and second.job.attempts == 2
    assert read_raw(spool_root, "leased", job.id)["rescues"] == 1  # recorded on disk


def test_a_job_reclaimed_past_the_bound_by_claims_is_dead_lettered(
        spool: Spool, clock: FakeClock, spool_root: Path) -> None:
    job = spool.enqueue("render")
    spool.claim()
    for rescues in (1, 2, 3):  # up to the bound: reclaimed and handed out again
        clock.advance(LEASE)
        (lease,) = spool.claim()
        assert lease.job.rescues == rescues
    clock.advance(LEASE)
    assert spool.claim() == []  # the fourth reclaim is one too many
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.rescues == 4 and dead.attempts == 4
    assert dead.lease is None
    # It names the limit that stopped it (a limits probe: it did not).
    assert dead.last_error == "poison pill: lease expired 4 times (max_rescues=3)"
    assert read_raw(spool_root, "dead_letter", job.id)["rescues"] == 4


@pytest.mark.parametrize("reclaimer", ["claim", "recover"])
def test_a_poison_pill_dead_letter_is_logged_as_a_warning_naming_the_job(
        spool: Spool, clock: FakeClock, caplog: pytest.LogCaptureFixture, reclaimer: str) -> None:
    job = spool.enqueue("render")
    spool.claim()
    for _ in range(3):
        clock.advance(LEASE)
        spool.claim()
    clock.advance(LEASE)
    with caplog.at_level(logging.WARNING, logger="jobspool"):
        if reclaimer == "claim":
            spool.claim()
        else:
            spool.recover()
    assert spool.get(job.id).state is JobState.DEAD_LETTER
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and
              (job.id in r.getMessage() or getattr(r, "job_id", None) == job.id)]
    assert warned, "a dead-letter must be a warning, never silent (issue 7)"


def test_a_job_reclaimed_past_the_bound_by_recovery_is_dead_lettered(
        spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("render")
    for rescues in (1, 2, 3):
        spool.claim()
        clock.advance(LEASE)
        report = spool.recover()
        assert report.leases_reclaimed == (job.id,)
        back = spool.get(job.id)
        assert back.state is JobState.RETRYABLE and back.rescues == rescues
        clock.advance(1.0)  # past the (capped) backoff
    spool.claim()
    clock.advance(LEASE)
    report = spool.recover()
    assert report.dead_lettered == (job.id,)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER and dead.rescues == 4
    assert "poison pill" in (dead.last_error or "")


def test_claims_and_recovery_count_rescues_together(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("render")
    spool.claim()
    clock.advance(LEASE)
    spool.claim()  # rescue 1, by a claim
    clock.advance(LEASE)
    spool.recover()  # rescue 2, by recovery
    clock.advance(1.0)
    spool.claim()
    clock.advance(LEASE)
    (lease,) = spool.claim()  # rescue 3, by a claim
    assert lease.job.rescues == 3
    clock.advance(LEASE)
    spool.recover()  # rescue 4: past the bound
    assert spool.get(job.id).state is JobState.DEAD_LETTER


def test_settled_attempts_are_not_rescues(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("render")
    for _ in range(5):
        (lease,) = spool.claim()
        for _ in range(3):  # a live worker heartbeats through a long run
            clock.advance(LEASE / 2)
            lease = spool.heartbeat(lease)
        spool.fail(lease, "transient")
        clock.advance(1.0)
    (lease,) = spool.claim()
    spool.release(lease)
    (lease,) = spool.claim()
    assert lease.job.rescues == 0 and lease.job.attempts == 6  # a release is not an attempt
    spool.complete(lease)
    assert spool.get(job.id).state is JobState.COMPLETED


def test_requeue_gives_a_poison_pill_a_fresh_rescue_budget(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("render")
    spool.claim()
    for _ in range(4):
        clock.advance(LEASE)
        spool.claim()
    assert spool.get(job.id).state is JobState.DEAD_LETTER
    requeued = spool.requeue(job.id)
    assert requeued.state is JobState.READY and requeued.rescues == 0


def test_the_default_bound_is_ten_rescues(spool_root: Path, clock: FakeClock) -> None:
    with make_spool(spool_root, clock=clock, lease_seconds=LEASE,
               max_attempts=1000) as s:
        assert s.max_rescues == 10
        job = s.enqueue("render")
        s.claim()
        for _ in range(10):
            clock.advance(LEASE)
            assert len(s.claim()) == 1
        clock.advance(LEASE)
        assert s.claim() == []
        assert s.get(job.id).state is JobState.DEAD_LETTER
        assert s.get(job.id).rescues == 11


def test_no_bound_leaves_only_max_attempts(spool_root: Path, clock: FakeClock) -> None:
    with make_spool(spool_root, clock=clock, lease_seconds=LEASE, max_attempts=15,
               max_rescues=None) as s:
        job = s.enqueue("render")
        s.claim()
        for _ in range(14):
            clock.advance(LEASE)
            assert len(s.claim()) == 1
        clock.advance(LEASE)
        assert s.claim() == []
        dead = s.get(job.id)
        assert dead.state is JobState.DEAD_LETTER and dead.rescues == 15
        assert "attempts exhausted" in (dead.last_error or "")


def test_both_stores_name_max_rescues_in_the_poison_pill(make_any_spool: Any) -> None:
    from tests.store_params import sleep_past

    spool = make_any_spool(lease_seconds=0.2, max_rescues=1)
    job = spool.enqueue("render", max_attempts=10)
    for _ in range(3):
        leases = spool.claim()
        if leases:
            sleep_past(leases[0].expires_at)
    spool.claim()  # the expiry past the bound: dead-lettered (by the claim or its sweep)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.last_error == "poison pill: lease expired 2 times (max_rescues=1)"
