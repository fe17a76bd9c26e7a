"""The worker's heartbeat keeps leases alive while handlers run longer than `lease_seconds`.

These use the real clock (the beat is a real timer): leases of 0.6 s, handlers
of about 2 s. Nothing here asserts a duration; the assertions are about what
is on disk and in the report.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import Context, Job, JobState, Spool, Worker
from tests.helpers_spool import job_files, read_raw
from tests.spools import make_spool

LEASE = 0.6
RUN = 2.0


@pytest.fixture
def live_spool(tmp_path: Path) -> Iterator[Spool]:
    s = make_spool(tmp_path / "spool", lease_seconds=LEASE)
    yield s
    s.close()


def _observe(spool: Spool, job: Job, seen: list[tuple[float, float]]) -> None:
    """Record (wall time, expires_at of the leased file as on disk)."""
    raw = read_raw(spool.root, "leased", job.id)
    seen.append((time.time(), float(raw["lease"]["expires_at"])))


def test_a_sync_handler_longer_than_its_lease_completes_without_losing_it(live_spool: Spool) -> None:
    job = live_spool.enqueue("long")
    seen: list[tuple[float, float]] = []

    def handler(j: Job, ctx: Context) -> str:
        assert j.lease is not None
        seen.append((time.time(), j.lease.expires_at))
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline:
            time.sleep(0.25)
            _observe(live_spool, j, seen)
        return "survived"

    report = Worker(live_spool, {"long": handler}).run_until_idle()
    assert report.lease_lost == 0
    assert (report.claimed, report.completed, report.retried) == (1, 1, 0)
    done = live_spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.result == "survived"
    assert done.attempts == 1  # never reclaimed as an expired lease
    first_expiry = seen[0][1]
    last_expiry = seen[-1][1]
    # The file's expiry moved forward by more than one lease length (and with
    # attempts == 1 the job was never reclaimed and re-leased meanwhile).
    assert last_expiry > first_expiry + LEASE
    assert all(b >= a for (_, a), (_, b) in itertools.pairwise(seen))
    # Surviving 2 s on 0.6 s leases takes at least three extensions.
    assert done.revision >= 1 + 1 + 3 + 1  # enqueue, claim, >= 3 beats, complete


def test_an_async_handler_longer_than_its_lease_completes_without_losing_it(
        live_spool: Spool) -> None:
    job = live_spool.enqueue("long")
    seen: list[tuple[float, float]] = []

    async def handler(j: Job, ctx: Context) -> str:
        assert j.lease is not None
        seen.append((time.time(), j.lease.expires_at))
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline:
            await anyio.sleep(0.25)
            _observe(live_spool, j, seen)
        return "survived"

    report = Worker(live_spool, {"long": handler}).run_until_idle()
    assert report.lease_lost == 0
    assert report.completed == 1
    done = live_spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.attempts == 1
    assert seen[-1][1] > seen[0][1] + LEASE


def test_quick_jobs_waiting_for_a_slow_batch_mate_keep_their_leases(live_spool: Spool) -> None:
    """A batch settles together: the quick jobs' leases must be beaten until then."""
    quick = [live_spool.enqueue("job", {"sleep": 0.0}).id for _ in range(3)]
    slow = live_spool.enqueue("job", {"sleep": RUN}).id

    def handler(j: Job, ctx: Context) -> float:
        time.sleep(j.payload["sleep"])
        return float(j.payload["sleep"])

    report = Worker(live_spool, {"job": handler}, concurrency=4, batch_size=10).run_until_idle()
    assert report.lease_lost == 0
    assert report.completed == 4
    for job_id in [*quick, slow]:
        done = live_spool.get(job_id)
        assert done.state is JobState.COMPLETED
        assert done.attempts == 1
    assert all(where == ["completed"] for where in job_files(live_spool.root).values())


def test_a_second_worker_cannot_steal_a_job_whose_handler_is_still_beating(
        live_spool: Spool) -> None:
    """While the first worker's handler runs past several lease lengths, a second spool
    claiming from the same directory finds nothing to take."""
    job = live_spool.enqueue("long")
    stolen: list[Any] = []

    def handler(j: Job, ctx: Context) -> str:
        other = make_spool(live_spool.root)
        try:
            deadline = time.monotonic() + RUN
            while time.monotonic() < deadline:
                time.sleep(0.2)
                stolen.extend(other.claim(limit=5))
        finally:
            other.close()
        return "mine"

    report = Worker(live_spool, {"long": handler}).run_until_idle()
    assert stolen == []
    assert report.completed == 1
    assert report.lease_lost == 0
    assert live_spool.get(job.id).result == "mine"


def test_the_worker_lease_seconds_overrides_the_spool_default(tmp_path: Path) -> None:
    spool = make_spool(tmp_path / "spool", lease_seconds=3600.0)
    try:
        job = spool.enqueue("long")
        leases: list[float] = []

        def handler(j: Job, ctx: Context) -> None:
            assert j.lease is not None
            leases.append(j.lease.expires_at - time.time())
            time.sleep(1.0)

        report = Worker(spool, {"long": handler}, lease_seconds=LEASE).run_until_idle()
        assert report.completed == 1
        assert report.lease_lost == 0
        assert leases[0] <= LEASE
        assert spool.get(job.id).attempts == 1
    finally:
        spool.close()

