"""Sync handlers without a time limit run on long-lived runners (queue/runners.py).

What a user can observe must be what the per-job path gave: every job once,
never more than `concurrency` handlers at once (shared with jobs that do have
a time limit), quick batch mates settled while a slow one still runs, a
sync handler returning an awaitable awaited, and the same on trio.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import Context, Job, JobState, Policy, Spool, Worker
from tests.spools import make_spool


class Gauge:
    """How many handlers run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def test_every_sync_job_runs_once_with_concurrency_handlers_at_once(spool: Spool) -> None:
    seen: list[str] = []
    gauge = Gauge()
    # The first three jobs only complete if three handlers really run at the same time.
    meet = threading.Barrier(3, timeout=20)

    def handler(job: Job, ctx: Context) -> int:
        with gauge:
            if job.payload < 3:
                meet.wait()
            else:
                time.sleep(0.001)
            seen.append(job.id)
        return int(job.payload) * 2

    jobs = spool.enqueue_many("plain", list(range(120)))
    report = Worker(spool, {"plain": handler}, concurrency=3, batch_size=20,
                    maintenance=False).run_until_idle()
    assert report.completed == 120 and report.dead_lettered == 0
    assert sorted(seen) == sorted(j.id for j in jobs)
    assert gauge.most == 3
    assert [spool.get(j.id).result for j in jobs[:5]] == [0, 2, 4, 6, 8]


def test_runners_parked_after_a_burst_all_run_the_next_one(tmp_path: Path) -> None:
    # Found by a probe of a change that woke one parked runner per claim and grew more only
    # while all ran handlers for 10 ms: the second burst ran on one thread, and handlers
    # that wait for each other (a barrier of `concurrency`) hung the run for good.
    n = 6
    spool = make_spool(tmp_path / "s")
    spool.enqueue_many("warm", [0] * n)
    spool.enqueue_many("meet", [0] * n, delay=1.0)  # claimed once the warm runners parked
    meet = threading.Barrier(n, timeout=20)
    report = Worker(spool, {"warm": lambda job, ctx: time.sleep(0.2),
                            "meet": lambda job, ctx: meet.wait()},
                    concurrency=n, maintenance=False).run_until_idle(wait_for_retries=10)
    assert report.completed == 2 * n and not meet.broken


def test_a_quick_kind_whose_handler_starts_to_block_still_fills_every_slot(
        tmp_path: Path) -> None:
    # Kept from an attempt (reverted) to run batches of quick kinds on one runner: four
    # handlers of a kind that was quick all run, in the same run, only if four run at once.
    n = 4
    spool = make_spool(tmp_path / "s")
    spool.enqueue_many("k", [{"quick": True}] * 300)
    spool.enqueue_many("k", [{"meet": True}] * (3 * n), delay=0.5)
    meet = threading.Barrier(n, timeout=20)

    def handler(job: Job, ctx: Context) -> None:
        if job.payload.get("meet"):
            meet.wait()

    report = Worker(spool, {"k": handler}, concurrency=n, batch_size=50,
                    maintenance=False).run_until_idle(wait_for_retries=10)
    assert report.completed == 300 + 3 * n and not meet.broken


def test_quick_jobs_keep_running_beside_a_time_limited_job_that_waits_for_them(
        tmp_path: Path) -> None:
    # Found by a probe of that attempt: once a kind was quick, its jobs stopped for as long
    # as a job on the per-job path (a time limit, or async) held a slot, and a limited job
    # waiting for them waited out its limit.
    spool = make_spool(tmp_path / "s")
    quick_done = threading.Event()
    seen = [0]

    def quick(job: Job, ctx: Context) -> None:
        seen[0] += 1
        if seen[0] >= 1200:
            quick_done.set()

    def waits(job: Job, ctx: Context) -> None:
        if not quick_done.wait(20):
            raise RuntimeError("the quick jobs never ran")

    worker = Worker(spool, {"q": quick, "t": waits}, concurrency=4, batch_size=50,
                    maintenance=False)
    spool.enqueue_many("q", [0] * 200)
    worker.run_until_idle()
    spool.enqueue("t", 0, timeout=30, max_attempts=1)
    spool.enqueue_many("q", [0] * 1000)
    report = worker.run_until_idle()
    assert report.completed == 1001 and report.dead_lettered == 0


def test_jobs_with_and_without_a_time_limit_share_the_concurrency_cap(spool: Spool) -> None:
    gauge = Gauge()

    def plain(job: Job, ctx: Context) -> None:
        with gauge:
            time.sleep(0.002)

    def limited(job: Job, ctx: Context) -> None:
        with gauge:
            time.sleep(0.002)

    spool.enqueue_many("plain", list(range(60)))
    spool.enqueue_many("limited", list(range(60)))
    report = Worker(spool, {"plain": plain, "limited": limited}, concurrency=2,
                    policies={"limited": Policy(timeout=30)}, batch_size=25,
                    maintenance=False).run_until_idle()
    assert report.completed == 120
    assert gauge.most <= 2


def test_a_limited_job_still_times_out_beside_unlimited_ones(spool: Spool) -> None:
    release = threading.Event()

    def slow(job: Job, ctx: Context) -> None:
        release.wait(30)

    def quick(job: Job, ctx: Context) -> str:
        return "ok"

    stuck = spool.enqueue("slow", None, max_attempts=1)
    quick_jobs = spool.enqueue_many("quick", list(range(30)))
    try:
        report = Worker(spool, {"slow": slow, "quick": quick}, concurrency=2,
                        policies={"slow": Policy(timeout=0.3)},
                        maintenance=False).run_until_idle()
    finally:
        release.set()
    assert report.completed == 30
    assert report.timed_out == 1
    assert spool.get(stuck.id).state is JobState.DEAD_LETTER
    assert all(spool.get(j.id).result == "ok" for j in quick_jobs)


def test_quick_batch_mates_settle_while_a_slow_sync_job_still_runs(spool: Spool) -> None:
    release = threading.Event()
    quick_done = threading.Event()
    slow_job: list[str] = []

    def handler(job: Job, ctx: Context) -> None:
        if job.payload == "slow":
            slow_job.append(job.id)
            # Completed batch mates are on disk before this one returns.
            quick_done.wait(20)
            release.set()

    def watch() -> None:
        deadline = time.monotonic() + 20
        with Spool(spool.root, durable=False) as peer:
            while time.monotonic() < deadline:
                if peer.stats().counts.get("completed", 0) >= 10:
                    quick_done.set()
                    return
                time.sleep(0.01)

    spool.enqueue("mixed", "slow")
    spool.enqueue_many("mixed", ["quick"] * 10)
    watcher = threading.Thread(target=watch)
    watcher.start()
    report = Worker(spool, {"mixed": handler}, concurrency=2, batch_size=20,
                    maintenance=False).run_until_idle()
    watcher.join()
    assert release.is_set(), "the quick jobs were not settled while the slow one ran"
    assert report.completed == 11


def test_a_sync_handler_returning_an_awaitable_has_it_awaited(spool: Spool) -> None:
    async def later(n: int) -> int:
        await anyio.sleep(0)
        return n + 1

    def handler(job: Job, ctx: Context) -> Any:
        return later(job.payload)

    jobs = spool.enqueue_many("aw", [1, 2, 3])
    report = Worker(spool, {"aw": handler}, maintenance=False).run_until_idle()
    assert report.completed == 3
    assert [spool.get(j.id).result for j in jobs] == [2, 3, 4]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_handlers_run_under_either_event_loop(spool: Spool, backend: str) -> None:
    def handler(job: Job, ctx: Context) -> int:
        if job.payload == 7:
            raise ValueError("seven")
        return int(job.payload)

    spool.enqueue_many("n", list(range(40)), max_attempts=1)
    worker = Worker(spool, {"n": handler}, concurrency=4, maintenance=False)
    report = anyio.run(worker.arun_until_idle, backend=backend)
    assert (report.completed, report.dead_lettered) == (39, 1)
    (dead,) = spool.jobs(state=JobState.DEAD_LETTER)
    assert "seven" in (dead.last_error or "")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_async_handlers_stored_traceback_is_its_own_error_alone(
        spool: Spool, backend: str) -> None:
    # Found by the async probe: on trio every stored traceback began with "RuntimeError:
    # no running event loop" (jobspool's own look for an asyncio loop, the context of the
    # handler's exception), and "During handling of the above exception".
    async def handler(job: Job, ctx: Context) -> None:
        raise ValueError("boom boom")

    job = spool.enqueue("a", {}, max_attempts=1)
    worker = Worker(spool, {"a": handler}, maintenance=False)
    report = anyio.run(worker.arun_until_idle, backend=backend)
    assert report.dead_lettered == 1
    tb = spool.get(job.id).traceback or ""
    assert "ValueError: boom boom" in tb
    assert "RuntimeError" not in tb and "During handling" not in tb


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("jobs", "batch"), [(1, 1), (10, 10)])
def test_a_refused_settle_is_given_back_and_the_run_still_drains(
        make_any_spool: Callable[..., Spool], jobs: int, batch: int) -> None:
    # On PostgreSQL the group settles beside the loop; while it is given back and the
    # supervisor backs off, the loop has nothing in hand. It once spun there without
    # yielding, so the settle task never ran again and run_until_idle never returned.
    from jobspool.errors import WriteFailed

    spool = make_any_spool()

    real = spool.complete_many
    refused: list[int] = []

    def complete_many(items: Any) -> Any:
        if not refused:
            refused.append(len(items))
            return [WriteFailed("injected: the disk refused") for _ in items]
        return real(items)

    spool.complete_many = complete_many  # type: ignore[method-assign]
    made = spool.enqueue_many("k", list(range(jobs)))
    report = Worker(spool, {"k": lambda job, ctx: job.payload}, batch_size=batch,
                    maintenance=False).run_until_idle()
    assert refused == [batch]
    assert report.completed == jobs and report.crashes == 1
    assert all(spool.get(j.id).state is JobState.COMPLETED for j in made)


@pytest.mark.parametrize("style", ["sync", "async"])
def test_a_limited_job_claimed_behind_a_backlog_is_not_starved_by_the_runners(
        spool: Spool, style: str) -> None:
    # One handler slot. A runner drains the quick jobs while claims keep refilling its
    # queue; a job with a time limit claimed meanwhile waits for the slot. It must get it
    # at the runner's next job boundary, as it would have under the per-job path's fair
    # slot queue, not once the whole backlog is done. Sync runners (threads) and async
    # ones (tasks on the loop) alike.
    order: list[str] = []

    def quick(job: Job, ctx: Context) -> None:
        order.append("q")
        time.sleep(0.005)  # slow enough that a group settles, and claims refill, mid-queue

    async def quick_async(job: Job, ctx: Context) -> None:
        order.append("q")
        await anyio.sleep(0.002)

    def limited(job: Job, ctx: Context) -> None:
        order.append("L")

    spool.enqueue_many("quick", list(range(100)))
    spool.enqueue("limited", None)
    spool.enqueue_many("quick", list(range(100)))
    handlers = {"quick": quick if style == "sync" else quick_async, "limited": limited}
    report = Worker(spool, handlers, concurrency=1, batch_size=20,
                    policies={"limited": Policy(timeout=30)},
                    maintenance=False).run_until_idle()
    assert report.completed == 201
    # Claimed with a batch that ends near job 101 (batches of at most 20), it runs within
    # a batch or two of that, not after all 200 quick jobs.
    assert order.index("L") < 150, order.index("L")


# ---------------------------------------------------------------- async runners
# Async handlers without a time limit run back to back in long-lived tasks
# (queue/async_runners.py), with what the per-job path gave.


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_every_async_job_runs_once_with_concurrency_handlers_at_once(
        spool: Spool, backend: str) -> None:
    seen: list[str] = []
    gauge = Gauge()
    arrived = [0]
    all_three: list[anyio.Event] = []

    async def handler(job: Job, ctx: Context) -> int:
        with gauge:
            if job.payload < 3:  # completes only if three handlers really run at once
                if not all_three:
                    all_three.append(anyio.Event())
                arrived[0] += 1
                if arrived[0] == 3:
                    all_three[0].set()
                with anyio.fail_after(20):
                    await all_three[0].wait()
            else:
                await anyio.sleep(0)
            seen.append(job.id)
        return int(job.payload) * 2

    jobs = spool.enqueue_many("plain", list(range(120)))
    worker = Worker(spool, {"plain": handler}, concurrency=3, batch_size=20,
                    maintenance=False)
    report = anyio.run(worker.arun_until_idle, backend=backend)
    assert report.completed == 120 and report.dead_lettered == 0
    assert sorted(seen) == sorted(j.id for j in jobs)
    assert gauge.most == 3
    assert [spool.get(j.id).result for j in jobs[:5]] == [0, 2, 4, 6, 8]


def test_async_jobs_with_and_without_a_time_limit_share_the_concurrency_cap(
        spool: Spool) -> None:
    gauge = Gauge()

    async def handler(job: Job, ctx: Context) -> None:
        with gauge:
            await anyio.sleep(0.002)

    spool.enqueue_many("free", list(range(40)))
    spool.enqueue_many("limited", list(range(40)))
    report = Worker(spool, {"free": handler, "limited": handler}, concurrency=2,
                    batch_size=10, policies={"limited": Policy(timeout=30)},
                    maintenance=False).run_until_idle()
    assert report.completed == 80
    assert gauge.most == 2


def test_an_async_runner_cut_off_past_the_grace_interrupts_its_job_and_releases_the_rest(
        spool: Spool) -> None:
    started = threading.Event()

    async def stuck(job: Job, ctx: Context) -> None:
        started.set()
        await anyio.sleep(30)

    running = spool.enqueue("stuck", "first")
    waiting = [spool.enqueue("stuck", n) for n in range(3)]
    worker = Worker(spool, {"stuck": stuck}, concurrency=1, grace_seconds=0.2,
                    maintenance=False)
    threading.Thread(target=lambda: (started.wait(20), worker.stop()), daemon=True).start()
    report = worker.run_until_idle()
    assert (report.interrupted, report.released, report.completed) == (1, 3, 0)
    cut = spool.get(running.id)
    assert (cut.state, cut.attempts) == (JobState.READY, 1)
    assert "interrupted" in (cut.last_error or "")
    for job in waiting:  # never started: back uncounted
        got = spool.get(job.id)
        assert (got.state, got.attempts) == (JobState.READY, 0)


def test_sync_and_async_runners_share_the_concurrency_cap(spool: Spool) -> None:
    gauge = Gauge()

    def sync_handler(job: Job, ctx: Context) -> None:
        with gauge:
            time.sleep(0.001)

    async def async_handler(job: Job, ctx: Context) -> None:
        with gauge:
            await anyio.sleep(0.001)

    for _ in range(6):  # interleaved kinds: both runner kinds hold and hand over slots
        spool.enqueue_many("s", list(range(10)))
        spool.enqueue_many("a", list(range(10)))
    report = Worker(spool, {"s": sync_handler, "a": async_handler}, concurrency=2,
                    batch_size=15, maintenance=False).run_until_idle()
    assert report.completed == 120 and report.dead_lettered == 0
    assert gauge.most <= 2


def test_only_a_thread_inside_a_sync_handler_counts_as_a_running_handler(spool: Spool) -> None:
    # The CLI exits past handlers cut off by the grace period (their threads cannot be
    # stopped), and only past those: it once counted every live non-daemon thread, and a
    # runner left parked by a finished run made an in-process `run-until-idle` call
    # os._exit(0) under its caller.
    from jobspool.queue.runs import handler_threads_running

    spool.enqueue_many("quick", list(range(30)))
    Worker(spool, {"quick": lambda job, ctx: None}, concurrency=3,
           maintenance=False).run_until_idle()
    assert not handler_threads_running()

    started, release = threading.Event(), threading.Event()

    def blocked(job: Job, ctx: Context) -> None:
        started.set()
        release.wait(20)

    spool.enqueue("blocked", None)
    runner = threading.Thread(target=Worker(spool, {"blocked": blocked},
                                            maintenance=False).run_until_idle)
    runner.start()
    try:
        assert started.wait(20)
        assert handler_threads_running()
    finally:
        release.set()
        runner.join(20)
    assert not handler_threads_running()


def test_the_cli_does_not_exit_past_a_live_thread_that_runs_no_handler() -> None:
    # Before the fix any live non-daemon thread (a runner parked by a finished run) made
    # the CLI call os._exit(0) here, under its caller: this test process would vanish with
    # status 0 (which .ci/run now refuses, tests/conftest.py). It must return instead.
    from jobspool.cli.commands import _exit_past_abandoned_handlers

    idle = threading.Event()
    bystander = threading.Thread(target=idle.wait, args=(20,), daemon=False)
    bystander.start()
    try:
        _exit_past_abandoned_handlers()
        assert bystander.is_alive()  # reached only because the call returned
    finally:
        idle.set()
        bystander.join(20)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_async_job_claimed_while_every_runner_waits_in_a_handler_runs_beside_them(
        spool: Spool, backend: str) -> None:
    """Runners multiply as handlers wait (`AsyncRunners.spread`): a job claimed later, while
    the only runner left waits in a handler, gets a runner of its own. Here that job is the
    one the waiting handler waits for."""
    released: list[anyio.Event] = []

    async def handler(job: Job, ctx: Context) -> str:
        if not released:
            released.append(anyio.Event())
        if job.payload == "waits":
            with anyio.fail_after(10):
                await released[0].wait()
        elif job.payload == "releases":
            released[0].set()
        return str(job.payload)

    jobs = [spool.enqueue("plain", p) for p in ("waits", "quick", "releases")]
    worker = Worker(spool, {"plain": handler}, concurrency=2, batch_size=2,
                    maintenance=False)
    report = anyio.run(worker.arun_until_idle, backend=backend)
    assert report.completed == 3 and report.retried == 0 and report.dead_lettered == 0
    assert [spool.get(j.id).result for j in jobs] == ["waits", "quick", "releases"]
