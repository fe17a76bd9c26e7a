"""A worker starts the jobs of a batch in claim order (priority, then run_at, then id)
whichever path runs them: sync handlers on runner threads, async ones on runner tasks,
time-limited ones each in a run of its own (tests/store_params.py: both stores).

Found by a probe: with sync and async handlers in one batch and one slot, all three
priority-10 async jobs ran before two priority -10 sync ones; and every time-limited job of
a batch ran before its other jobs, whatever their priority."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from jobspool import Context, Job, Policy, Spool, Worker


def _handlers(started: list[str]) -> dict[str, object]:
    lock = threading.Lock()

    def sync_handler(job: Job, ctx: Context) -> None:
        with lock:
            started.append(job.id)
        time.sleep(0.002)

    async def async_handler(job: Job, ctx: Context) -> None:
        with lock:
            started.append(job.id)
        await asyncio.sleep(0.002)

    return {"s": sync_handler, "a": async_handler, "ts": sync_handler, "ta": async_handler}


def _claim_order(spool: Spool, ids: list[str]) -> list[str]:
    jobs = [spool.get(i) for i in ids]
    return [j.id for j in sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id))]


def test_sync_and_async_jobs_of_one_batch_start_by_priority(any_spool: Spool) -> None:
    started: list[str] = []
    ids = [any_spool.enqueue("s", job_id=f"urgent-sync-{i}", priority=-10).id for i in range(3)]
    ids += [any_spool.enqueue("a", job_id=f"low-async-{i}", priority=10).id for i in range(3)]
    ids += [any_spool.enqueue("a", job_id=f"mid-async-{i}", priority=0).id for i in range(3)]
    ids += [any_spool.enqueue("s", job_id=f"mid-sync-{i}", priority=1).id for i in range(3)]
    report = Worker(any_spool, _handlers(started), concurrency=1).run_until_idle()
    assert report.completed == len(ids)
    assert started == _claim_order(any_spool, ids)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [50, 5])
def test_every_path_starts_its_jobs_in_claim_order(any_spool: Spool, seed: int,
                                                   batch_size: int) -> None:
    rng = random.Random(seed)
    ids = []
    for i in range(40):
        kind = rng.choice(["s", "a", "ts", "ta"])
        ids.append(any_spool.enqueue(kind, job_id=f"j{i:03d}-{kind}",
                                     priority=rng.randint(-3, 3)).id)
    started: list[str] = []
    worker = Worker(any_spool, _handlers(started), concurrency=1, batch_size=batch_size,
                    policies={"ts": Policy(timeout=30), "ta": Policy(timeout=30)})
    report = worker.run_until_idle()
    assert report.completed == len(ids)
    # Every claim takes the next jobs in claim order (all were enqueued before the run), and
    # the jobs in hand start in claim order: the whole run starts in claim order.
    assert started == _claim_order(any_spool, ids)


def test_a_parked_sync_runner_waits_for_an_earlier_async_job_of_its_claim(
        any_spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync runner parked with its slot is woken on its own thread as a claim queues
    sync jobs; the async runner for the same claim's earlier jobs waits for its slot from
    its first step, a loop turn later. The loop held up for a moment after the claim (a
    busy loop: found as a CI flake) let the parked runner start its later sync job first."""
    from jobspool.queue import async_runners

    queue_async = async_runners.AsyncRunners.submit

    def queue_then_hold_the_loop(self: async_runners.AsyncRunners, tg: object,
                                 ctxs: list[Context]) -> None:
        queue_async(self, tg, ctxs)  # type: ignore[arg-type]
        time.sleep(0.05)

    monkeypatch.setattr(async_runners.AsyncRunners, "submit", queue_then_hold_the_loop)
    started: list[str] = []
    handlers = _handlers(started)
    plain_sync = handlers["s"]

    def first(job: Job, ctx: Context) -> None:
        # Both visible before this job ends: the next claim takes them together, while
        # the runner that ran this one is parked with the only slot.
        any_spool.enqueue("a", job_id="async-first", priority=-1)
        any_spool.enqueue("s", job_id="sync-second", priority=0)
        plain_sync(job, ctx)  # type: ignore[operator]

    handlers["first"] = first
    any_spool.enqueue("first", job_id="opener")
    report = Worker(any_spool, handlers, concurrency=1).run_until_idle()
    assert report.completed == 3
    assert started == ["opener", "async-first", "sync-second"]
