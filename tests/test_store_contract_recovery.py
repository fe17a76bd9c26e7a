"""The store contract, continued (tests/store_params.py runs each test on both stores):
revisions, batched settles, recovery's replay of prepared jobs (DESIGN §6), fsck on a
healthy store, and the projection fed through `ctx` (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobspool import Context, Job, JobState, LanceProjection, Spool, Worker
from jobspool.errors import LeaseLost

MakeSpool = Callable[..., Spool]


def test_every_write_increments_the_revision_by_one(any_spool: Spool) -> None:
    seen = [any_spool.enqueue("note", job_id="j").revision]
    leases: list[Any] = []

    def claim() -> Job:
        leases[:] = any_spool.claim()
        return leases[0].job

    steps: list[Callable[[], Job]] = [
        claim, lambda: any_spool.heartbeat(leases[0]).job,
        lambda: any_spool.fail(leases[0], "x", delay=0.0), claim,
        lambda: any_spool.release(leases[0]), claim,
        lambda: any_spool.fail(leases[0], "final", retryable=False),
        lambda: any_spool.requeue("j"), lambda: any_spool.cancel("j"),
        lambda: any_spool.enqueue("note", job_id="j"), claim,
        lambda: any_spool.complete(leases[0]),
    ]
    for step in steps:
        job = step()
        assert job.revision == seen[-1] + 1, (job.state, job.revision, seen)
        assert any_spool.get("j").revision == job.revision
        seen.append(job.revision)


def test_complete_many_and_fail_many_settle_each_and_report_lost_leases(any_spool: Spool) -> None:
    for job_id in ("a", "b", "c", "d"):
        any_spool.enqueue("note", job_id=job_id)
    leases = {x.job_id: x for x in any_spool.claim(limit=4)}
    any_spool.cancel("b")
    done = any_spool.complete_many([(leases["a"], 1), (leases["b"], 2)])
    assert isinstance(done[0], Job) and (done[0].state, done[0].result) == (JobState.COMPLETED, 1)
    assert isinstance(done[1], LeaseLost)
    failed = any_spool.fail_many([(leases["c"], "again", True, 0.0),
                                  (leases["d"], "never", False, None),
                                  (leases["b"], "late", True, None)])
    assert [getattr(x, "state", None) for x in failed[:2]] == [JobState.RETRYABLE,
                                                               JobState.DEAD_LETTER]
    assert isinstance(failed[2], LeaseLost)
    assert [str(any_spool.get(i).state) for i in "abcd"] == ["completed", "canceled", "retryable",
                                                             "dead_letter"]


def test_recover_replays_prepared_jobs_past_the_grace_period(make_any_spool: MakeSpool) -> None:
    spool = make_any_spool(prepare_grace_seconds=0.0)
    for job_id in ("yes", "no", "maybe", "other"):
        spool.prepare("outbox" if job_id != "other" else "other", job_id=job_id)
    verdicts = {"yes": "committed", "no": "aborted", "maybe": "unknown"}
    report = spool.recover(replay={"outbox": lambda job: verdicts[job.id]})
    assert (report.replayed_committed, report.replayed_aborted) == (("yes",), ("no",))
    assert report.replay_unknown == ("maybe",) and report.prepared_pending == ("other",)
    states = {i: (str(spool.get(i).state), spool.get(i).attempts) for i in verdicts}
    assert states == {"yes": ("ready", 0), "no": ("canceled", 0), "maybe": ("prepared", 1)}
    assert spool.get("other").state is JobState.PREPARED
    assert [x.job_id for x in spool.claim(limit=5)] == ["yes"]


def test_fsck_finds_a_busy_store_consistent(any_spool: Spool) -> None:
    any_spool.enqueue_many("note", list(range(5)))
    any_spool.prepare("note", job_id="p")
    leases = any_spool.claim(limit=3)
    any_spool.complete(leases[0])
    any_spool.fail(leases[1], "x", retryable=False)
    report = any_spool.fsck()
    assert report.ok, report.problems


def test_a_worker_projects_through_ctx_with_fencing_on_either_store(
        any_spool: Spool, tmp_path: Path) -> None:
    index = str(tmp_path / "index")

    def handler(job: Job, ctx: Context) -> int:
        ctx.heartbeat()
        with ctx.fenced():  # the lease is checked and held across the block
            pass
        ctx.upsert("notes", [{"id": job.id, "text": job.payload["text"]}])
        if job.payload.get("drop"):
            ctx.delete("notes", [job.payload["drop"]])
        return ctx.token

    any_spool.enqueue("note", {"text": "first"}, job_id="n1")
    any_spool.enqueue("note", {"text": "second"}, job_id="n2")
    report = Worker(any_spool, {"note": handler}, projection=index).run_until_idle()
    assert (report.completed, report.projected_rows) == (2, 2)
    any_spool.enqueue("note", {"text": "third", "drop": "n1"}, job_id="n3")
    Worker(any_spool, {"note": handler}, projection=index).run_until_idle()
    table = LanceProjection(index, "notes")
    assert table.get("n1") is None  # deleted: a tombstone readers never see
    row = table.get("n2")
    assert row is not None and row["text"] == "second"
    assert row["fence"] == any_spool.get("n2").result  # written under the run's token


@pytest.mark.parametrize("state", ["completed", "dead_letter", "canceled"])
def test_requeue_all_and_wait_see_terminal_states_alike(any_spool: Spool, state: str) -> None:
    any_spool.enqueue("note", job_id="j")
    if state == "canceled":
        any_spool.cancel("j")
    else:
        (lease,) = any_spool.claim()
        if state == "completed":
            any_spool.complete(lease, "r")
        else:
            any_spool.fail(lease, "x", retryable=False)
    assert str(any_spool.wait("j", timeout=5).state) == state
    requeued = any_spool.requeue_all(state) if state != "completed" else []
    assert [j.id for j in requeued] == ([] if state == "completed" else ["j"])
