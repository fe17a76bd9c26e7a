"""What a writer SIGKILLed mid-batch leaves on a live spool, met by the next claim before
anyone runs `recover` (other workers keep running after one dies). The leftovers are
planted exactly as the crash leaves them: the new file published and flushed, the old
one not yet retired, and the dead writer's in-flight mark still set in the lock's shared
memory. (`tests/test_strace_faults.py` kills real processes at each step.)"""

from __future__ import annotations

import os
from pathlib import Path

from jobspool import JobState, Worker
from tests.helpers_spool import FakeClock, assert_disk_consistent
from tests.spools import make_spool


def _died_mid_batch(spool: object) -> None:
    """The dead writer's mark: set by `begin_write`, never cleared by its `end_write`."""
    lock = spool.lock  # type: ignore[attr-defined]
    with lock.hold():
        lock.begin_write()
    lock.put(lock.SUSPECT_SLOT, 0)  # as if recovery had run before: only the mark tells


def test_a_job_completed_just_before_its_worker_died_is_not_run_again(tmp_path: Path) -> None:
    """Killed between publishing `completed/j.json` and retiring `leased/j.json`: the
    lease expires, and the next claim must see the completion, not run the job again
    (it did: the first claim after the crash ran before anything flagged the spool)."""
    root, clock = tmp_path / "s", FakeClock()
    with make_spool(root, clock=clock, lease_seconds=10.0) as spool:
        spool.enqueue("work", {"n": 1}, job_id="j")
        (lease,) = spool.claim()
        leased_copy = (root / "leased" / "j.json").read_bytes()
        spool.complete(lease, "done")
        (root / "leased" / "j.json").write_bytes(leased_copy)  # not yet retired
        _died_mid_batch(spool)
    clock.advance(60)  # the stale copy's lease has long expired
    ran: list[str] = []
    with make_spool(root, clock=clock) as spool:
        report = Worker(spool, {"work": lambda job, ctx: ran.append(job.id)}).run_until_idle()
        assert ran == [] and report.claimed == 0
        done = spool.get("j")
        assert (done.state, done.result, done.revision) == (JobState.COMPLETED, "done", 3)
    assert assert_disk_consistent(root) == {"j": "completed"}


def test_run_until_idle_drains_a_job_whose_claim_was_cut_off_by_a_crash(
        tmp_path: Path) -> None:
    """Killed mid-claim: `leased/j.json` (revision 2) published, `ready/j.json` (revision
    1) not yet retired, and the lease expired since. The claim that drops the stale ready
    copy must take the current one: it came back empty, and `run-until-idle` stopped with
    the job still due."""
    root, clock = tmp_path / "s", FakeClock()
    with make_spool(root, clock=clock, lease_seconds=10.0) as spool:
        spool.enqueue("work", {"n": 1}, job_id="j")
        spool.enqueue("work", {"n": 2}, job_id="k")
        ready_copies = {n: (root / "ready" / f"{n}.json").read_bytes() for n in ("j", "k")}
        spool.claim(limit=2)
        for n, data in ready_copies.items():
            (root / "ready" / f"{n}.json").write_bytes(data)
        _died_mid_batch(spool)
    clock.advance(60)
    ran: list[str] = []
    with make_spool(root, clock=clock) as spool:
        report = Worker(spool, {"work": lambda job, ctx: ran.append(job.id)}).run_until_idle()
        assert sorted(ran) == ["j", "k"] and report.completed == 2
    assert assert_disk_consistent(root) == {"j": "completed", "k": "completed"}
    assert not os.listdir(root / "ready")


def test_the_flag_is_raised_by_whoever_takes_the_lock_next(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        _died_mid_batch(spool)
        assert not spool.lock.suspect()
    with make_spool(root) as other:
        other.stats()  # any lock hold
        assert other.lock.suspect()
        assert other.lock.generation(other.lock.WRITER_SLOT) == 0
