"""A bulk cancel or requeue while workers in other processes claim and finish the same
jobs, both stores: what it reports is exactly what it moved, each job once, and a job a
worker claimed during it is canceled too (its holder is fenced). On PostgreSQL a job
claimed between the listing and its turn kept running after "cancel every job of this
kind", and jobs workers completed meanwhile were reported canceled (a probe: 5,982
reported, 900 canceled)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from jobspool import JobState, Spool
from tests.spools import make_spool
from tests.subproc import cli_env

_WORKER = """
import sys, time
from jobspool import Spool, Worker
def work(job, ctx):
    time.sleep(0.002)
    return {"done": job.payload["n"]}
with Spool(sys.argv[1]) as spool:
    Worker(spool, handlers={"work": work}, concurrency=2, batch_size=10,
           lease_seconds=30).run_until_idle()
"""


def _start_workers(root: str, n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", _WORKER, root], env=cli_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(n)]


def test_a_bulk_cancel_reports_exactly_what_it_canceled_while_workers_run(
        store_root: str | Path) -> None:
    root = str(store_root)
    with make_spool(root, keep_terminal=10_000) as spool:  # retention must not prune them
        spool.enqueue_many("work", [{"n": i} for i in range(1500)])
    workers = _start_workers(root, 2)
    try:
        with make_spool(root) as spool:
            deadline = time.monotonic() + 60
            while spool.stats().counts["completed"] < 100 and time.monotonic() < deadline:
                time.sleep(0.02)
            reported = spool.cancel_matching(kind="work")
    finally:
        for w in workers:
            _, err = w.communicate(timeout=120)
            assert w.returncode == 0, err.decode(errors="replace")
    ids = [job.id for job in reported]
    assert len(ids) == len(set(ids))
    assert all(job.state is JobState.CANCELED for job in reported)
    with Spool(root) as spool:
        canceled = {j.id for j in spool.jobs(state=JobState.CANCELED)}
        completed = list(spool.jobs(state=JobState.COMPLETED))
        assert canceled - set(ids) == set(), "canceled, not reported"
        assert set(ids) - canceled == set(), "reported, not canceled"
        assert {j.id for j in completed}.isdisjoint(canceled)
        assert len(canceled) + len(completed) == 1500
        assert all(j.result == {"done": j.payload["n"]} for j in completed)
        counts = spool.stats().counts
        assert counts["ready"] == counts["leased"] == counts["retryable"] == 0


def _between_listing_and_turn(spool, act) -> None:  # type: ignore[no-untyped-def]
    """Run `act` once, between a PostgreSQL bulk action's listing and its first job."""
    original, done = spool.mutate_job, []

    def hooked(job_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not done:
            done.append(True)
            act()
        return original(job_id, *args, **kwargs)

    spool.mutate_job = hooked


def test_a_job_claimed_after_the_listing_is_canceled_and_its_holder_fenced(pg_url: str) -> None:
    with make_spool(pg_url) as spool, make_spool(pg_url) as worker:
        spool.enqueue("sk", {}, job_id="sk-a")
        leases: list = []  # type: ignore[type-arg]
        _between_listing_and_turn(spool, lambda: leases.extend(worker.claim(kinds="sk")))
        moved = spool.cancel_matching(kind="sk")
        assert [(j.id, j.state) for j in moved] == [("sk-a", JobState.CANCELED)]
        assert spool.get("sk-a").state is JobState.CANCELED  # type: ignore[union-attr]
        assert [lease.job_id for lease in leases] == ["sk-a"]
        assert worker.heartbeat_many(leases)[0].__class__.__name__ == "LeaseLost"


def test_a_job_finished_after_the_listing_is_neither_moved_nor_reported(pg_url: str) -> None:
    with make_spool(pg_url) as spool, make_spool(pg_url) as worker:
        spool.enqueue("rk", {}, job_id="rk-a")
        [lease] = worker.claim(kinds="rk")
        _between_listing_and_turn(spool, lambda: worker.complete(lease, {"ok": 1}))
        assert spool.cancel_matching(kind="rk") == []
        assert spool.get("rk-a").state is JobState.COMPLETED  # type: ignore[union-attr]


def test_a_dead_letter_requeued_and_run_by_others_meanwhile_is_not_reported(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool, make_spool(pg_url) as worker:
        spool.enqueue("rq", {}, job_id="rq-a")
        [dead] = worker.claim(kinds="rq")
        worker.fail(dead, "broken", retryable=False)

        def run_it_again() -> None:  # another operator, then a worker
            worker.requeue("rq-a")
            [again] = worker.claim(kinds="rq")
            worker.complete(again, None)

        _between_listing_and_turn(spool, run_it_again)
        assert spool.requeue_all() == []
        assert spool.get("rq-a").state is JobState.COMPLETED  # type: ignore[union-attr]
