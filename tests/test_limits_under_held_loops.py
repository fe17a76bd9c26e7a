"""Time limits of async handlers beside a held loop, a handler's own timeouts, and what a
handler does on its cancellation: found in a time-limit probe, on asyncio and trio.

- A handler using a timeout of its own (`anyio.move_on_after` inside it) was taken for one
  swallowing the worker's cancellation and abandoned 2 s later as "interrupted".
- A handler held back before its first step by another blocking the loop got 0.1 s of its
  own run, then was failed and its attempt counted.
- One that raised (`Retry`, a ValueError) on catching its limit's cancellation was recorded
  as that exception, not as past its limit.
- On trio, a handler with no `await` whose first step came after its limit's deadline was
  said to have caught a cancellation it never saw.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from jobspool import Context, Job, JobState, Policy, Retry, Worker
from tests.spools import make_spool

BACKENDS = ["asyncio", "trio"]


def _run(tmp_path: Any, backend: str, handlers: dict[str, Any], jobs: list[str],
         policies: dict[str, Policy], **options: Any) -> dict[str, Job]:
    with make_spool(tmp_path / "s") as spool:
        for kind in jobs:
            spool.enqueue(kind, {}, job_id=kind, max_attempts=1)
        worker = Worker(spool, handlers, policies=policies, maintenance=False, **options)
        anyio.run(worker.arun_until_idle, backend=backend)
        return {kind: spool.get(kind) for kind in jobs}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("limited", [True, False], ids=["with-limit", "no-limit"])
def test_a_handlers_own_timeout_is_not_taken_for_a_swallowed_cancellation(
        tmp_path: Any, backend: str, limited: bool) -> None:
    async def own_timeout(job: Job, ctx: Context) -> str:
        with anyio.move_on_after(0.02):
            await anyio.sleep(5)
        for _ in range(25):  # 2.5 s on, past the 2 s a real swallower is given
            await anyio.sleep(0.1)
        return "ok"

    policies = {"own": Policy(timeout=10)} if limited else {}
    job = _run(tmp_path, backend, {"own": own_timeout}, ["own"], policies)["own"]
    assert (job.state, job.result) == (JobState.COMPLETED, "ok"), job.last_error


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_handler_held_back_before_it_began_gets_its_whole_limit(
        tmp_path: Any, backend: str) -> None:
    async def blocker(job: Job, ctx: Context) -> str:
        time.sleep(0.6)  # holds the loop across the other's limit
        return "blocked"

    async def near(job: Job, ctx: Context) -> str:
        await anyio.sleep(0.25)  # within its 0.3 s, counted from its own start
        return "near"

    jobs = _run(tmp_path, backend, {"blocker": blocker, "near": near}, ["blocker", "near"],
                {"blocker": Policy(timeout=5), "near": Policy(timeout=0.3)},
                concurrency=2, batch_size=2)
    near_job = jobs["near"]
    # Held back before its first step, it is either run with its whole limit or given back
    # uncounted (and run again): never cut 0.1 s in and charged.
    assert (near_job.state, near_job.result) == (JobState.COMPLETED, "near"), \
        near_job.last_error
    assert jobs["blocker"].state is JobState.COMPLETED


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("raises", ["retry", "value-error"])
def test_raising_on_the_limits_cancellation_is_still_past_the_limit(
        tmp_path: Any, backend: str, raises: str) -> None:
    async def cleanup_raises(job: Job, ctx: Context) -> str:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            if raises == "retry":
                raise Retry("try again") from None
            raise ValueError("cleanup failed") from None
        return "slept"

    job = _run(tmp_path, backend, {"h": cleanup_raises}, ["h"],
               {"h": Policy(timeout=0.2)})["h"]
    error = job.last_error or ""
    assert job.state is JobState.DEAD_LETTER and job.result is None
    assert error.startswith("TimeLimitExceeded"), error
    assert "caught its cancellation and raised" in error, error
    assert ("Retry" if raises == "retry" else "cleanup failed") in error, error


def test_on_trio_a_handler_without_an_await_started_late_keeps_its_result(
        tmp_path: Any) -> None:
    async def quick(job: Job, ctx: Context) -> str:
        return "q"  # no checkpoint: no cancellation can reach it

    async def step15(job: Job, ctx: Context) -> str:
        t = time.monotonic()
        while time.monotonic() - t < 0.015:  # one step, shorter than a "hold"
            pass
        return "s"

    for _ in range(5):
        jobs = _run(tmp_path / str(_), "trio", {"quick": quick, "step15": step15},
                    ["step15", "quick"], {"quick": Policy(timeout=0.01)},
                    concurrency=3, batch_size=3)
        quick_job = jobs["quick"]
        assert quick_job.state is not JobState.DEAD_LETTER, quick_job.last_error
