"""Time limits among neighbours, and worker arguments a runtime probe found unchecked:

- a hung async handler is cancelled near its limit while another async handler keeps the
  loop busy in slices (every limit moved back by every slice: cancelled only once the busy
  neighbour ended, and never had it gone on);
- a sync handler that returns a coroutine (a decorator's sync wrapper of an async handler)
  and passes its limit was cancelled on the loop: it is not a hung thread, and its process
  is not replaced for it;
- `Worker(kinds=[])` is refused (it claimed nothing and called its own kinds unhandled).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio

from jobspool import Context, Job, JobState, Policy, Worker
from jobspool.errors import ConfigError
from tests.spools import make_spool


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_hung_handler_is_cancelled_while_a_neighbour_works_in_slices(
        tmp_path: Path, backend: str) -> None:
    events: list[str] = []

    async def hang(job: Job, ctx: Context) -> None:
        try:
            await anyio.sleep(3600)  # a network call that never answers
        finally:
            events.append("hang cancelled")

    async def busy(job: Job, ctx: Context) -> str:
        for _ in range(80):  # CPU work in 50 ms slices, giving the loop a turn between
            began = time.monotonic()
            while time.monotonic() - began < 0.05:
                pass
            await anyio.sleep(0)
        events.append("busy done")
        return "done"

    with make_spool(tmp_path / backend, max_attempts=1) as spool:
        spool.enqueue("busy", job_id="b")
        spool.enqueue("hang", job_id="h")
        worker = Worker(spool, {"busy": busy, "hang": hang}, concurrency=2, batch_size=2,
                        policies={"hang": Policy(timeout=0.3)}, maintenance=False)
        anyio.run(worker.arun_until_idle, backend=backend)
        assert events == ["hang cancelled", "busy done"]
        hung = spool.get("h")
        assert hung.state is JobState.DEAD_LETTER
        assert "TimeLimitExceeded" in (hung.last_error or "")
        assert spool.get("b").result == "done"


def test_a_sync_wrapper_of_an_async_handler_past_its_limit_is_cancelled_not_hung(
        tmp_path: Path) -> None:
    async def real(job: Job, ctx: Context) -> str:
        await anyio.sleep(30)
        return "late"

    def wrapper(job: Job, ctx: Context) -> Any:
        return real(job, ctx)  # what a decorator's sync wrapper hands back

    hung: list[str] = []
    with make_spool(tmp_path / "s", max_attempts=1) as spool:
        spool.enqueue("wrapped", job_id="w")
        worker = Worker(spool, {"wrapped": wrapper}, maintenance=False,
                        policies={"wrapped": Policy(timeout=0.3)})
        worker.on_hung = lambda ctx: hung.append(ctx.job_id)
        report = worker.run_until_idle()
        job = spool.get("w")
    assert report.timed_out == 1
    assert job.state is JobState.DEAD_LETTER
    assert "the handler was cancelled" in (job.last_error or "")
    assert "thread cannot be stopped" not in (job.last_error or "")
    assert hung == []


def test_a_worker_given_no_kinds_is_refused(tmp_path: Path) -> None:
    with make_spool(tmp_path / "s") as spool, \
            pytest.raises(ConfigError, match="kinds names no kind"):
        Worker(spool, {"a": lambda job, ctx: None}, kinds=[])


_LET_GO = [False]  # set once a test is done with its stubborn handler


async def _stubborn(job: Job, ctx: Context) -> None:
    # As sloppy code does with a bare except: every cancellation and GeneratorExit is
    # swallowed, until the test lets go (then the garbage collector closes it cleanly; left
    # to the end of the session, its "coroutine ignored GeneratorExit" failed pytest's exit).
    while True:
        try:
            await anyio.sleep(5)
        except (GeneratorExit, asyncio.CancelledError, trio.Cancelled):
            if _LET_GO[0]:
                raise


# An abandoned handler that ignores GeneratorExit cannot be closed when it is collected
# during its test either: Python reports that ("Exception ignored in: <coroutine ...>").
_ignored_generator_exit = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def stubborn() -> Iterator[Callable[..., Any]]:
    _LET_GO[0] = False
    yield _stubborn
    _LET_GO[0] = True
    gc.collect()


@_ignored_generator_exit
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_handler_that_swallows_everything_times_out_like_any_other(
        tmp_path: Path, backend: str, stubborn: Callable[..., Any]) -> None:
    # On trio it ran in the runner's task: abandoned, it could not be closed, and the scope
    # it sat in corrupted the task's stack ("Cancel scope stack corrupted"), failing the
    # job with trio's RuntimeError rather than as past its limit.
    with make_spool(tmp_path / backend, max_attempts=3) as spool:
        spool.enqueue("stubborn", job_id="sw")
        worker = Worker(spool, {"stubborn": stubborn}, maintenance=False,
                        policies={"stubborn": Policy(timeout=0.3)})
        report = anyio.run(worker.arun_until_idle, backend=backend)
        job = spool.get("sw")
    assert report.timed_out == 1
    assert (job.last_error or "").startswith("TimeLimitExceeded: ")
    assert "went on through its cancellation" in (job.last_error or "")


@_ignored_generator_exit
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_handler_that_swallows_everything_is_cut_off_at_shutdown(
        tmp_path: Path, backend: str, stubborn: Callable[..., Any]) -> None:
    # On trio the run ended in an exception group and the cut-off attempt was not counted.
    with make_spool(tmp_path / backend, max_attempts=3) as spool:
        spool.enqueue("stubborn", job_id="sw")
        worker = Worker(spool, {"stubborn": stubborn}, grace_seconds=0.3, maintenance=False)

        async def main() -> Any:
            async def stop_soon() -> None:
                await anyio.sleep(0.5)
                worker.stop()

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_soon)
                return await worker.arun_forever(handle_signals=False)

        report = anyio.run(main, backend=backend)
        job = spool.get("sw")
    assert report.interrupted == 1
    assert (job.state, job.attempts) == (JobState.READY, 1)
    assert (job.last_error or "").startswith("interrupted")


def _wrapped(handler: Any) -> Any:
    def wrapper(job: Job, ctx: Context) -> Any:
        return handler(job, ctx)  # a decorator's sync wrapper of an async handler
    return wrapper


async def _quick(job: Job, ctx: Context) -> str:
    await anyio.sleep(0)
    return "ok"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sync_wrapper_of_an_async_handler_runs_under_a_limit_on_both_backends(
        tmp_path: Path, backend: str) -> None:
    # On trio it was dead-lettered with trio's "expected a sync function" TypeError.
    with make_spool(tmp_path / backend, max_attempts=1) as spool:
        spool.enqueue("w", job_id="w")
        worker = Worker(spool, {"w": _wrapped(_quick)}, maintenance=False,
                        policies={"w": Policy(timeout=5)})
        anyio.run(worker.arun_until_idle, backend=backend)
        job = spool.get("w")
    assert (job.state, job.result) == (JobState.COMPLETED, "ok"), job.last_error


@_ignored_generator_exit
def test_a_sync_wrapper_whose_coroutine_swallows_everything_is_abandoned(
        tmp_path: Path, stubborn: Callable[..., Any]) -> None:
    # Awaited bare, it held the worker for ever, past its limit.
    with make_spool(tmp_path / "s", max_attempts=1) as spool:
        spool.enqueue("w", job_id="w")
        worker = Worker(spool, {"w": _wrapped(stubborn)}, maintenance=False,
                        policies={"w": Policy(timeout=0.3)})
        report = worker.run_until_idle()
        job = spool.get("w")
    assert report.timed_out == 1
    assert "went on through its cancellation" in (job.last_error or "")


def test_on_trio_a_handler_raising_a_cancellation_of_its_own_fails_its_job_alone(
        tmp_path: Path) -> None:
    # It failed with an IndexError from jobspool's own code (before that, the run unwound as
    # if shut down, and a batch mate was dead-lettered).
    async def stray(job: Job, ctx: Context) -> None:
        caught = None
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(1)
            except anyio.get_cancelled_exc_class() as exc:
                caught = exc
        assert caught is not None
        raise caught

    with make_spool(tmp_path / "s", max_attempts=1) as spool:
        spool.enqueue("stray", job_id="s")
        spool.enqueue("quick", job_id="q")
        worker = Worker(spool, {"stray": stray, "quick": _quick}, maintenance=False)
        anyio.run(worker.arun_until_idle, backend="trio")
        failed, done = spool.get("s"), spool.get("q")
    assert failed.state is JobState.DEAD_LETTER
    assert "cancellation of its own" in (failed.last_error or "")
    assert (done.state, done.result) == (JobState.COMPLETED, "ok")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_handler_blocking_the_loop_past_its_limit_is_said_to_have_returned_late(
        tmp_path: Path, backend: str) -> None:
    async def blocks(job: Job, ctx: Context) -> str:
        await anyio.sleep(0.01)
        time.sleep(0.8)  # blocks the loop: the cancellation cannot reach it
        return "blocked"

    with make_spool(tmp_path / backend, max_attempts=1) as spool:
        spool.enqueue("b", job_id="b")
        worker = Worker(spool, {"b": blocks}, maintenance=False,
                        policies={"b": Policy(timeout=0.3)})
        anyio.run(worker.arun_until_idle, backend=backend)
        job = spool.get("b")
    assert job.state is JobState.DEAD_LETTER
    assert "it returned only then, having blocked the event loop" in (job.last_error or "")
