"""Cancelling the task that runs a worker: nothing it did is left without an owner.

asyncio's `task.cancel()` (`asyncio.wait_for`, `asyncio.timeout`, a failing TaskGroup
sibling, a server's lifespan shutdown) reached a worker's thread calls that anyio's cancel
scopes never cut: a claim in flight leased jobs that never reached the worker's hand
(left leased, an attempt charged; with `max_attempts=1` dead-lettered unrun); a settle in
flight was still completing jobs while the way out released them (every finished handler
ran again). On trio, a shutdown's cancellation left the handler's nursery wrapped in an
exception group, and was recorded as the handler's failure. A handler's coroutine
cancelled before its first step printed "coroutine ... was never awaited".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import time
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from jobspool import AsyncSpool, JobState, Spool, Worker


def _slowed(spool: Spool, name: str, seconds: float) -> None:
    """Make one of the spool's calls take `seconds` longer (a slow disk or database)."""
    real = getattr(spool, name)

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return real(*args, **kwargs)

    setattr(spool, name, slow)


def _counting(ran: collections.Counter[str]) -> Callable[..., Any]:
    """An async handler that counts its runs per job."""
    async def handler(job: Any, ctx: Any) -> int:
        ran[job.id] += 1
        return 1

    return handler


def _cancel_run_after(worker: Worker, seconds: float) -> None:
    async def main() -> None:
        task = asyncio.create_task(worker.arun_until_idle())
        await asyncio.sleep(seconds)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Whatever the cancelled call still does in its thread lands by now (the slowed
        # call's own delay is 0.4 s at most): the states read next are final.
        await asyncio.sleep(0.6)

    asyncio.run(main())


def test_a_cancel_during_the_claim_gives_the_claimed_jobs_back_uncounted(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=60.0)
    ids = [j.id for j in spool.enqueue_many("k", list(range(5)), max_attempts=1)]
    ran: collections.Counter[str] = collections.Counter()
    handler = _counting(ran)
    worker = Worker(spool, {"k": handler}, batch_size=5)
    _slowed(spool, "claim", 0.3)
    _cancel_run_after(worker, 0.1)  # the claim is in its thread
    del spool.claim  # type: ignore[attr-defined]  # the class's own again
    after = [spool.get(i) for i in ids]
    assert [(j.state, j.attempts) for j in after] == [(JobState.READY, 0)] * 5
    assert not ran
    # Claimable at once, by this process (no lease left to expire), and run once each.
    assert Worker(spool, {"k": handler}).run_until_idle().completed == 5
    assert ran == {i: 1 for i in ids}


def test_a_cancel_during_the_settle_lets_it_land_and_runs_nothing_twice(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=60.0)
    ids = [j.id for j in spool.enqueue_many("k", list(range(5)))]
    ran: collections.Counter[str] = collections.Counter()
    handler = _counting(ran)
    worker = Worker(spool, {"k": handler}, batch_size=5)
    _slowed(spool, "complete_many", 0.4)
    _cancel_run_after(worker, 0.2)  # the handlers ran; their settle is in its thread
    del spool.complete_many  # type: ignore[attr-defined]
    assert [(spool.get(i).state, spool.get(i).attempts) for i in ids] == \
        [(JobState.COMPLETED, 1)] * 5
    assert Worker(spool, {"k": handler}).run_until_idle().completed == 0
    assert ran == {i: 1 for i in ids}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_stop_past_its_grace_interrupts_async_handlers_on_either_loop(
        tmp_path: Any, backend: str) -> None:
    """On trio the cut-off runs were recorded as failed ("BaseExceptionGroup: Exceptions
    from Trio nursery"), retried with a backoff, and logged with a traceback each."""
    async def slow(job: Any, ctx: Any) -> str:
        await anyio.sleep(5)
        return "done"

    async def main() -> tuple[Any, list[Any]]:
        async with await AsyncSpool.open(tmp_path / "s") as spool:
            await spool.enqueue_many("a", list(range(12)))
            worker = Worker(spool, {"a": slow}, concurrency=4, batch_size=8, grace_seconds=0.05)
            got: list[Any] = []
            async with anyio.create_task_group() as tg:
                async def run() -> None:
                    got.append(await worker.arun_until_idle())

                tg.start_soon(run)
                await anyio.sleep(0.3)
                worker.stop()
            return got[0], await spool.jobs()

    report, jobs = anyio.run(main, backend=backend)
    assert (report.interrupted, report.retried, report.dead_lettered) == (4, 0, 0)
    cut = [j for j in jobs if j.attempts == 1]
    assert len(cut) == 4
    assert all(j.state is JobState.READY and "interrupted" in (j.last_error or "")
               for j in cut), [(j.state, j.last_error) for j in cut]
    assert all(j.state is JobState.READY and j.attempts == 0 for j in jobs if j not in cut)


def test_a_handler_cancelled_before_its_first_step_leaves_no_unawaited_coroutine(
        tmp_path: Any) -> None:
    from jobspool.queue.monitor import Monitor
    from jobspool.queue.runtime import Tracked, in_own_task

    async def handler() -> None:
        raise AssertionError("never started")

    async def main() -> None:
        with Spool(tmp_path / "s") as spool:
            monitor = Monitor(spool, list, lease_seconds=30.0)
            tracked = Tracked(handler(), monitor, lambda: "job")
            task = asyncio.create_task(in_own_task(tracked))
            await asyncio.sleep(0)  # it made the handler's task, not yet run
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert tracked.started_at is None

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert not [w for w in seen if "never awaited" in str(w.message)]


def test_a_second_cancel_during_the_way_out_leaves_no_lease_held(tmp_path: Any) -> None:
    """The way out runs in a shielded scope, which keeps anyio's cancellations out, not
    asyncio's: a second `task.cancel()` ended it, and every lease stayed held."""
    with Spool(tmp_path / "s", lease_seconds=60.0) as spool:
        spool.enqueue_many("k", list(range(5)))

        async def slow(job: Any, ctx: Any) -> None:
            await asyncio.sleep(5)

        worker = Worker(spool, {"k": slow}, batch_size=5, concurrency=4, grace_seconds=0.05)

        async def main() -> None:
            task = asyncio.create_task(worker.arun_until_idle())
            await asyncio.sleep(0.3)
            task.cancel()
            await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        states = collections.Counter((j.state, j.attempts) for j in spool.jobs())
    assert states == {(JobState.READY, 1): 4, (JobState.READY, 0): 1}


@pytest.mark.parametrize("turns", range(0, 12))
def test_a_cancel_in_the_turns_after_a_claim_strands_no_job(tmp_path: Any, turns: int) -> None:
    """Cancelled between the claim's return and its jobs reaching the hand (while it gave
    back a stray kind's job), the claimed jobs stayed leased, an attempt charged."""
    with Spool(tmp_path / "s", lease_seconds=60.0) as spool:
        spool.enqueue_many("k", list(range(4)))
        spool.enqueue("other", "stray")
        real = spool.claim
        handler = _counting(collections.Counter())
        worker = Worker(spool, {"k": handler}, batch_size=10)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            task: asyncio.Task[Any] | None = None

            def count(k: int) -> None:
                if k == 0:
                    assert task is not None
                    task.cancel()
                else:
                    loop.call_soon(count, k - 1)

            def claim(**kw: Any) -> Any:
                kw["kinds"] = None  # as a stale cache did: a kind it has no handler for
                out = real(**kw)
                if out:
                    loop.call_soon_threadsafe(count, turns)
                return out

            spool.claim = claim  # type: ignore[method-assign]
            task = asyncio.create_task(worker.arun_until_idle())
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.3)

        asyncio.run(main())
        del spool.claim  # type: ignore[attr-defined]
        assert [j.id for j in spool.jobs() if j.state is JobState.LEASED] == []
