"""`Spool.recover()` (DESIGN §6): duplicates, temp files, the fence, expired leases, the report.

Crash leftovers are planted the way a crash leaves them: the old file of a
state change put back beside the new one (a crash between the rename and
the removal), a staging file in `tmp/`, a fence counter behind the tokens
(a crash in the middle of a claim batch). Replay, quarantine and pruning
have their own modules.
"""

from __future__ import annotations

import os
import time
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.errors import JobNotFound, LeaseLost, SpoolError
from jobspool.queue.fence import encode_fence, restart_floor
from jobspool.queue.job import encode_job, evolve
from jobspool.recovery.quarantine import quarantined_files, read_reason
from jobspool.recovery.recover import RecoveryReport
from tests.helpers_spool import all_files, assert_disk_consistent, job_files, read_raw
from tests.spools import make_spool


def _put_back(root: Path, state: str, job_id: str, data: bytes) -> None:
    """Re-create the old file of a state change: a crash between rename and unlink."""
    (root / state / f"{job_id}.json").write_bytes(data)


def _bytes(root: Path, state: str, job_id: str) -> bytes:
    return (root / state / f"{job_id}.json").read_bytes()


def _disk(root: Path) -> dict[str, bytes]:
    return {p: (root / p).read_bytes() for p in sorted(all_files(root)) if p != ".lock"}


# ---------------------------------------------------------------- duplicates


def test_a_crash_between_rename_and_unlink_is_settled_to_the_higher_revision(
        spool: Spool, spool_root: Path) -> None:
    job = spool.enqueue("k", {"a": 1}, job_id="j")
    old = _bytes(spool_root, "ready", "j")
    (lease,) = spool.claim()
    _put_back(spool_root, "ready", "j", old)
    assert job_files(spool_root)["j"] == ["ready", "leased"]

    report = spool.recover()

    assert report.duplicates_resolved == ("j",)
    assert report.stale_copies_removed == ("ready/j.json",)
    assert assert_disk_consistent(spool_root) == {"j": "leased"}
    assert spool.get("j").revision == job.revision + 1
    spool.complete(lease)  # the live lease is the one that survived
    assert spool.get("j").state is JobState.COMPLETED


def test_a_stale_copy_never_brings_a_finished_job_back(spool: Spool, spool_root: Path) -> None:
    spool.enqueue("k", job_id="j")
    (lease,) = spool.claim()
    leased = _bytes(spool_root, "leased", "j")
    spool.complete(lease)
    _put_back(spool_root, "leased", "j", leased)

    spool.recover()

    assert assert_disk_consistent(spool_root) == {"j": "completed"}


def test_equal_revisions_keep_the_terminal_copy(spool: Spool, spool_root: Path,
                                                clock: Any) -> None:
    # Two crashes can tie: a stale leased copy re-claimed after the job completed elsewhere.
    spool.enqueue("k", job_id="j")
    (lease,) = spool.claim()
    done = spool.complete(lease)
    clock.advance(5)
    rival = evolve(lease.job, revision=done.revision, updated_at=clock.now)
    _put_back(spool_root, "leased", "j", encode_job(rival))

    report = spool.recover()

    assert report.duplicates_resolved == ("j",)
    assert assert_disk_consistent(spool_root) == {"j": "completed"}


def test_duplicates_across_many_jobs_are_settled_one_batch_per_lock_hold(spool: Spool,
                                                            spool_root: Path) -> None:
    from jobspool.recovery import recover as recover_mod

    jobs = spool.enqueue_many("k", list(range(30)))
    olds = {j.id: _bytes(spool_root, "ready", j.id) for j in jobs}
    spool.claim(limit=30)
    for job_id, data in olds.items():
        _put_back(spool_root, "ready", job_id, data)
    saved = recover_mod.BATCH
    recover_mod.BATCH = 7
    holds = 0
    real_acquire = spool.lock.acquire

    def counting_acquire() -> None:
        nonlocal holds
        if not spool.lock.held:
            holds += 1
        real_acquire()

    spool.lock.acquire = counting_acquire  # type: ignore[method-assign]
    try:
        report = spool.recover()
    finally:
        recover_mod.BATCH = saved
        del spool.lock.acquire
    assert sorted(report.duplicates_resolved) == sorted(olds)
    # Live workers wait behind one batch at a time, never behind the whole pass.
    assert holds >= 30 // 7 + 1
    assert set(assert_disk_consistent(spool_root).values()) == {"leased"}


# ---------------------------------------------------------------- temp files and the pool


def test_stats_counts_every_staging_file_a_crash_left(spool: Spool, spool_root: Path) -> None:
    # Found in an operations probe: a producer killed mid-enqueue leaves a `.stage` file,
    # which fsck names and recover removes, but stats (and its Prometheus gauge) counted
    # only `.tmp` files: the metric meant to show crash leftovers said 0.
    spool.enqueue("k", job_id="j")
    stage = spool_root / "tmp" / "056394ca359c3fac.295.stage"
    stage.write_bytes(b'{"torn')
    os.utime(stage, (time.time() - 3600, time.time() - 3600))  # its writer long gone
    (spool_root / "tmp" / "4242.7.tmp").write_bytes(b"")
    (spool_root / "tmp" / "pool" / "77.1").write_bytes(b"recycled")
    assert spool.stats().temp_files == 2
    assert len(spool.recover().temp_files_removed) == 2
    assert spool.stats().temp_files == 0


def test_every_staging_file_is_removed_and_the_pool_is_kept(spool: Spool,
                                                            spool_root: Path) -> None:
    spool.enqueue("k", job_id="j")
    (spool_root / "tmp" / "4242.7.tmp").write_bytes(b'{"torn')
    (spool_root / "tmp" / "4242.8.tmp").write_bytes(b"")
    pool = spool_root / "tmp" / "pool"
    (pool / "77.1").write_bytes(b"recycled")

    report = spool.recover()

    assert sorted(report.temp_files_removed) == ["tmp/4242.7.tmp", "tmp/4242.8.tmp"]
    assert sorted(os.listdir(spool_root / "tmp")) == ["pool"]
    assert (pool / "77.1").exists()
    assert report.pool_files_trimmed == ()
    assert assert_disk_consistent(spool_root) == {"j": "ready"}


def test_the_pool_of_recycled_files_is_trimmed_to_its_size(spool: Spool,
                                                           spool_root: Path) -> None:
    pool = spool_root / "tmp" / "pool"
    for i in range(6):
        (pool / f"1.{i}").write_bytes(b"x")
    spool.store.pool_size = 4
    report = spool.recover()
    assert len(report.pool_files_trimmed) == 2
    assert len(os.listdir(pool)) == 4
    spool.enqueue("k", job_id="after")  # staging still works with the trimmed pool
    assert assert_disk_consistent(spool_root) == {"after": "ready"}


def test_an_abandoned_fence_staging_file_in_the_root_is_removed(spool: Spool,
                                                                spool_root: Path) -> None:
    (spool_root / ".fence.999.tmp").write_bytes(b"{")
    report = spool.recover()
    assert report.temp_files_removed == (".fence.999.tmp",)
    assert not (spool_root / ".fence.999.tmp").exists()


# ---------------------------------------------------------------- the fence


def test_a_fence_behind_the_tokens_on_disk_is_raised(spool: Spool, spool_root: Path) -> None:
    spool.enqueue_many("k", [1, 2, 3], job_ids=["a", "b", "c"])
    leases = spool.claim(limit=3)
    top = max(lease.token for lease in leases)
    # A crash inside a claim batch: the job files renamed, the counter not yet.
    (spool_root / "fence").write_bytes(encode_fence(top - 2))
    assert not spool.fsck().ok

    report = spool.recover()

    assert (report.fence_before, report.fence_after) == (top - 2, top)
    assert report.fence_raised == tuple(sorted(lease.job_id for lease in leases
                                               if lease.token > top - 2))
    assert spool.fsck().ok
    spool.enqueue("k", job_id="d")
    (nxt,) = spool.claim()
    assert nxt.token > top


def test_an_unreadable_fence_is_quarantined_and_rebuilt_from_the_tokens(
        spool: Spool, spool_root: Path) -> None:
    spool.enqueue_many("k", [1, 2], job_ids=["a", "b"])
    leases = spool.claim(limit=2)
    (spool_root / "fence").write_bytes(b"\x00garbage")
    spool.enqueue("k", job_id="c")
    # As after a reboot: no counter cached in shared memory, so the claim must read the file.
    spool.lock.put(spool.lock.FENCE_CEILING_SLOT, 0)
    with pytest.raises(SpoolError, match="recover"):
        spool.claim()

    floor = restart_floor()
    report = spool.recover()

    assert report.fence_before is None
    # Tokens of terminal (and pruned) jobs are gone from disk: the leases seen are only a
    # lower bound, so the counter goes on above the clock's floor (fence.restart_floor).
    assert report.fence_after is not None and report.fence_after >= floor
    (q,) = quarantined_files(spool)
    assert (spool_root / "quarantine" / q).read_bytes() == b"\x00garbage"
    assert "fence" in str(read_reason(spool, q)["reason"])
    (lease_c,) = spool.claim()
    assert lease_c.token > max(lease.token for lease in leases)


def test_a_fence_rebuilt_after_pruning_stays_above_every_token_handed_out(
        spool: Spool, spool_root: Path) -> None:
    """The jobs holding the highest tokens were pruned, then the fence file was damaged:
    the tokens on disk say nothing, the lock's shared counter still knows. Even with
    `.lock` lost afterwards, no token is handed out twice."""
    issued = []
    for i in range(20):
        spool.enqueue("k", i)
        (lease,) = spool.claim()
        issued.append(lease.token)
        spool.complete(lease)
    spool.prune(keep=0)
    (spool_root / "fence").write_bytes(b"garbage")

    report = spool.recover()

    assert report.fence_after is not None and report.fence_after >= max(issued)
    spool.close()
    (spool_root / ".lock").unlink()  # the shared counter gone too: only the file is left
    with Spool(spool_root) as again:
        again.enqueue("k", "after")
        (lease,) = again.claim()
        assert lease.token > max(issued)


@pytest.mark.parametrize("then", ["reopen", "recover", "under_open_spool"])
def test_a_deleted_fence_never_restarts_the_tokens(spool_root: Path, then: str) -> None:
    """`fence` deleted and the counter's shared memory lost (a reboot, a deleted `.lock`):
    every job's token went with it (terminal jobs keep none), and tokens restarted at 1 —
    a new claim's projection writes were dropped as stale while its job completed."""
    issued = []
    with Spool(spool_root, durable=False) as spool:
        for i in range(5):
            spool.enqueue("k", i)
            (lease,) = spool.claim()
            issued.append(lease.token)
            spool.complete(lease)
        if then == "under_open_spool":
            with Spool(spool_root, durable=False) as other:  # has seen no token yet
                (spool_root / "fence").unlink()
                for slot in (other.lock.FENCE_NEXT_SLOT, other.lock.FENCE_CEILING_SLOT):
                    other.lock.put(slot, 0)  # as after a reboot with the map reset
                other.enqueue("k", "after")
                (lease,) = other.claim()
                assert lease.token > max(issued)
            return
    (spool_root / "fence").unlink()
    (spool_root / ".lock").unlink()
    with Spool(spool_root, durable=False) as again:
        if then == "recover":
            report = again.recover()
            assert report.fence_after is not None and report.fence_after > max(issued)
        again.enqueue("k", "after")
        (lease,) = again.claim()
        assert lease.token > max(issued)
        assert again.fsck().ok


# ---------------------------------------------------------------- expired leases


def test_an_expired_lease_goes_back_to_retryable(spool: Spool, spool_root: Path,
                                                 clock: Any) -> None:
    spool.enqueue_many("k", [1, 2], job_ids=["a_dead", "b_alive"])
    (dead,) = spool.claim(lease_seconds=10)
    (alive,) = spool.claim(lease_seconds=1000)
    clock.advance(11)

    report = spool.recover()

    assert report.leases_reclaimed == ("a_dead",)
    assert report.dead_lettered == ()
    job = spool.get("a_dead")
    assert job.state is JobState.RETRYABLE
    assert job.lease is None
    assert job.attempts == 1
    assert job.rescues == 1
    assert spool.get("b_alive").state is JobState.LEASED
    with pytest.raises(LeaseLost):
        spool.complete(dead)
    spool.complete(alive)  # a live lease is left alone


def test_an_expired_lease_with_no_attempts_left_is_dead_lettered(spool: Spool,
                                                                 clock: Any) -> None:
    spool.enqueue("k", job_id="j", max_attempts=1)
    spool.claim()
    clock.advance(31)
    report = spool.recover()
    assert report.dead_lettered == ("j",)
    assert report.leases_reclaimed == ()
    job = spool.get("j")
    assert job.state is JobState.DEAD_LETTER
    assert job.last_error and "attempts exhausted" in job.last_error


# ---------------------------------------------------------------- the whole pass


def _make_a_mess(spool: Spool, root: Path, clock: Any) -> None:
    spool.enqueue_many("k", list(range(6)), job_ids=[f"j{i}" for i in range(6)])
    old = _bytes(root, "ready", "j0")
    spool.claim(limit=2)
    _put_back(root, "ready", "j0", old)
    (root / "tmp" / "1.1.tmp").write_bytes(b"x")
    (root / "ready" / "j5.json").write_bytes(b"")
    spool.prepare("k", job_id="p")
    clock.advance(1000)


def test_a_second_recovery_finds_nothing_to_do(spool: Spool, spool_root: Path,
                                               clock: Any) -> None:
    _make_a_mess(spool, spool_root, clock)
    first = spool.recover()
    assert first.changed
    disk = _disk(spool_root)

    second = spool.recover()

    assert not second.changed
    assert second.prepared_pending == ("p",)  # reported each time, changed nothing
    assert _disk(spool_root) == disk


def test_the_report_counts_every_step_and_serializes(spool: Spool, spool_root: Path,
                                                     clock: Any) -> None:
    _make_a_mess(spool, spool_root, clock)
    report = spool.recover()
    assert isinstance(report, RecoveryReport)
    counts = report.counts
    assert counts["duplicates_resolved"] == 1
    assert counts["temp_files_removed"] == 1
    assert counts["quarantined"] == 1
    assert counts["leases_reclaimed"] == 2
    assert counts["prepared_pending"] == 1
    for name in ("replayed_committed", "replayed_aborted", "replay_unknown", "pruned",
                 "dead_lettered", "fence_raised"):
        assert counts[name] == 0
    doc = orjson.loads(orjson.dumps(report.to_dict()))
    assert {name: len(doc[name]) for name in counts} == counts
    assert doc["quarantined"] == ["ready/j5.json"]
    assert doc["leases_reclaimed"] == ["j0", "j1"]
    assert doc["changed"] is True
    # The file holds a ceiling at or above every token handed out (tokens 1 and 2 here).
    assert doc["fence_before"] == doc["fence_after"] >= 2
    with pytest.raises(AttributeError):
        report.pruned = ()  # type: ignore[misc]


def test_a_healthy_spool_is_left_untouched(spool: Spool, spool_root: Path, clock: Any) -> None:
    spool.enqueue_many("k", list(range(5)), job_ids=[f"j{i}" for i in range(5)])
    a, b = spool.claim(limit=2)
    spool.complete(a)
    spool.fail(b, "x")
    spool.cancel("j4")
    spool.prepare("k", job_id="p")
    disk = _disk(spool_root)
    assert not spool.recover().changed
    assert _disk(spool_root) == disk


def test_recovery_runs_beside_a_live_worker_without_losing_a_job(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool = make_spool(root, lease_seconds=60.0)
    ids = {j.id for j in spool.enqueue_many("k", list(range(300)))}
    errors: list[BaseException] = []

    def worker() -> None:
        w = make_spool(root)
        try:
            while True:
                leases = w.claim(limit=5)
                if not leases:
                    return
                w.complete_many([(lease, None) for lease in leases])
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            w.close()

    t = threading.Thread(target=worker)
    t.start()
    runs = 0
    while t.is_alive() or runs == 0:
        report = spool.recover()
        assert report.quarantined == () and report.duplicates_resolved == ()
        runs += 1
    t.join()
    assert errors == []
    assert assert_disk_consistent(root) == dict.fromkeys(ids, "completed")
    assert spool.fsck().ok
    spool.close()


# ---------------------------------------------------------------- format version


def test_a_spool_of_a_newer_format_is_refused_before_anything_is_touched(
        spool: Spool, spool_root: Path) -> None:
    spool.enqueue("k", job_id="j")
    (spool_root / "tmp" / "1.1.tmp").write_bytes(b"leftover")
    doc = orjson.loads((spool_root / "spool.json").read_bytes())
    doc["format"] = 99
    (spool_root / "spool.json").write_bytes(orjson.dumps(doc))
    before = {p: ((spool_root / p).read_bytes(), (spool_root / p).stat().st_mtime_ns)
              for p in all_files(spool_root)}

    with pytest.raises(SpoolError) as err:
        make_spool(spool_root)

    assert "99" in str(err.value) and "format 1" in str(err.value)
    after = {p: ((spool_root / p).read_bytes(), (spool_root / p).stat().st_mtime_ns)
             for p in all_files(spool_root)}
    assert after == before
    assert read_raw(spool_root, "ready", "j")["state"] == "ready"


def test_recovery_leaves_a_live_producers_prestaged_files_and_removes_a_dead_ones(
        spool_root: Path) -> None:
    import subprocess
    import sys

    from jobspool.queue import liveness

    with make_spool(spool_root) as spool:
        # A producer that registered its liveness lock, then died without cleaning up.
        code = ("import os, sys; from pathlib import Path; from jobspool.queue import liveness; "
                "m = liveness.mark_for(Path(sys.argv[1])); print(m.ident, flush=True); os._exit(0)")
        dead = subprocess.run([sys.executable, "-c", code, str(spool_root)],
                              capture_output=True, text=True, check=True)
        dead_ident = dead.stdout.strip()
        (spool_root / "tmp" / f"{dead_ident}.3.stage").write_bytes(b'{"half":')
        mine = spool.process_mark().ident
        live = spool_root / "tmp" / f"{mine}.9.stage"
        live.write_bytes(b"{}")
        report = spool.recover()
        assert f"tmp/{dead_ident}.3.stage" in report.temp_files_removed
        assert live.exists(), "a live producer's staged file must survive recovery"
        assert not (spool_root / "tmp" / f"{dead_ident}.3.stage").exists()
        assert liveness.probe(spool_root, dead_ident)[0] == liveness.Verdict.UNKNOWN
        live.unlink()
        assert spool.fsck().ok


# ---------------------------------------------------------------- readers before recovery


def test_readers_show_one_copy_per_job_the_one_recovery_keeps(
        spool: Spool, spool_root: Path) -> None:
    """A power loss may leave a job's old file beside its new one until `recover` runs:
    `jobs`, `stats` and `get` show the job once, in the state recovery will keep."""
    spool.enqueue("k", {}, job_id="d1")
    spool.enqueue("k", {}, job_id="other")
    old = (spool_root / "ready" / "d1.json").read_bytes()
    (lease,) = spool.claim(limit=1)
    assert lease.job_id == "d1"
    spool.complete(lease)
    (spool_root / "ready" / "d1.json").write_bytes(old)  # the stale copy, revision 1

    assert [(j.id, j.state) for j in spool.jobs()] == [
        ("other", JobState.READY), ("d1", JobState.COMPLETED)]
    assert [j.id for j in spool.jobs(state="ready")] == ["other"]
    stats = spool.stats()
    assert (stats.counts["ready"], stats.counts["completed"], stats.due) == (1, 1, 1)
    assert spool.get("d1").state is JobState.COMPLETED

    # A tie in revision (two crashes): the terminal copy, as recovery decides.
    canceled = evolve(spool.get("other"), state=JobState.CANCELED)
    (spool_root / "canceled" / "other.json").write_bytes(encode_job(canceled))
    assert spool.get("other").state is JobState.CANCELED
    assert [j.id for j in spool.jobs(state="ready")] == []
    spool.recover()
    assert assert_disk_consistent(spool_root) == {"d1": "completed", "other": "canceled"}


def test_recover_reports_a_fence_file_deleted_by_hand_as_rebuilt(tmp_path: Path) -> None:
    """Found by an operator probe: `jobspool recover` rebuilt a deleted fence file (at the
    opening of the spool it recovers) and reported `changed: false`, nothing raised, while a
    garbage fence file was reported as repaired: a script keyed on `changed` was told
    nothing happened though fencing had restarted."""
    from tests.cli_harness import run_jobspool

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {})
    (root / "fence").unlink()
    done = run_jobspool("recover", "--json", root=root)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert report["changed"] is True and "fence" in report["fence_raised"], report
    assert report["fence_before"] is None and report["fence_after"] >= restart_floor() - 10**8
    again = orjson.loads(run_jobspool("recover", "--json", root=root).stdout)
    assert again["changed"] is False and again["fence_raised"] == []


def test_a_read_only_opener_does_not_claim_to_restart_a_missing_fence(tmp_path: Path) -> None:
    """`jobspool stats` on a spool whose fence file is gone said "fencing tokens restart
    above X" and wrote nothing; the next writer restarted above another value."""
    from tests.cli_harness import run_jobspool

    root = tmp_path / "spool"
    make_spool(root).close()
    (root / "fence").unlink()
    done = run_jobspool("stats", root=root)
    assert done.returncode == 0, done.stderr
    assert "restart above" not in done.stderr
    assert "fence is missing: the next process that writes" in done.stderr
    assert not (root / "fence").exists()


def test_get_says_a_state_directory_is_missing_not_that_the_job_is_gone(tmp_path: Path) -> None:
    """Found by an operator probe: with `ready/` moved away under an open spool (and a
    dashboard), looking a job up said "no job (pruned, or never enqueued)", where every
    listing said the directory is missing."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        job = spool.enqueue("work", {})
        (root / "ready").rename(root / "ready.moved")
        with pytest.raises(SpoolError, match="a state directory is missing"):
            spool.get(job.id)
        (root / "ready.moved").rename(root / "ready")
        assert spool.get(job.id).id == job.id
        with pytest.raises(JobNotFound):
            spool.get("never-enqueued")
