"""Two-phase enqueue (outbox): prepare -> primary mutation -> commit, or abort.

DESIGN §3: several producers may prepare the same job id, each with its own
reservation; the job is canceled only when the last one aborts. Commit is
idempotent. A prepared job is never claimed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import InvalidJob, InvalidTransition, JobspoolError
from jobspool.queue.job import Reservation
from tests.helpers_spool import all_files, assert_disk_consistent, file_bytes, stat_counts


def test_prepare_writes_a_prepared_job_that_is_not_claimable(spool: Spool, spool_root: Path,
                                                             clock: Any) -> None:
    r = spool.prepare("note", {"v": 1}, job_id="j")
    assert isinstance(r, Reservation)
    assert r.job_id == "j"
    assert r.reservation_id
    assert r.job.state is JobState.PREPARED
    assert r.job.payload == {"v": 1}
    assert assert_disk_consistent(spool_root) == {"j": "prepared"}
    assert stat_counts(spool.stats())["prepared"] == 1
    clock.advance(10_000)
    assert spool.claim(limit=10) == []


def test_prepare_without_id_generates_one(spool: Spool) -> None:
    r1 = spool.prepare("note")
    r2 = spool.prepare("note")
    assert r1.job_id != r2.job_id
    assert r1.job_id < r2.job_id


def test_commit_moves_the_job_to_ready(spool: Spool, spool_root: Path) -> None:
    r = spool.prepare("note", {"v": 1}, job_id="j")
    job = spool.commit(r)
    assert job.state is JobState.READY
    assert job.payload == {"v": 1}
    assert job.revision > r.job.revision
    assert assert_disk_consistent(spool_root) == {"j": "ready"}
    (lease,) = spool.claim()
    assert lease.job_id == "j"
    assert lease.job.attempts == 1


def test_commit_is_idempotent(spool: Spool, spool_root: Path) -> None:
    r = spool.prepare("note", job_id="j")
    spool.commit(r)
    before = file_bytes(spool_root, "j")
    again = spool.commit(r)
    assert again.state is JobState.READY
    assert again.id == "j"
    assert file_bytes(spool_root, "j") == before


def test_commit_after_the_job_already_ran_changes_nothing(spool: Spool,
                                                          spool_root: Path) -> None:
    r = spool.prepare("note", job_id="j")
    spool.commit(r)
    (lease,) = spool.claim()
    spool.complete(lease)
    before = file_bytes(spool_root, "j")
    job = spool.commit(r)
    assert job.state is JobState.COMPLETED
    assert file_bytes(spool_root, "j") == before


def test_abort_of_the_only_reservation_cancels_the_job(spool: Spool,
                                                       spool_root: Path) -> None:
    r = spool.prepare("note", job_id="j")
    out = spool.abort(r)
    assert out is None or out.state is JobState.CANCELED
    assert spool.get("j").state is JobState.CANCELED
    assert assert_disk_consistent(spool_root) == {"j": "canceled"}


def test_several_reservations_cancel_only_when_the_last_one_aborts(spool: Spool,
                                                                   spool_root: Path) -> None:
    rs = [spool.prepare("note", {"v": 1}, job_id="j") for _ in range(3)]
    assert len({r.reservation_id for r in rs}) == 3
    assert all(r.job_id == "j" for r in rs)
    assert set(spool.get("j").reservations) >= {r.reservation_id for r in rs}
    spool.abort(rs[0])
    assert spool.get("j").state is JobState.PREPARED
    spool.abort(rs[2])
    assert spool.get("j").state is JobState.PREPARED
    spool.abort(rs[1])
    assert spool.get("j").state is JobState.CANCELED
    assert assert_disk_consistent(spool_root) == {"j": "canceled"}


def test_aborting_the_same_reservation_twice_does_not_count_twice(spool: Spool) -> None:
    a = spool.prepare("note", job_id="j")
    b = spool.prepare("note", job_id="j")
    spool.abort(a)
    with contextlib.suppress(JobspoolError):
        spool.abort(a)
    assert spool.get("j").state is JobState.PREPARED
    spool.abort(b)
    assert spool.get("j").state is JobState.CANCELED


def test_a_forged_reservation_cannot_cancel_the_job(spool: Spool) -> None:
    a = spool.prepare("note", job_id="j")
    forged = Reservation(job_id="j", reservation_id="not-a-real-one", job=a.job)
    with contextlib.suppress(JobspoolError):
        spool.abort(forged)
    assert spool.get("j").state is JobState.PREPARED


def test_one_producer_aborts_another_commits(spool: Spool) -> None:
    a = spool.prepare("note", job_id="j")
    b = spool.prepare("note", job_id="j")
    spool.abort(a)
    assert spool.commit(b).state is JobState.READY
    assert [x.job_id for x in spool.claim()] == ["j"]


def test_abort_after_another_producer_committed_does_not_cancel_the_job(spool: Spool) -> None:
    a = spool.prepare("note", job_id="j")
    b = spool.prepare("note", job_id="j")
    spool.commit(a)
    with contextlib.suppress(InvalidTransition):
        spool.abort(b)
    assert spool.get("j").state is JobState.READY


def test_prepare_after_all_aborted_reopens_the_canceled_job(spool: Spool,
                                                           spool_root: Path) -> None:
    a = spool.prepare("note", {"v": 1}, job_id="j")
    canceled_rev = (spool.abort(a) or spool.get("j")).revision
    b = spool.prepare("note", {"v": 1}, job_id="j")
    assert b.job.state is JobState.PREPARED
    assert b.job.revision > canceled_rev
    assert spool.get("j").state is JobState.PREPARED
    assert spool.commit(b).state is JobState.READY


def test_prepare_with_the_id_of_a_ready_job_returns_it_unchanged(spool: Spool,
                                                                 spool_root: Path) -> None:
    spool.enqueue("note", {"v": "orig"}, job_id="j")
    before = file_bytes(spool_root, "j")
    r = spool.prepare("note", {"v": "new"}, job_id="j")
    assert r.job.state is JobState.READY
    assert r.job.payload == {"v": "orig"}
    assert file_bytes(spool_root, "j") == before
    assert spool.commit(r).state is JobState.READY


def test_commit_of_a_job_canceled_by_an_operator_is_refused(spool: Spool,
                                                            spool_root: Path) -> None:
    r = spool.prepare("note", job_id="j")
    spool.cancel("j")
    before = file_bytes(spool_root, "j")
    with pytest.raises(InvalidTransition):
        spool.commit(r)
    assert file_bytes(spool_root, "j") == before


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "", "a\x00b", "z" * 130])
def test_prepare_refuses_a_bad_id_and_writes_nothing(spool: Spool, spool_root: Path,
                                                     bad_id: str) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob):
        spool.prepare("note", job_id=bad_id)
    assert all_files(spool_root) == before


def test_prepare_refuses_a_payload_over_max_job_bytes_and_writes_nothing(
    spool: Spool, spool_root: Path
) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob):
        spool.prepare("note", "x" * 70_000, job_id="big")
    with pytest.raises(InvalidJob):
        spool.prepare("note", {1, 2}, job_id="set")
    with pytest.raises(InvalidJob):
        spool.prepare("9kind", job_id="k")
    assert all_files(spool_root) == before
