"""Claim: which jobs, in which order, from which states; kinds, limit, attempts, owner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Lease, Spool
from jobspool.errors import LeaseLost
from tests.helpers_spool import assert_disk_consistent, read_raw
from tests.spools import make_spool


def test_claim_on_an_empty_spool_returns_an_empty_list(spool: Spool) -> None:
    assert spool.claim() == []
    assert spool.claim(limit=10) == []


def test_claim_moves_the_job_to_leased_and_counts_the_attempt(spool: Spool, spool_root: Path,
                                                              clock: Any) -> None:
    spool.enqueue("note", {"p": 1}, job_id="j")
    (lease,) = spool.claim(owner="worker-1")
    assert isinstance(lease, Lease)
    assert lease.job_id == "j"
    assert lease.owner == "worker-1"
    assert lease.expires_at == pytest.approx(clock.now + 30.0)
    assert lease.token >= 1
    assert lease.job.state is JobState.LEASED
    assert lease.job.attempts == 1
    assert lease.job.payload == {"p": 1}
    assert lease.job.lease is not None
    assert lease.job.lease.token == lease.token
    assert assert_disk_consistent(spool_root) == {"j": "leased"}
    raw = read_raw(spool_root, "leased", "j")
    assert raw["lease"]["token"] == lease.token
    assert raw["attempts"] == 1
    assert spool.get("j") == lease.job


def test_a_leased_job_is_not_claimed_again_while_its_lease_runs(spool: Spool,
                                                                clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    spool.claim()
    assert spool.claim() == []
    clock.advance(29.9)
    assert spool.claim() == []


def test_claim_has_a_default_owner(spool: Spool) -> None:
    spool.enqueue("note")
    (lease,) = spool.claim()
    assert isinstance(lease.owner, str) and lease.owner


def test_claim_uses_the_per_call_lease_seconds(spool: Spool, clock: Any) -> None:
    spool.enqueue("note")
    (lease,) = spool.claim(lease_seconds=5.0)
    assert lease.expires_at == pytest.approx(clock.now + 5.0)
    clock.advance(5.0)
    (again,) = spool.claim()
    assert again.job_id == lease.job_id


def test_claim_orders_by_priority_then_run_at_then_id(spool: Spool, clock: Any) -> None:
    # Same run_at, different ids: id order.
    spool.enqueue("note", job_id="m", priority=0)
    spool.enqueue("note", job_id="c", priority=0)
    spool.enqueue("note", job_id="x", priority=0)
    # Lower priority value first, whatever its id.
    spool.enqueue("note", job_id="z", priority=-5)
    spool.enqueue("note", job_id="y", priority=-1)
    spool.enqueue("note", job_id="a", priority=3)
    # Earlier run_at first within a priority, whatever its id: enqueued as delayed
    # jobs (retryable) that are due by the time of the claim.
    spool.enqueue("note", job_id="b2", priority=1, delay=5.0)
    spool.enqueue("note", job_id="b1", priority=1, delay=8.0)
    spool.enqueue("note", job_id="b3", priority=1, delay=2.0)
    clock.advance(10.0)
    order = [x.job_id for x in spool.claim(limit=100)]
    assert order == ["z", "y", "c", "m", "x", "b3", "b2", "b1", "a"]


def test_claim_one_at_a_time_follows_the_same_order(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="q", priority=2)
    spool.enqueue("note", job_id="p", priority=2)
    spool.enqueue("note", job_id="r", priority=1)
    got = []
    while True:
        leases = spool.claim()
        if not leases:
            break
        got.append(leases[0].job_id)
    assert got == ["r", "p", "q"]


def test_fifo_for_generated_ids(spool: Spool) -> None:
    ids = [spool.enqueue("note", i).id for i in range(30)]
    assert [x.job_id for x in spool.claim(limit=30)] == ids


def test_limit_bounds_the_batch(spool: Spool) -> None:
    for i in range(10):
        spool.enqueue("note", job_id=f"j{i}")
    first = spool.claim(limit=4)
    assert [x.job_id for x in first] == ["j0", "j1", "j2", "j3"]
    second = spool.claim(limit=4)
    assert [x.job_id for x in second] == ["j4", "j5", "j6", "j7"]
    assert len(spool.claim(limit=100)) == 2
    tokens = [x.token for x in first + second]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_kinds_filter_claims_only_those_kinds(spool: Spool) -> None:
    spool.enqueue("email", job_id="e1")
    spool.enqueue("sms", job_id="s1")
    spool.enqueue("push", job_id="p1")
    spool.enqueue("email", job_id="e2")
    got = spool.claim(kinds=["email", "push"], limit=10)
    assert sorted(x.job_id for x in got) == ["e1", "e2", "p1"]
    assert spool.claim(kinds=["email"], limit=10) == []
    assert spool.claim(kinds=["nothing"], limit=10) == []
    assert [x.job_id for x in spool.claim(limit=10)] == ["s1"]


def test_kinds_filter_accepts_a_set_or_tuple(spool: Spool) -> None:
    spool.enqueue("email", job_id="e1")
    spool.enqueue("sms", job_id="s1")
    assert [x.job_id for x in spool.claim(kinds=("sms",))] == ["s1"]
    assert [x.job_id for x in spool.claim(kinds={"email"})] == ["e1"]


def test_claim_takes_a_due_retryable_job(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    failed = spool.fail(lease, "transient")
    assert failed.state is JobState.RETRYABLE
    assert failed.run_at > clock.now
    assert spool.claim() == []
    clock.now = failed.run_at
    (again,) = spool.claim()
    assert again.job_id == "j"
    assert again.job.attempts == 2
    assert again.token > lease.token


def test_claim_takes_a_leased_job_whose_lease_expired(spool: Spool, spool_root: Path,
                                                      clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    (first,) = spool.claim(owner="crashed")
    clock.advance(30.0)
    (second,) = spool.claim(owner="rescuer")
    assert second.job_id == "j"
    assert second.token > first.token
    assert second.owner == "rescuer"
    assert second.job.attempts == 2
    assert second.expires_at == pytest.approx(clock.now + 30.0)
    assert assert_disk_consistent(spool_root) == {"j": "leased"}
    with pytest.raises(LeaseLost):
        spool.complete(first)
    assert spool.complete(second).state is JobState.COMPLETED


def test_an_expired_lease_with_attempts_exhausted_is_never_run_again(spool: Spool,
                                                                     spool_root: Path,
                                                                     clock: Any) -> None:
    spool.enqueue("note", job_id="once", max_attempts=1)
    spool.claim()
    clock.advance(31.0)
    assert spool.claim() == []
    job = spool.get("once")
    assert job.state in (JobState.DEAD_LETTER, JobState.LEASED)
    assert job.attempts == 1


def test_claim_never_hands_out_an_already_expired_lease(spool: Spool, clock: Any) -> None:
    spool.enqueue("note")
    (lease,) = spool.claim(lease_seconds=0.001)
    assert lease.expires_at > clock.now
    assert not lease.expired(clock.now)


def test_claim_skips_jobs_that_are_not_due_and_terminal_states(spool: Spool,
                                                               clock: Any) -> None:
    spool.enqueue("note", job_id="done")
    spool.enqueue("note", job_id="dead")
    spool.enqueue("note", job_id="gone")
    a, b = spool.claim(limit=2)
    spool.complete(a)
    spool.fail(b, "x", retryable=False)
    spool.cancel("gone")
    spool.enqueue("note", job_id="future", delay=60)
    r = spool.prepare("note", job_id="prep")
    clock.advance(59)
    assert spool.claim(limit=10) == []
    spool.commit(r)
    assert [x.job_id for x in spool.claim(limit=10)] == ["prep"]


def test_claim_with_a_mix_of_sources_takes_all_that_are_due(spool: Spool,
                                                           clock: Any) -> None:
    spool.enqueue("note", job_id="r1")
    spool.enqueue("note", job_id="l1")
    spool.enqueue("note", job_id="t1")
    leases = {x.job_id: x for x in spool.claim(limit=3)}
    spool.fail(leases["t1"], "again", delay=1.0)
    spool.release(leases["r1"])
    clock.advance(31.0)  # l1's lease expired, t1 is due, r1 is ready
    got = sorted(x.job_id for x in spool.claim(limit=10))
    assert got == ["l1", "r1", "t1"]


def test_tokens_are_strictly_increasing_across_claims_of_different_jobs(spool: Spool,
                                                                        clock: Any) -> None:
    tokens = []
    for i in range(20):
        spool.enqueue("note", job_id=f"j{i:02d}")
    for _ in range(5):
        for lease in spool.claim(limit=3):
            tokens.append(lease.token)
            spool.release(lease)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_a_released_job_is_claimed_once_per_batch(spool: Spool) -> None:
    # Released at the same instant it was enqueued: same (priority, run_at, id) key.
    spool.enqueue("note", job_id="a")
    spool.enqueue("note", job_id="b")
    for lease in spool.claim(limit=2):
        spool.release(lease)
    leases = spool.claim(limit=3)
    assert sorted(x.job_id for x in leases) == ["a", "b"]
    for lease in leases:
        assert spool.complete(lease).state is JobState.COMPLETED


def test_a_requeued_job_is_claimed_once_per_batch(spool: Spool) -> None:
    spool.enqueue("note", job_id="a")
    spool.claim()
    spool.cancel("a")
    spool.requeue("a")
    leases = spool.claim(limit=5)
    assert [x.job_id for x in leases] == ["a"]


def test_claim_never_takes_an_excluded_job_even_with_its_lease_expired(spool: Spool,
                                                                       clock: Any) -> None:
    spool.enqueue("note", job_id="mine", priority=-1)
    (mine,) = spool.claim()
    spool.enqueue("note", job_id="next")
    clock.advance(31.0)  # the lease on "mine" has expired: it is claimable again
    got = [lease.job_id for lease in spool.claim(limit=5, exclude={"mine"})]
    assert got == ["next"]
    assert spool.claim(limit=5, exclude={"mine"}) == []
    (again,) = spool.claim()  # without the exclusion, the crashed-worker rule applies
    assert again.job_id == "mine" and again.token > mine.token


def test_a_job_due_in_two_directories_is_claimed_once_from_its_newest_copy(
        tmp_path: Path) -> None:
    """A stale `ready/` copy beside an expired lease (a crash between rename and retire that
    nothing flagged) once made claims loop forever on the duplicate candidate."""
    import time as _time

    root = tmp_path / "spool"
    with make_spool(root, clock=lambda: _time.time() - 1000, lease_seconds=30) as past:
        past.enqueue("k", job_id="x0")
        stale = (root / "ready" / "x0.json").read_bytes()
        past.claim()
    (root / "ready" / "x0.json").write_bytes(stale)
    with make_spool(root) as s:
        s.enqueue("k", job_id="y")
        leases = s.claim(limit=10)
        leases += s.claim(limit=10)
        assert sorted(lease.job_id for lease in leases) == ["x0", "y"]
        x0 = next(lease for lease in leases if lease.job_id == "x0")
        assert x0.job.revision == 3 and x0.job.rescues == 1  # the leased copy, taken over
        assert not (root / "ready" / "x0.json").exists()
