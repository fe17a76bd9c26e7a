"""A handler's exception group (a task group's, trio's nursery's) is recorded with what
failed inside it: its last_error was "ExceptionGroup: unhandled errors in a TaskGroup (1
sub-exception)", naming nothing (found by probing async handlers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import JobState, Worker
from tests.spools import make_spool


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_task_groups_failure_names_the_error_inside(tmp_path: Path, backend: str) -> None:
    async def handler(job: Any, ctx: Any) -> None:
        async def fetch() -> None:
            raise ValueError("upstream said 503 for page 7")

        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch)

    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("h", job_id="a", max_attempts=1)

        async def main() -> None:
            await Worker(spool, {"h": handler}).arun_until_idle()

        anyio.run(main, backend=backend)
        job = spool.get("a")
    assert job.state is JobState.DEAD_LETTER
    assert "ValueError: upstream said 503 for page 7" in (job.last_error or ""), job.last_error


def test_a_deep_group_is_recorded_bounded(tmp_path: Path) -> None:
    # Recursing through the groups, 400 levels crashed the worker (RecursionError) and
    # charged its batch mate; 40 levels of headers filled the error before the cause.
    def deep(job: Any, ctx: Any) -> None:
        exc: BaseException = ValueError("disk full on /data")
        for i in range(400):
            exc = ExceptionGroup(f"level {i}", [exc])
        raise exc

    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("deep", job_id="d", max_attempts=1)
        spool.enqueue("fine", job_id="f")
        report = Worker(spool, {"deep": deep, "fine": lambda job, ctx: "ok"}).run_until_idle()
        assert report.completed == 1 and report.dead_lettered == 1
        job = spool.get("d")
    assert job.state is JobState.DEAD_LETTER
    assert "ValueError: disk full on /data" in (job.last_error or ""), job.last_error
    assert len(job.last_error or "") <= 1024
