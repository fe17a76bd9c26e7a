"""An async handler that cancels its own task (`asyncio.current_task().cancel()`) fails its
own job only. It cancelled the runner carrying it: the whole worker unwound as if shut
down — batch mates dead-lettered as interrupted or left, `run_forever` returned at once
and `jobspool worker` exited 0 (a unit with Restart=on-failure stayed down)."""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path
from typing import Any

import pytest

from jobspool import Context, Job, JobState, RunReport, Spool, Worker
from tests.cli_harness import run_jobspool


async def cancels_itself(job: Job, ctx: Context) -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(0.1)


async def fine(job: Job, ctx: Context) -> str:
    await asyncio.sleep(0.05)
    return "ok"


handlers = {"bad": cancels_itself, "good": fine}


def test_a_self_cancelling_handler_fails_alone_and_its_batch_mates_complete(
        spool: Spool) -> None:
    bad = spool.enqueue("bad", max_attempts=1)
    good = [spool.enqueue("good", n, max_attempts=1) for n in range(6)]
    report = Worker(spool, handlers, concurrency=4, maintenance=False).run_until_idle()
    assert report.completed == 6 and report.dead_lettered == 1 and report.released == 0
    for job in good:
        assert spool.get(job.id).state is JobState.COMPLETED
    failed = spool.get(bad.id)
    assert failed.state is JobState.DEAD_LETTER and "CancelledError" in (failed.last_error or "")


def test_the_worker_command_goes_on_after_a_self_cancelling_handler(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with Spool(root) as spool:
        spool.enqueue("bad", max_attempts=1)
        for n in range(3):
            spool.enqueue("good", n)
    done = run_jobspool("run-until-idle", "--app", "tests.test_async_self_cancel:handlers",
                        root=root)
    assert done.code == 0, done.err
    with Spool(root) as spool:
        counts = spool.stats()
    assert counts["completed"] == 3 and counts["dead_letter"] == 1, counts


async def cancels_itself_and_returns(job: Job, ctx: Context) -> str:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # never awaited past: the cancel is still pending when it returns
    return "returned"


async def cancels_itself_and_catches_it(job: Job, ctx: Context) -> str:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    try:
        await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        return "caught"
    return "not cancelled"


async def times_itself_out(job: Job, ctx: Context) -> None:
    async with asyncio.timeout(0.01):
        await asyncio.sleep(1)


def _beside_a_good_job(spool: Spool, handler: Any) -> tuple[Job, Job, RunReport]:
    """Run `handler`'s job, then a plain one, one at a time: both as they ended."""
    odd = spool.enqueue("odd", max_attempts=1)
    good = spool.enqueue("good", 1, max_attempts=1)
    report = Worker(spool, {"odd": handler, "good": fine}, concurrency=1,
                    maintenance=False).run_until_idle()
    return spool.get(odd.id), spool.get(good.id), report


def test_a_cancel_the_handler_caught_leaves_its_result(spool: Spool) -> None:
    caught, after, report = _beside_a_good_job(spool, cancels_itself_and_catches_it)
    assert report.completed == 2 and report.released == 0
    assert (caught.result, after.result) == ("caught", "ok")


def test_asyncio_timeout_inside_a_handler_fails_that_job_only(spool: Spool) -> None:
    slow, good, report = _beside_a_good_job(spool, times_itself_out)
    assert report.completed == 1 and report.dead_lettered == 1
    assert "TimeoutError" in (slow.last_error or "")
    assert good.state is JobState.COMPLETED


_seen: contextvars.ContextVar[str] = contextvars.ContextVar("_seen", default="unset")


async def sets_a_context_variable(job: Job, ctx: Context) -> str:
    before = _seen.get()
    _seen.set(f"set by {job.id}")
    return before


def test_context_variables_a_handler_sets_do_not_reach_the_next_job(spool: Spool) -> None:
    jobs = [spool.enqueue("vars", n) for n in range(3)]
    report = Worker(spool, {"vars": sets_a_context_variable}, concurrency=1,
                    maintenance=False).run_until_idle()
    assert report.completed == 3
    assert [spool.get(job.id).result for job in jobs] == ["unset"] * 3


async def cancels_itself_then_raises(job: Job, ctx: Context) -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    raise ValueError("after cancelling itself")


async def cancels_itself_later(job: Job, ctx: Context) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().call_later(0.2, task.cancel)  # fires after it returned


async def sleeps(job: Job, ctx: Context) -> str:
    await asyncio.sleep(0.5)
    return "slept"


@pytest.mark.parametrize(("handler", "error"), [
    (cancels_itself_and_returns, "CancelledError"),  # the cancel still pending at its return
    (cancels_itself_then_raises, "ValueError"),  # the cancel left behind by its exception
], ids=["left-pending", "raised-past"])
def test_a_cancel_the_handler_left_on_its_task_fails_its_own_job_only(
        spool: Spool, handler: Any, error: str) -> None:
    bad = spool.enqueue("bad", max_attempts=1)
    good = [spool.enqueue("good", n, max_attempts=1) for n in range(4)]
    report = Worker(spool, {"bad": handler, "good": fine},
                    concurrency=1, maintenance=False).run_until_idle()
    assert report.completed == 4 and report.dead_lettered == 1 and report.released == 0
    assert all(spool.get(job.id).state is JobState.COMPLETED for job in good)
    assert error in (spool.get(bad.id).last_error or "")


def test_a_cancel_of_its_task_after_the_handler_ended_reaches_no_later_job(
        spool: Spool) -> None:
    early = spool.enqueue("later", max_attempts=1)
    slow = spool.enqueue("slow", max_attempts=1)
    report = Worker(spool, {"later": cancels_itself_later, "slow": sleeps},
                    concurrency=1, maintenance=False).run_until_idle()
    assert report.completed == 2 and report.dead_lettered == 0
    assert spool.get(early.id).state is JobState.COMPLETED
    assert spool.get(slow.id).result == "slept"
