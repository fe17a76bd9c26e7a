"""Audit of issue 11's time limits: a cancelled async run keeps where it was as its traceback.

A sync run past its limit stores its thread's stack; an async one is cancelled,
and its traceback is the handler's frames down to the await it was stuck in
(not just the `TimeLimitExceeded` line), in the job and in the log.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from jobspool import Context, Job, JobState, Policy, Spool, Worker


async def _waits_on_the_network() -> None:
    await anyio.sleep(60)


def test_an_async_run_cancelled_at_its_limit_stores_where_it_was_waiting(
        spool: Spool, caplog: pytest.LogCaptureFixture) -> None:
    async def fetch(job: Job, ctx: Context) -> None:
        await _waits_on_the_network()

    job = spool.enqueue("fetch", max_attempts=1)
    caplog.set_level(logging.WARNING, logger="jobspool")
    Worker(spool, {"fetch": fetch}, policies={"fetch": Policy(timeout=0.2)},
           maintenance=False).run_until_idle()
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER
    assert (done.last_error or "").startswith("TimeLimitExceeded: ")
    tb = done.traceback or ""
    assert "in fetch" in tb and "await _waits_on_the_network()" in tb
    assert "in _waits_on_the_network" in tb
    assert "jobspool/queue" not in tb  # the worker's own frames say nothing
    (record,) = [r for r in caplog.records if "ran past its time limit" in str(r.msg)]
    assert "_waits_on_the_network" in record.getMessage()


def test_an_async_run_that_swallows_its_cancellation_still_times_out_with_a_traceback(
        spool: Spool) -> None:
    async def stubborn(job: Job, ctx: Context) -> str:
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            return "ignored the cancellation"
        return "never"

    job = spool.enqueue("stubborn", max_attempts=1)
    Worker(spool, {"stubborn": stubborn}, policies={"stubborn": Policy(timeout=0.2)},
           maintenance=False).run_until_idle()
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER and done.result is None
    assert "TimeLimitExceeded" in (done.traceback or "")


def test_an_async_run_that_blocks_the_loop_past_its_limit_fails_and_its_result_is_discarded(
        spool: Spool) -> None:
    import time

    async def hog(job: Job, ctx: Context) -> str:
        ctx.upsert("notes", {"id": job.id})
        time.sleep(1.0)  # blocks the loop: the cancellation cannot reach it in time
        return "too late"

    job = spool.enqueue("hog", max_attempts=1)
    report = Worker(spool, {"hog": hog}, policies={"hog": Policy(timeout=0.2)},
                    maintenance=False).run_until_idle()
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER and done.result is None
    assert (done.last_error or "").startswith("TimeLimitExceeded: ")
    assert "blocked the event loop" in (done.last_error or "")
    assert report.timed_out == 1 and report.projected_rows == 0


@pytest.mark.timeout(120)  # the bug: the worker spun for ever
def test_a_handler_swallowing_its_cancellation_in_a_loop_times_out_on_trio(
        spool: Spool) -> None:
    # Trio raises its cancellation inside the handler's frames, never through the
    # runtime's driver: a handler swallowing it in a loop was never abandoned, and trio's
    # scheduler spun at 100 % until the process was killed.
    async def stubborn(job: Job, ctx: Context) -> None:
        while True:
            try:
                await anyio.sleep(0.05)
            except anyio.get_cancelled_exc_class():
                continue

    job = spool.enqueue("stubborn", max_attempts=1)

    async def main() -> None:
        worker = Worker(spool, {"stubborn": stubborn},
                        policies={"stubborn": Policy(timeout=0.2)}, maintenance=False)
        report = await worker.arun_until_idle()
        assert report.timed_out == 1

    anyio.run(main, backend="trio")
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER
    assert "TimeLimitExceeded" in (done.last_error or "")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("own_wait", [0.1, 3.0])
def test_an_async_run_held_back_by_another_handler_blocking_the_loop_keeps_its_own_limit(
        tmp_path: object, backend: str, own_wait: float) -> None:
    # Found by the async probe: a handler awaiting a 0.1 s sleep under a 0.5 s limit was
    # cancelled when the loop came back from another handler's 1.5 s block, and
    # dead-lettered as past its limit. Its limit now moves back by the time another
    # handler held the loop; one that really runs past its own limit still times out.
    from tests.spools import make_spool

    async def hog(job: Job, ctx: Context) -> str:
        await anyio.sleep(0.05)  # let the other start and begin awaiting
        import time
        time.sleep(1.5)  # blocks the loop: its own doing, charged to nobody else
        return "hog"

    async def waits(job: Job, ctx: Context) -> str:
        await anyio.sleep(own_wait)
        return "done"

    with make_spool(tmp_path / f"s-{backend}-{own_wait}") as spool:  # type: ignore[operator]
        spool.enqueue("hog", job_id="hog")
        spool.enqueue("waits", job_id="waits")
        worker = Worker(spool, {"hog": hog, "waits": waits}, concurrency=4, batch_size=10,
                        policies={"waits": Policy(timeout=0.5, max_attempts=1)},
                        maintenance=False)
        anyio.run(worker.arun_until_idle, backend=backend)
        assert spool.get("hog").result == "hog"
        done = spool.get("waits")
        if own_wait < 0.5:
            assert (done.state, done.result) == (JobState.COMPLETED, "done"), done.last_error
        else:
            assert done.state is JobState.DEAD_LETTER
            assert (done.last_error or "").startswith("TimeLimitExceeded: ")
