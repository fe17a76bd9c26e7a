"""A Worker on PostgreSQL claims without reading the leased rows for expired ones while its
claims come back full (`take_over=False`), taking them over at most a second apart: that
read was a quarter of a claim's server time with 400 leases in flight. What it must not
change: an expired lease is still taken over, with its attempt and rescue counted, and
nothing is lost."""

from __future__ import annotations

import time

from jobspool import JobState, Worker
from tests.spools import make_spool


def _expired_lease(spool, job_id: str) -> None:  # type: ignore[no-untyped-def]
    spool.enqueue("k", {"n": -1}, job_id=job_id, priority=-5)
    [lease] = spool.claim(kinds="k", owner="dead", lease_seconds=0.05)
    assert lease.job_id == job_id
    time.sleep(0.1)


def test_a_claim_without_take_over_leaves_an_expired_lease_and_a_claim_with_takes_it(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        _expired_lease(spool, "lapsed")
        spool.enqueue("k", {"n": 1}, job_id="due")
        [first] = spool.claim(kinds="k", take_over=False)
        assert first.job_id == "due"
        assert spool.get("lapsed").state is JobState.LEASED
        assert spool.get("lapsed").lease is not None
        assert spool.get("lapsed").lease.owner == "dead"  # type: ignore[union-attr]
        [second] = spool.claim(kinds="k")  # the default takes over, as the file spool does
        assert second.job_id == "lapsed"
        assert (second.job.attempts, second.job.rescues) == (2, 1)
        assert second.token > first.token


def test_a_busy_worker_still_takes_over_an_expired_lease(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        _expired_lease(spool, "lapsed")
        spool.enqueue_many("k", [{"n": i} for i in range(300)])
        seen: list[int] = []
        worker = Worker(spool, handlers={"k": lambda job, ctx: seen.append(job.payload["n"])},
                        batch_size=20)
        report = worker.run_until_idle()
        assert report.completed == 301
        assert sorted(seen) == list(range(-1, 300))
        assert spool.get("lapsed").state is JobState.COMPLETED
        assert spool.get("lapsed").rescues == 1
