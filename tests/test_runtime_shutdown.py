"""Shutdown that behaves, and async ergonomics (issue 11).

First SIGINT/SIGTERM (or `stop()`): no new claims, running handlers get the
grace period, runs still going then are cut off and their jobs go back to
`ready` with the attempt counted; jobs that never started go back
uncounted. A second signal (or `hurry()`) cuts everything off at once.
Leases are beaten from a thread, so an async handler blocking the loop
keeps its lease; the blocked loop is logged naming the handler.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from jobspool import Context, Job, JobState, Spool, Worker
from jobspool.errors import JobspoolError, RunningLoopError
from tests.cli_harness import LineReader, reap, start_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool
from tests.waiting import wait_until


def test_two_sigints_to_run_until_idle_release_a_60_s_handler_now_with_the_attempt_counted(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    started = tmp_path / "started"
    with make_spool(root) as spool:
        job = spool.enqueue("grace", {"sleep": 60, "startfile": str(started)})
    proc = start_jobspool("run-until-idle", "--app", "tests.apps.runtime:app", "--json",
                          "--no-maintenance", "--grace", "600", root=root)
    stderr = LineReader(proc.stderr)
    try:
        wait_until(started.exists, 60, "the handler to start", proc=proc)
        proc.send_signal(signal.SIGINT)
        # Two distinct signals, not one coalesced delivery: the second once the first is in.
        stderr.wait_for("received SIGINT: no new claims", 60, "the first signal taken")
        proc.send_signal(signal.SIGINT)
        # The guard is far below both the handler's 60 s and the 600 s grace: the second
        # signal did not wait for either.
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    text = stderr.text() + err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
    assert "releasing every held lease now" in text
    report = orjson.loads(out)
    assert (report["interrupted"], report["released"]) == (1, 0)
    with make_spool(root) as spool:
        back = spool.get(job.id)
    assert back.state is JobState.READY
    assert back.attempts == 1  # the run was cut off, not never made
    assert back.lease is None
    assert job_files(root)[job.id] == ["ready"]


def _stop_when(event: threading.Event, worker: Worker) -> threading.Thread:
    def run() -> None:
        event.wait(30)
        worker.stop()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_runs_past_the_grace_period_count_their_attempt_and_unstarted_ones_do_not(
        spool: Spool) -> None:
    started = threading.Event()
    never = threading.Event()

    def stuck(job: Job, ctx: Context) -> None:
        started.set()
        never.wait(30)

    running = spool.enqueue("stuck", "first")
    waiting = spool.enqueue("stuck", "second")
    worker = Worker(spool, {"stuck": stuck}, concurrency=1, grace_seconds=0.2,
                    maintenance=False)
    _stop_when(started, worker)
    try:
        report = worker.run_until_idle()
    finally:
        never.set()
    assert (report.interrupted, report.released) == (1, 1)  # the unstarted one: uncounted
    cut = spool.get(running.id)
    assert (cut.state, cut.attempts) == (JobState.READY, 1)
    assert "interrupted" in (cut.last_error or "")
    untouched = spool.get(waiting.id)
    assert (untouched.state, untouched.attempts) == (JobState.READY, 0)


def test_a_handler_that_finishes_within_the_grace_period_completes(spool: Spool) -> None:
    started = threading.Event()

    def brief(job: Job, ctx: Context) -> str:
        started.set()
        time.sleep(0.3)
        return "done"

    job = spool.enqueue("brief")
    worker = Worker(spool, {"brief": brief}, grace_seconds=30.0, maintenance=False)
    _stop_when(started, worker)
    report = worker.run_until_idle()
    assert report.completed == 1
    assert spool.get(job.id).state is JobState.COMPLETED


def test_hurry_cuts_off_running_handlers_without_waiting_for_the_grace_period(
        spool: Spool) -> None:
    started = threading.Event()
    never = threading.Event()

    async def stuck(job: Job, ctx: Context) -> None:
        started.set()
        await anyio.sleep(60)

    job = spool.enqueue("stuck")
    worker = Worker(spool, {"stuck": stuck}, grace_seconds=600.0, maintenance=False)

    def hurry() -> None:
        started.wait(30)
        worker.stop()
        worker.hurry()

    threading.Thread(target=hurry, daemon=True).start()
    try:
        report = worker.run_until_idle()
    finally:
        never.set()
    assert (report.interrupted, report.released) == (1, 0)
    assert (spool.get(job.id).state, spool.get(job.id).attempts) == (JobState.READY, 1)


def test_an_async_handler_blocking_the_loop_keeps_its_lease_and_is_named_in_the_log(
        spool_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    lease_seconds = 1.5  # beats every 0.5 s from the heartbeat thread

    async def hog(job: Job, ctx: Context) -> str:
        time.sleep(3 * lease_seconds)  # blocks the loop: 9 heartbeat intervals
        return "done"

    caplog.set_level(logging.WARNING, logger="jobspool")
    with make_spool(spool_root, lease_seconds=lease_seconds) as spool:
        job = spool.enqueue("hog")
        report = Worker(spool, {"hog": hog}, maintenance=False).run_until_idle()
        done = spool.get(job.id)
    assert report.lease_lost == 0 and report.completed == 1
    assert done.state is JobState.COMPLETED and done.attempts == 1 and done.rescues == 0
    blocked = [r.getMessage() for r in caplog.records if "event loop blocked" in str(r.msg)]
    assert blocked, "a blocked loop was not reported"
    assert "'hog'" in blocked[0] and "hog" in blocked[0] and job.id in blocked[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_until_idle_inside_a_running_loop_names_arun_until_idle(
        spool: Spool, backend: str) -> None:
    worker = Worker(spool, {"t": lambda job, ctx: None}, maintenance=False)
    spool.enqueue("t")

    async def main() -> Any:
        with pytest.raises(RunningLoopError, match="arun_until_idle") as err:
            worker.run_until_idle()
        assert isinstance(err.value, JobspoolError) and isinstance(err.value, RuntimeError)
        return await worker.arun_until_idle()

    report = anyio.run(main, backend=backend)
    assert report.completed == 1


def test_run_forever_is_sync_without_a_loop_and_arun_forever_is_its_async_form(
        spool: Spool) -> None:
    def work(job: Job, ctx: Context) -> str:
        worker.stop()
        return "ok"

    worker = Worker(spool, {"t": work}, maintenance=False)
    spool.enqueue("t")
    report = worker.run_forever(handle_signals=False, poll_seconds=0.05)
    assert report.completed == 1

    worker = Worker(spool, {"t": work}, maintenance=False)
    spool.enqueue("t")

    async def main() -> Any:
        return await worker.arun_forever(handle_signals=False, poll_seconds=0.05)

    assert anyio.run(main).completed == 1


def test_awaiting_run_forever_inside_a_loop_still_works(spool: Spool) -> None:
    def work(job: Job, ctx: Context) -> str:
        worker.stop()
        return "ok"

    worker = Worker(spool, {"t": work}, maintenance=False)
    spool.enqueue("t")

    async def main() -> Any:
        return await worker.run_forever(handle_signals=False, poll_seconds=0.05)

    assert anyio.run(main).completed == 1


def test_a_run_cut_off_on_its_last_attempt_is_dead_lettered(spool: Spool) -> None:
    started = threading.Event()
    never = threading.Event()

    def stuck(job: Job, ctx: Context) -> None:
        started.set()
        never.wait(30)

    job = spool.enqueue("stuck", max_attempts=1)
    worker = Worker(spool, {"stuck": stuck}, grace_seconds=0.1, maintenance=False)
    _stop_when(started, worker)
    try:
        report = worker.run_until_idle()
    finally:
        never.set()
    assert report.dead_lettered == 1
    gone = spool.get(job.id)
    assert gone.state is JobState.DEAD_LETTER and "interrupted" in (gone.last_error or "")
