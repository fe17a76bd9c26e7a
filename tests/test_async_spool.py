"""`AsyncSpool` (DESIGN §9): the producer API as coroutines, on asyncio and trio alike."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import AsyncSpool, Worker
from jobspool.errors import DuplicateJob, InvalidJob, JobFailed, JobNotFound, WaitTimeout
from tests.spools import make_spool

BACKENDS = ["asyncio", "trio"]


def _double(job: Any, ctx: Any) -> int:
    return int(job.payload["n"]) * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_fifty_tasks_enqueue_a_thousand_jobs_concurrently_and_await_every_result(
        tmp_path: Path, backend: str) -> None:
    results: dict[str, int] = {}
    numbers: dict[str, int] = {}

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool", durable=False) as spool:

            async def producer(task: int) -> None:
                for i in range(20):
                    n = task * 20 + i
                    job = await spool.enqueue("double", {"n": n})
                    numbers[job.id] = n

            async with anyio.create_task_group() as tg:
                for task in range(50):
                    tg.start_soon(producer, task)
            assert len(numbers) == 1000
            assert (await spool.stats()).ready == 1000

            async def waiter(job_id: str) -> None:
                results[job_id] = await spool.result(job_id, timeout=120)

            worker = Worker(spool.spool, {"double": _double}, concurrency=8, maintenance=False)
            async with anyio.create_task_group() as tg:
                for job_id in numbers:
                    tg.start_soon(waiter, job_id)
                report = await worker.arun_until_idle()
            assert report.completed == 1000

    anyio.run(main, backend=backend)
    assert results == {job_id: n * 2 for job_id, n in numbers.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_prepare_commit_abort_cancel_requeue_get_and_stats_as_coroutines(
        tmp_path: Path, backend: str) -> None:
    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool", durable=False) as spool:
            reservation = await spool.prepare("note", {"a": 1}, job_id="p1")
            assert (await spool.get("p1")).state.value == "prepared"
            assert (await spool.commit(reservation)).state.value == "ready"
            other = await spool.prepare("note", job_id="p2")
            canceled = await spool.abort(other)
            assert canceled is not None and canceled.state.value == "canceled"
            assert (await spool.requeue("p2")).state.value == "ready"
            assert (await spool.cancel("p1")).state.value == "canceled"
            many = await spool.enqueue_many("note", [1, 2, 3])
            assert [j.payload for j in many] == [1, 2, 3]
            result = await spool.enqueue_result("note", 9, job_id="p2")
            assert (result.created, result.job.payload) == (False, None)
            with pytest.raises(DuplicateJob):
                await spool.enqueue("note", 9, job_id="p2", on_conflict="error")
            stats = await spool.stats()
            assert (stats.ready, stats.canceled) == (4, 1)
            assert [j.id for j in await spool.jobs(state="canceled")] == ["p1"]
            with pytest.raises(JobNotFound):
                await spool.get("nope")
            with pytest.raises(InvalidJob, match="nan"):
                await spool.enqueue("note", {"x": float("nan")})

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_times_out_and_result_reports_a_job_that_did_not_complete(
        tmp_path: Path, backend: str) -> None:
    async def main() -> None:
        with make_spool(tmp_path / "spool") as sync_spool:
            spool = AsyncSpool(sync_spool)
            job = await spool.enqueue("note", job_id="w1")
            with pytest.raises(WaitTimeout):
                await spool.wait(job.id, timeout=0.05)
            (lease,) = sync_spool.claim()
            sync_spool.fail(lease, "bad input", retryable=False)
            assert (await spool.wait(job.id, timeout=5)).state.value == "dead_letter"
            with pytest.raises(JobFailed, match="dead_letter: bad input") as info:
                await spool.result(job.id, timeout=5)
            assert info.value.job_id == "w1"
            spool.close()  # a wrapped spool stays open: its owner closes it
            assert sync_spool.get("w1").state.value == "dead_letter"

    anyio.run(main, backend=backend)


def test_a_wrapped_spool_takes_no_options(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool, \
            pytest.raises(TypeError, match="no options"):
        AsyncSpool(spool, durable=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_enqueue_many_refuses_a_string_as_spool_does(tmp_path: Path, backend: str) -> None:
    """The async form listed its payloads before the Spool's guard saw them: "abc" made
    three jobs, one per character; a dict one per key."""
    from jobspool.errors import InvalidType

    async def main() -> None:
        async with AsyncSpool(tmp_path / "s") as spool:
            for bad in ("abc", {"x": 1}, b"ab"):
                with pytest.raises(InvalidType, match="payloads must be a list"):
                    await spool.enqueue_many("k", bad)  # type: ignore[arg-type]
                with pytest.raises(InvalidType):
                    await spool.enqueue_many_results("k", bad)  # type: ignore[arg-type]
            assert (await spool.stats()).total == 0

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_cancelled_while_its_thread_runs_finishes_then_raises_the_cancellation(
        tmp_path: Path, backend: str) -> None:
    """The operation completes (no half-enqueued job), and the cancellation is raised after
    it, as documented: the caller's scope sees it (it returned as if nothing happened)."""
    async def main() -> None:
        async with AsyncSpool(tmp_path / "s") as spool:
            with _lock_held_elsewhere(spool) as release:
                with anyio.move_on_after(0.1) as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(anyio.to_thread.run_sync, lambda: (
                            __import__("time").sleep(0.4), release.set()))
                        await spool.enqueue("k", job_id="e2")
            assert scope.cancelled_caught
            assert (await spool.get("e2")).state.value == "ready"  # done, not half-done

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("cancel", ["task.cancel", "wait_for"])
def test_an_asyncio_cancellation_also_waits_for_the_operation(tmp_path: Path,
                                                               cancel: str) -> None:
    """anyio shields the thread's call from its own cancel scopes, not from asyncio's
    `task.cancel()` / `wait_for`: `CancelledError` came at once, the enqueue landed later
    (a server cancelling requests at shutdown told 100 clients 'failed', 40 jobs landed)."""
    import asyncio
    import os
    import threading

    async def main() -> None:
        async with AsyncSpool(tmp_path / "s") as spool:
            with _lock_held_elsewhere(spool) as release:  # another process's claim, say
                threading.Timer(0.4, release.set).start()
                call = spool.enqueue("email", {"to": "a"}, job_id="order-1")
                with pytest.raises((asyncio.CancelledError, TimeoutError)):  # wait_for
                    if cancel == "wait_for":
                        await asyncio.wait_for(call, 0.05)
                    else:
                        task = asyncio.ensure_future(call)
                        await asyncio.sleep(0.05)
                        task.cancel()
                        await task
                # raised only once the operation was done: the caller can trust what it sees
                assert os.listdir(tmp_path / "s" / "ready") == ["order-1.json"]

    asyncio.run(main())


def test_reads_are_not_starved_by_enqueues_queued_for_the_lock(tmp_path: Path) -> None:
    """anyio's 40 default threads all taken by enqueues waiting on a lock held elsewhere
    (another process's long batch): `get` waited behind them, `wait(timeout=0.5)` came back
    after 2.9 s. Reads have a limiter of their own."""
    async def main() -> None:
        async with AsyncSpool(tmp_path / "s") as spool:
            job = await spool.enqueue("k", job_id="there")
            default = anyio.to_thread.current_default_thread_limiter()
            with _lock_held_elsewhere(spool) as release:
                async with anyio.create_task_group() as tg:
                    for i in range(int(default.total_tokens) + 5):
                        tg.start_soon(partial(spool.enqueue, "k", job_id=f"q{i}"))
                    while default.borrowed_tokens < default.total_tokens:
                        await anyio.sleep(0.01)
                    with anyio.fail_after(30):  # a hang guard: it waited for the lock
                        got = await spool.get(job.id)
                    assert got.id == "there"
                    release.set()

    anyio.run(main)


@contextlib.contextmanager
def _lock_held_elsewhere(spool: AsyncSpool) -> Iterator[threading.Event]:
    """The spool lock held by another thread (another process's batch, say) until the
    yielded event is set (at the latest when the block ends)."""
    held, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with spool.spool.lock.hold():  # type: ignore[attr-defined]
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    held.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join(10)


def test_aclose_closes_an_owned_spool_off_the_event_loop(tmp_path: Path) -> None:
    """`contextlib.aclosing(AsyncSpool(...))` had no `aclose` to call (AttributeError)."""
    from jobspool.errors import SpoolClosed

    async def main() -> None:
        async with contextlib.aclosing(AsyncSpool(tmp_path / "spool")) as aspool:
            await aspool.enqueue("work", {})
        with pytest.raises(SpoolClosed):
            await aspool.enqueue("work", {})
        await aspool.aclose()  # twice: nothing more to do

    anyio.run(main)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_scans_left_by_cancelled_callers_stay_bounded_and_stop(tmp_path: Path,
                                                               backend: str) -> None:
    """Found by a regression probe: `with move_on_after(0.05): await spool.jobs()` repeated
    (a health check with a timeout) left every listing running on its own; on asyncio 30
    of them ran at once. Abandoned scans are bounded, and a listing stops at its next job."""
    import time as _time

    from jobspool.async_spool import SCAN_THREADS
    from jobspool.queue.spool import Spool as FileSpool

    guard = threading.Lock()
    active = [0, 0]  # running now, most at once
    yielded = [0]

    class SlowListing(FileSpool):
        def jobs(self, state: Any = None, kind: Any = None) -> Iterator[Any]:
            with guard:
                active[0] += 1
                active[1] = max(active[1], active[0])
            try:
                for job in super().jobs(state=state, kind=kind):
                    _time.sleep(0.005)
                    with guard:
                        yielded[0] += 1
                    yield job
            finally:
                with guard:
                    active[0] -= 1

    spool = SlowListing(tmp_path / "spool")
    spool.enqueue_many("work", list(range(200)))
    calls = 30

    async def main() -> None:
        aspool = AsyncSpool(spool)
        for _ in range(calls):
            with anyio.move_on_after(0.02):
                await aspool.jobs()
        everything = await aspool.jobs()  # no scope: a whole listing still comes back
        assert len(everything) == 200

    try:
        anyio.run(main, backend=backend)
        deadline = _time.monotonic() + 60  # only a guard against a hang
        while active[0] and _time.monotonic() < deadline:
            _time.sleep(0.01)
    finally:
        spool.close()
    assert active[0] == 0
    assert active[1] <= SCAN_THREADS
    assert yielded[0] < calls * 200 // 4 + 200  # the abandoned ones stopped early


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_scans_held_up_on_one_spool_never_hold_another_spools_scans(tmp_path: Path,
                                                                    backend: str) -> None:
    """Found by a regression probe: the bound on abandoned scans was process-wide, so four
    health checks timing out on a database that was down held every slot, and a healthy
    file spool's `stats()` in the same process waited on them."""
    from jobspool.async_spool import SCAN_THREADS
    from jobspool.queue.spool import Spool as FileSpool

    release = threading.Event()
    stuck = [0]
    guard = threading.Lock()

    class StuckStats(FileSpool):
        def stats(self, *, by_kind: bool = False) -> Any:
            with guard:
                stuck[0] += 1
            release.wait(60)  # as a store waiting out an outage
            return super().stats(by_kind=by_kind)

    down = StuckStats(tmp_path / "down")
    fine = make_spool(tmp_path / "fine")

    async def main() -> None:
        slow, healthy = AsyncSpool(down), AsyncSpool(fine)
        for _ in range(SCAN_THREADS + 2):
            with anyio.move_on_after(0.05):
                await slow.stats()
        with anyio.fail_after(20):  # only a guard: before, this waited on the stuck ones
            assert (await healthy.stats()).total == 0
            assert await healthy.jobs() == []

    try:
        anyio.run(main, backend=backend)
        assert 1 <= stuck[0] <= SCAN_THREADS  # the stuck spool's own bound held
    finally:
        release.set()
        down.close()
        fine.close()
