"""An async handler that cancels its own task (`asyncio.current_task().cancel()`) fails its
own job only. It cancelled the runner carrying it: the whole worker unwound as if shut
down — batch mates dead-lettered as interrupted or left, `run_forever` returned at once
and `jobspool worker` exited 0 (a unit with Restart=on-failure stayed down)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from jobspool import Context, Job, JobState, Spool, Worker
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
