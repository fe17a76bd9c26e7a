"""What the stores answer, alike (a parity probe's findings, 2026-12-04).

Before: on the file store `complete(lease, (1, 2))` returned the caller's tuple where `get`
and the PostgreSQL store gave the stored `[1, 2]`; its `PruneReport` listed ids newest
first and counted only the states it had to scan (PostgreSQL: ids in order, every terminal
state counted); a read-only PostgreSQL spool answered `requeue_all()` with `[]` when no
dead letter was there, where the file store refused, and its refusal gave no hint; its
`recover` made a reclaimed job due at once (the file store: after the backoff).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobspool import JobState, Spool, Worker
from jobspool.errors import SpoolError
from tests.store_params import sleep_past


@pytest.mark.parametrize("result, stored", [
    ((1, 2), [1, 2]),
    ({"a": (1, [2, (3,)])}, {"a": [1, [2, [3]]]}),
    ([{"b": ("x",)}], [{"b": ["x"]}]),
])
def test_a_completion_returns_its_result_as_stored(make_any_spool: Callable[..., Spool],
                                                   result: Any, stored: Any) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    done = spool.complete(lease, result)
    assert done.result == stored and done.result == spool.get(done.id).result


def test_a_completion_returns_a_copy_not_the_callers_dict(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    mine = {"n": [1]}
    done = spool.complete(lease, mine)
    mine["n"].append(2)
    assert done.result == {"n": [1]} == spool.get(done.id).result


def test_a_prune_report_lists_ids_in_order_and_counts_every_terminal_state(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    ids = [spool.enqueue("k", {"i": i}).id for i in range(5)]
    for lease in sorted(spool.claim(limit=5), key=lambda x: x.job_id, reverse=True):
        spool.complete(lease)  # the newest id finishes first: removal order is not id order
    report = spool.prune(keep=2)
    gone = {j for j in ids if j not in {x.id for x in spool.jobs()}}
    assert len(gone) == 3
    assert report.completed == tuple(sorted(gone))
    assert report.kept == {"completed": 2, "dead_letter": 0, "canceled": 0}
    assert report.to_dict()["pruned"] == 3


def test_a_prune_with_nothing_to_remove_still_counts_what_it_kept(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    spool.complete(lease)
    report = spool.prune(keep=10)
    assert report.pruned == ()
    assert report.kept == {"completed": 1, "dead_letter": 0, "canceled": 0}


def test_a_read_only_spool_refuses_bulk_writes_even_when_nothing_matches(
        make_any_spool: Callable[..., Spool]) -> None:
    make_any_spool()  # created, empty
    ro = make_any_spool(read_only=True)
    for write in (ro.requeue_all, lambda: ro.requeue_matching(kind="k"),
                  lambda: ro.cancel_matching(kind="k")):
        with pytest.raises(SpoolError, match=r"read-only \(open it with read_only=False"):
            write()


def test_recover_gives_an_expired_lease_back_after_the_backoff_on_both_stores(
        make_any_spool: Callable[..., Spool]) -> None:
    # Before: PostgreSQL's sweep made the job due at once (a job that crashed its worker
    # ran again at once, again and again) and set a dead letter's run_at to the sweep's time.
    spool = make_any_spool(lease_seconds=0.2, retry_base_seconds=40.0)
    again = spool.enqueue("k", {}, job_id="again")
    dead = spool.enqueue("k", {}, job_id="dead", max_attempts=1)
    leases = spool.claim(limit=2)
    assert len(leases) == 2
    sleep_past(max(x.expires_at for x in leases))
    spool.recover()
    back, gone = spool.get("again"), spool.get("dead")
    assert back.state is JobState.RETRYABLE and gone.state is JobState.DEAD_LETTER
    # backoff(1) = 40 s, jittered into [20, 40]
    assert back.run_at - back.updated_at >= 20.0 - 1e-6, (back.run_at, back.updated_at)
    assert back.run_at - back.updated_at <= 40.0 + 1e-6
    assert spool.claim() == []
    assert gone.run_at == dead.run_at
    assert again.run_at < back.run_at


def test_a_lease_is_extended_by_its_own_length_unless_told_otherwise(
        make_any_spool: Callable[..., Spool]) -> None:
    # Before: heartbeat() and fenced() extended any lease by the spool's default (60 s): a
    # worker's 3 s leases became 60 s at a handler's ctx.heartbeat(), and a worker that
    # died then held its job twenty times as long as configured.
    spool = make_any_spool(lease_seconds=60.0)
    spool.enqueue("k", {})
    (lease,) = spool.claim(lease_seconds=3.0)
    left = spool.heartbeat(lease).expires_at - spool.now()
    assert 1.0 < left <= 3.0 + 1e-6, left
    with spool.fenced(lease):
        pass
    left = spool.get(lease.job_id).lease.expires_at - spool.now()
    assert 1.0 < left <= 3.0 + 1e-6, left
    longer = spool.heartbeat(lease, lease_seconds=30.0)
    assert longer.expires_at - spool.now() > 20.0
    assert spool.heartbeat_many([lease])[0].expires_at == longer.expires_at  # never shortened


def test_a_handlers_heartbeat_keeps_its_workers_lease_length(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=60.0)
    seen: list[float] = []

    def handler(job: Any, ctx: Any) -> None:
        ctx.heartbeat()
        seen.append(spool.get(job.id).lease.expires_at - spool.now())

    spool.enqueue("k", {})
    assert Worker(spool, {"k": handler}, lease_seconds=3.0).run_until_idle().completed == 1
    assert len(seen) == 1 and 1.0 < seen[0] <= 3.0 + 1e-6, seen


def test_a_run_given_back_for_a_failing_projection_is_not_shown_as_not_run(
        make_any_spool: Callable[..., Spool], tmp_path: Any) -> None:
    # Found in a README probe: a job whose run was deferred (the projection's storage
    # failing: uncounted, due again later) read "scheduled (not run yet)" in show, list
    # and stats, though its handler had run and its error said why it waited.
    spool = make_any_spool()
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "notes.lance").write_text("junk")  # a damaged table: LanceDB's IO error

    def index(job: Any, ctx: Any) -> None:
        ctx.upsert("notes", {"id": job.id})

    ran = spool.enqueue("note", {}, job_id="ran")
    later = spool.enqueue("note", {}, job_id="later", delay=600)
    report = Worker(spool, {"note": index}, projection=str(idx)).run_until_idle()
    assert report.deferred == 1
    job = spool.get(ran.id)
    assert job.state is JobState.RETRYABLE and job.attempts == 0 and job.last_error
    assert job.status == "retryable" and not job.scheduled
    assert spool.get(later.id).status == "scheduled"
    assert spool.stats().scheduled == 1


def test_a_schedule_refused_by_backpressure_fires_once_the_queue_drained(
        make_any_spool: Callable[..., Spool]) -> None:
    # Found in an async probe: on PostgreSQL the backlog was counted inside the scheduler's
    # transaction, seeing the tick's own row: with max_due=2 every tick was refused with
    # the queue empty ("1 ready jobs, still over half of the limit"), for good.
    import time

    from jobspool import Schedule, Scheduler

    spool = make_any_spool(max_due=2)
    spool.enqueue("x", job_id="x1")
    spool.enqueue("x", job_id="x2")
    t = int(time.time()) // 10 * 10 - 300
    scheduler = Scheduler([Schedule("a", every=10, catch_up="all")])
    assert scheduler.tick(spool, t + 1) == []  # refused: two due already
    for lease in spool.claim(limit=5):
        spool.complete(lease)
    (fired,) = scheduler.tick(spool, t + 12)
    assert fired.created == (f"sched.a.{t + 10}",)
    assert spool.stats().due == 1


def test_a_worker_on_a_read_only_spool_is_refused_at_once(
        make_any_spool: Callable[..., Spool]) -> None:
    # Found in an async probe: it was accepted, then crash-looped five times ("worker
    # loop failed ... restarting") and raised WorkerCrashed.
    make_any_spool()
    ro = make_any_spool(read_only=True)
    with pytest.raises(SpoolError, match=r"cannot run a worker: .* read-only"):
        Worker(ro, {"k": lambda job, ctx: None})


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0.0, -5.0, "10"])
def test_a_hand_made_lease_length_is_refused_before_anything_is_written(
        make_any_spool: Callable[..., Spool], seconds: Any) -> None:
    # Found in a regression probe: `Lease.seconds` (what a heartbeat extends by) went
    # unchecked: inf wrote a job file no reader takes, NaN an expiry that never passes.
    import dataclasses

    from jobspool.errors import InvalidJob

    spool = make_any_spool()
    spool.enqueue("k", {}, job_id="j")
    (lease,) = spool.claim()
    before = spool.get("j")
    with pytest.raises(InvalidJob, match="Lease.seconds"):
        spool.heartbeat(dataclasses.replace(lease, seconds=seconds))
    assert spool.get("j") == before
    assert spool.heartbeat(lease).expires_at >= lease.expires_at


def test_a_bulk_cancel_returns_its_jobs_in_id_order(make_any_spool: Callable[..., Spool]) -> None:
    """PostgreSQL returned them in claim order (by run_at), the file store by id."""
    spool = make_any_spool()
    spool.enqueue("k", job_id="j3")
    spool.enqueue("k", job_id="j1", delay=5)
    spool.enqueue("k", job_id="j2", delay=1)
    assert [j.id for j in spool.cancel_matching(kind="k")] == ["j1", "j2", "j3"]


def test_fsck_reports_the_highest_lease_held(make_any_spool: Callable[..., Spool]) -> None:
    """A settled job holds no lease: PostgreSQL counted the token its row keeps."""
    spool = make_any_spool()
    spool.enqueue_many("k", [1, 2])
    first, second = spool.claim(limit=2)
    spool.complete(second)
    assert spool.fsck().max_token == first.token
    spool.complete(first)
    assert spool.fsck().max_token == 0


def test_a_claim_dead_letters_an_expired_lease_out_of_attempts_on_both_stores(
        make_any_spool: Callable[..., Spool]) -> None:
    """PostgreSQL left it leased until its next sweep (a second later, or an empty claim):
    a script that kept getting work saw it leased, and it never finished."""
    spool = make_any_spool()
    spool.enqueue("a", 1, job_id="x0", max_attempts=1)
    (lease,) = spool.claim(lease_seconds=0.2)
    spool.enqueue("a", 2, job_id="x1")
    sleep_past(lease.expires_at)
    assert [x.job_id for x in spool.claim(limit=1)] == ["x1"]
    x0 = spool.get("x0")
    assert x0.state is JobState.DEAD_LETTER
    assert x0.last_error is not None and "attempts exhausted" in x0.last_error


def test_recovery_logs_each_job_it_dead_letters_and_its_counts(
        make_any_spool: Callable[..., Spool], caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL's `recover` logged nothing: a boot log never said jobs were dead-lettered."""
    import logging

    spool = make_any_spool(max_attempts=1)
    spool.enqueue("k", {}, job_id="last-try")
    (lease,) = spool.claim(lease_seconds=0.2)
    sleep_past(lease.expires_at)
    with caplog.at_level(logging.INFO, logger="jobspool"):
        report = spool.recover()
    assert report.dead_lettered == ("last-try",)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "last-try" in r.getMessage() and "dead-lettered" in r.getMessage()]
    assert len(warned) == 1
    assert any(r.levelno == logging.INFO and "recovery of" in r.getMessage()
               and "dead_lettered" in r.getMessage() for r in caplog.records)


def test_a_spool_restored_under_a_newer_projection_hands_out_tokens_above_its_rows(
        make_any_spool: Callable[..., Spool], tmp_path: Any) -> None:
    """An older backup restored (a file spool copied back, a dump restored into PostgreSQL)
    handed out again tokens that rows written after the backup hold: every new run's write
    with the default version lost to them, silently (a backup probe). Here the row comes
    from a write under token 5,000, above anything this spool handed out."""
    from jobspool.projection.handler import make_upsert
    from jobspool.projection.lance import LanceProjection, ProjectionStore

    proj = str(tmp_path / "proj")
    assert ProjectionStore(proj).apply(
        [make_upsert("old", "t", {"id": "k1", "text": "after the backup"}, None, 5000)]).ok
    spool = make_any_spool()
    spool.enqueue("note", {"text": "new"})

    def note(job: Any, ctx: Any) -> None:
        ctx.upsert("t", {"id": "k1", "text": job.payload["text"]})

    report = Worker(spool, {"note": note}, projection=proj, maintenance=False).run_until_idle()
    assert report.completed == 1
    assert LanceProjection(proj, "t").get("k1")["text"] == "new"  # type: ignore[index]
    assert spool.fence_value() > 5000
