"""Fencing: a holder that lost its lease can change nothing; tokens only ever go up.

DESIGN §4: heartbeat, complete, fail and release act only when the job is in
`leased` with the same token and an unexpired lease; otherwise `LeaseLost`
and the file is left byte for byte as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Lease, Spool
from jobspool.errors import JobNotFound, LeaseLost
from tests.helpers_spool import all_files, assert_disk_consistent
from tests.spools import make_spool

Action = Callable[[Spool, Lease], object]

ACTIONS: dict[str, Action] = {
    "heartbeat": lambda s, lease: s.heartbeat(lease),
    "complete": lambda s, lease: s.complete(lease, "stale result"),
    "fail-retryable": lambda s, lease: s.fail(lease, "stale error"),
    "fail-permanent": lambda s, lease: s.fail(lease, "stale error", retryable=False),
    "release": lambda s, lease: s.release(lease),
    "release-delay": lambda s, lease: s.release(lease, delay=5.0),
}


def _lost(spool: Spool, root: Path, lease: Lease, action: str) -> None:
    """Assert `action` with `lease` raises LeaseLost and changes no byte on disk."""
    where = {p: (root / p).read_bytes() for p in all_files(root)
             if p.split("/")[0] not in ("tmp",) and not p.endswith(".lock")}
    fence = (root / "fence").read_bytes() if (root / "fence").exists() else None
    with pytest.raises(LeaseLost) as info:
        ACTIONS[action](spool, lease)
    assert info.value.job_id == lease.job_id
    assert info.value.token == lease.token
    assert "\n" not in str(info.value)
    after = {p: (root / p).read_bytes() for p in all_files(root)
             if p.split("/")[0] not in ("tmp",) and not p.endswith(".lock")}
    if fence is not None:
        # Checking a lease must not mint a token.
        assert after.get("fence") == fence
    assert after == where
    assert_disk_consistent(root)


@pytest.mark.parametrize("action", ACTIONS)
def test_stale_token_after_reclaim_raises_lease_lost_and_changes_nothing(
    spool: Spool, spool_root: Path, clock: Any, action: str
) -> None:
    spool.enqueue("note", job_id="j")
    (old,) = spool.claim(owner="paused")
    clock.advance(31.0)
    (new,) = spool.claim(owner="live")
    _lost(spool, spool_root, old, action)
    assert spool.complete(new, "ok").result == "ok"


@pytest.mark.parametrize("action", ACTIONS)
def test_expired_lease_raises_lease_lost_and_changes_nothing(
    spool: Spool, spool_root: Path, clock: Any, action: str
) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    clock.advance(30.0)  # expires_at == now: expired (a lease is never valid at its end)
    _lost(spool, spool_root, lease, action)
    assert spool.get("j").state is JobState.LEASED


@pytest.mark.parametrize("action", ACTIONS)
def test_acting_after_cancel_raises_lease_lost_and_changes_nothing(
    spool: Spool, spool_root: Path, action: str
) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    spool.cancel("j")
    _lost(spool, spool_root, lease, action)
    assert spool.get("j").state is JobState.CANCELED


@pytest.mark.parametrize("action", ACTIONS)
def test_acting_after_completion_raises_lease_lost(spool: Spool, spool_root: Path,
                                                   action: str) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    spool.complete(lease, "first")
    _lost(spool, spool_root, lease, action)
    assert spool.get("j").result == "first"


@pytest.mark.parametrize("action", ACTIONS)
def test_acting_after_release_and_reclaim_raises_lease_lost(spool: Spool, spool_root: Path,
                                                            action: str) -> None:
    spool.enqueue("note", job_id="j")
    (old,) = spool.claim()
    spool.release(old)
    (new,) = spool.claim()
    assert new.token > old.token
    _lost(spool, spool_root, old, action)


@pytest.mark.parametrize("action", ACTIONS)
def test_acting_after_cancel_requeue_and_reclaim_raises_lease_lost(
    spool: Spool, spool_root: Path, action: str
) -> None:
    spool.enqueue("note", job_id="j")
    (old,) = spool.claim()
    spool.cancel("j")
    spool.requeue("j")
    (new,) = spool.claim()
    _lost(spool, spool_root, old, action)
    assert spool.complete(new).state is JobState.COMPLETED


@pytest.mark.parametrize("action", ACTIONS)
def test_a_forged_token_raises_lease_lost(spool: Spool, spool_root: Path,
                                          action: str) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    for token in (lease.token + 1, lease.token - 1, 0):
        _lost(spool, spool_root, replace(lease, token=token), action)
    # Extending expires_at on the handle does not extend the lease on disk.
    assert spool.heartbeat(lease).token == lease.token


@pytest.mark.parametrize("action", ACTIONS)
def test_a_lease_for_a_deleted_or_unknown_job_raises_lease_lost(spool: Spool,
                                                                spool_root: Path,
                                                                action: str) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    ghost = replace(lease, job_id="ghost")
    with pytest.raises((LeaseLost, JobNotFound)):
        ACTIONS[action](spool, ghost)
    assert_disk_consistent(spool_root)


def test_a_stale_fail_cannot_dead_letter_a_job_another_worker_holds(
    spool: Spool, clock: Any
) -> None:
    spool.enqueue("note", job_id="j", max_attempts=2)
    (old,) = spool.claim()
    clock.advance(31.0)
    (new,) = spool.claim()
    with pytest.raises(LeaseLost):
        spool.fail(old, "stale", retryable=False)
    job = spool.get("j")
    assert job.state is JobState.LEASED
    assert job.lease is not None and job.lease.token == new.token


def test_tokens_increase_across_two_spool_objects_on_one_root(spool: Spool, spool_root: Path,
                                                             clock: Any) -> None:
    other = make_spool(spool_root, clock=clock, lease_seconds=30.0)
    try:
        for i in range(20):
            spool.enqueue("note", job_id=f"j{i:02d}")
        tokens = []
        for i in range(20):
            s = spool if i % 3 else other
            (lease,) = s.claim()
            tokens.append(lease.token)
            (other if i % 2 else spool).complete(lease)
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 20
    finally:
        other.close()


def test_tokens_keep_increasing_after_the_spool_is_reopened(spool_root: Path,
                                                           clock: Any) -> None:
    tokens: list[int] = []
    for round_ in range(3):
        s = make_spool(spool_root, durable=True, clock=clock, lease_seconds=30.0)
        try:
            for i in range(3):
                s.enqueue("note", job_id=f"r{round_}-{i}")
            for lease in s.claim(limit=3):
                tokens.append(lease.token)
                s.release(lease)
            for lease in s.claim(limit=3):
                tokens.append(lease.token)
                s.complete(lease)
        finally:
            s.close()
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens) == 18


def test_the_fence_counter_lives_in_the_root_and_is_never_below_an_issued_token(
    spool: Spool, spool_root: Path
) -> None:
    assert (spool_root / "fence").is_file()
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    text = (spool_root / "fence").read_bytes().strip()
    digits = "".join(ch for ch in text.decode("ascii", "replace") if ch.isdigit())
    assert digits and int(digits) >= lease.token


def test_a_heartbeat_from_a_stale_holder_does_not_extend_the_new_holders_lease(
    spool: Spool, clock: Any
) -> None:
    spool.enqueue("note", job_id="j")
    (old,) = spool.claim()
    clock.advance(31.0)
    (new,) = spool.claim()
    clock.advance(10.0)
    with pytest.raises(LeaseLost):
        spool.heartbeat(old)
    job = spool.get("j")
    assert job.lease is not None
    assert job.lease.expires_at == pytest.approx(new.expires_at)


def test_every_lost_holder_fails_and_exactly_one_completes(spool: Spool, clock: Any) -> None:
    spool.enqueue("note", job_id="j")
    holders = []
    for _ in range(5):
        (lease,) = spool.claim()
        holders.append(lease)
        clock.advance(30.0)
    clock.now -= 1.0  # the last lease is live again
    results = []
    for lease in holders:
        try:
            spool.complete(lease)
            results.append("ok")
        except LeaseLost:
            results.append("lost")
    assert results == ["lost"] * 4 + ["ok"]
    assert spool.get("j").attempts == 5
