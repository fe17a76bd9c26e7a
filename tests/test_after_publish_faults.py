"""Faults after a write was published: the flush of the new versions' directories, or
the removal of the superseded copies, fails.

A failed directory flush left the new version visible but not durable; the old copy
was removed anyway, so a power loss could take both. A failed removal after a good
flush reported the change as "not confirmed durable" (it was), and callers retried
it over itself. Now: the old copy stays until the flush is confirmed (recovery keeps
the higher revision), and a removal that fails is logged, the change reported done.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import WriteFailed
from jobspool.queue import store as store_mod
from tests.helpers_spool import FakeClock
from tests.spools import make_spool


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def durable(tmp_path: Path, clock: FakeClock) -> Iterator[Spool]:
    s = make_spool(tmp_path / "spool", durable=True, sync_mode="fsync", clock=clock,
                   lease_seconds=30)
    yield s
    s.close()


def _failing_nth(real: Callable[..., Any], n: int, err: int) -> Callable[..., Any]:
    """`real`, except that its n-th call (1-based) raises `err`."""
    calls = {"n": 0}

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise OSError(err, "injected " + errno.errorcode[err])
        return real(*args, **kwargs)

    return fake


def test_a_settle_whose_directory_flush_fails_keeps_the_old_copy_until_recovery(
        durable: Spool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    durable.enqueue("note", job_id="j0")
    (lease,) = durable.claim()
    with monkeypatch.context() as m:
        m.setattr(store_mod, "fsync_dir", _failing_nth(store_mod.fsync_dir, 1, errno.EIO))
        (result,) = durable.complete_many([(lease, {"ok": True})])
    assert getattr(result, "state", result) is JobState.COMPLETED
    # Not flushed: removing the leased copy could let a power loss take both versions.
    assert (durable.root / "leased" / "j0.json").exists()
    assert (durable.root / "completed" / "j0.json").exists()
    assert durable.get("j0").state is JobState.COMPLETED  # readers see the newer copy
    clock.advance(3600)  # the old copy's lease long expired: still not run again
    assert durable.claim() == []
    durable.recover()
    assert not (durable.root / "leased" / "j0.json").exists()
    assert durable.get("j0").state is JobState.COMPLETED


def test_a_claim_whose_directory_flush_fails_keeps_the_ready_copy_until_recovery(
        durable: Spool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    durable.enqueue("note", job_id="first")
    durable.complete(durable.claim()[0])  # the first claim also flushes a token block
    durable.enqueue("note", job_id="j0")
    with monkeypatch.context() as m:
        m.setattr(store_mod, "fsync_dir", _failing_nth(store_mod.fsync_dir, 1, errno.EIO))
        (lease,) = durable.claim()
    assert lease.job_id == "j0"
    assert (durable.root / "ready" / "j0.json").exists()
    assert durable.claim() == []  # the stale ready copy is not a second lease
    assert durable.complete(lease).state is JobState.COMPLETED
    durable.recover()
    assert [j.state for j in durable.jobs()] == [JobState.COMPLETED, JobState.COMPLETED]
    assert not (durable.root / "ready" / "j0.json").exists()


@pytest.mark.parametrize("operation", ["cancel", "requeue", "release", "complete", "fail"])
def test_a_change_whose_old_copy_cannot_be_removed_is_reported_done(
        durable: Spool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, operation: str) -> None:
    durable.enqueue("note", job_id="j0")
    if operation == "requeue":
        durable.cancel("j0")
    lease = durable.claim()[0] if operation in ("release", "complete", "fail") else None
    durable.store.pool_size = 0  # the old copy is unlinked, not recycled
    expected = {"cancel": JobState.CANCELED, "requeue": JobState.READY,
                "release": JobState.READY, "complete": JobState.COMPLETED,
                "fail": JobState.RETRYABLE}[operation]
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING):
        m.setattr(store_mod, "os_unlink", _failing_nth(store_mod.os_unlink, 1, errno.EIO))
        if operation == "cancel":
            job = durable.cancel("j0")
        elif operation == "requeue":
            job = durable.requeue("j0")
        elif operation == "release":
            job = durable.release(lease)  # type: ignore[arg-type]
        elif operation == "complete":
            job = durable.complete(lease, 1)  # type: ignore[arg-type]
        else:
            job = durable.fail(lease, "boom")  # type: ignore[arg-type]
    assert job.state is expected
    assert durable.get("j0").state is expected
    assert any("recover" in r.getMessage() and "j0.json" in r.getMessage()
               for r in caplog.records)
    durable.recover()
    assert [j.state for j in durable.jobs()] == [expected]
    assert sum(1 for _ in durable.root.glob("*/j0.json")) == 1


def test_a_prepare_whose_flush_fails_returns_the_reservation_that_landed(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised instead, the caller prepared again: a second reservation, and the first (its
    id never returned) kept the job in `prepared` for good after the caller's abort."""
    with monkeypatch.context() as m:
        m.setattr(store_mod, "fsync_dir", _failing_nth(store_mod.fsync_dir, 1, errno.EIO))
        reservation = durable.prepare("note", {"a": 1}, job_id="p1")
    assert durable.get("p1").state is JobState.PREPARED
    assert durable.get("p1").reservations == (reservation.reservation_id,)
    canceled = durable.abort(reservation)
    assert canceled is not None and canceled.state is JobState.CANCELED


def test_a_heartbeat_the_disk_refuses_raises_instead_of_passing_for_extended(
        durable: Spool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    durable.enqueue("note", job_id="j0")
    (lease,) = durable.claim()
    clock.advance(10)
    with monkeypatch.context() as m, pytest.raises(WriteFailed) as caught:
        m.setattr(store_mod, "os_replace", _failing_nth(store_mod.os_replace, 1, errno.ENOSPC))
        durable.heartbeat(lease)
    assert caught.value.errno == errno.ENOSPC and "\n" not in str(caught.value)
    assert durable.get("j0").lease.expires_at == lease.expires_at  # type: ignore[union-attr]
    assert durable.heartbeat(lease).expires_at == clock.now + 30  # the disk took it later


def test_a_fenced_block_that_ran_is_not_reported_failed_when_its_extension_is_refused(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    durable.enqueue("note", job_id="j0")
    (lease,) = durable.claim()
    effects = []
    with monkeypatch.context() as m:
        m.setattr(store_mod, "os_replace", _failing_nth(store_mod.os_replace, 1, errno.ENOSPC))
        with durable.fenced(lease):
            effects.append("sent")
    assert effects == ["sent"]
    assert durable.complete(lease).state is JobState.COMPLETED


def test_an_enqueue_whose_group_flush_lock_is_refused_names_the_published_job(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared flush reads what to flush under the spool lock, after the job was
    renamed into ready/. A refused lock there said only "cannot lock": the caller took
    the job for not enqueued, and enqueued it again under a new id (the first one ran)."""
    from jobspool.queue import groupflush, lock

    published = {"yes": False}
    real_publish = groupflush.GroupFlush.publish

    def publish(self: Any, slots: Any) -> int:
        published["yes"] = True
        return real_publish(self, slots)

    real_flock = lock.os_flock

    def flock(fd: int, op: int) -> None:
        if published["yes"] and op & lock.fcntl.LOCK_EX:
            raise OSError(errno.EIO, "injected EIO")
        real_flock(fd, op)

    durable.enqueue("note", job_id="warm")
    with monkeypatch.context() as m:
        m.setattr(groupflush.GroupFlush, "publish", publish)
        m.setattr(lock, "os_flock", flock)
        with pytest.raises(WriteFailed, match="published though not confirmed durable: n1") as e:
            durable.enqueue("note", job_id="n1")
    assert e.value.landed == frozenset({"n1"})
    assert durable.get("n1").state is JobState.READY
