"""Closing a spool while a worker runs on it stops the worker first, on both stores.

Before, `close()` cut the worker off mid-batch: it raised `WorkerSpoolClosed` and every
job it held (running or waiting in its batch) stayed leased until the lease ran out. Now
the running handlers finish within the worker's grace, the jobs not begun go back
uncounted, and the run returns its report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from jobspool import Context, Job, JobState, Spool, Worker
from tests.waiting import wait_until


def _serve_in_thread(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:  # what the run ended with is the test's to check
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_closing_the_spool_under_run_forever_finishes_running_jobs_and_gives_back_the_rest(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=300.0)
    ids = [j.id for j in spool.enqueue_many("k", [{"i": i} for i in range(6)])]
    started = threading.Semaphore(0)

    def handler(job: Job, ctx: Context) -> str:
        started.release()
        time.sleep(0.3)
        return "done"

    worker = Worker(spool, {"k": handler}, concurrency=2, batch_size=6)
    thread, out = _serve_in_thread(lambda: worker.run_forever(handle_signals=False))
    assert started.acquire(timeout=30) and started.acquire(timeout=30)
    spool.close()
    thread.join(60)
    assert not thread.is_alive()
    (report,) = out
    assert not isinstance(report, BaseException), report
    assert (report.completed, report.released) == (2, 4)
    reopened = make_any_spool()
    jobs = [reopened.get(i) for i in ids]
    assert sorted(j.state.value for j in jobs) == ["completed"] * 2 + ["ready"] * 4
    # The jobs never begun went back uncounted; nothing stays leased.
    assert all(j.attempts == 0 for j in jobs if j.state is JobState.READY)


def test_closing_the_spool_under_run_until_idle_stops_it_cleanly(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=300.0)
    spool.enqueue_many("k", [{"i": i} for i in range(40)])
    handled = threading.Event()

    def handler(job: Job, ctx: Context) -> None:
        handled.set()
        time.sleep(0.05)

    worker = Worker(spool, {"k": handler}, concurrency=1, batch_size=10)
    thread, out = _serve_in_thread(worker.run_until_idle)
    assert handled.wait(30)
    spool.close()
    thread.join(60)
    (report,) = out
    assert not isinstance(report, BaseException), report
    counts = make_any_spool().stats().counts
    assert counts["leased"] == 0
    assert counts["completed"] == report.completed and counts["ready"] == 40 - report.completed


def test_an_async_handler_closing_its_own_spool_does_not_hang_the_worker(
        make_any_spool: Callable[..., Spool]) -> None:
    """Closed from the run's own event loop, `close` cannot wait for that run to end: it
    asks it to stop and closes; the worker then ends on the closed spool with the error
    that names it, without hanging."""
    spool = make_any_spool(lease_seconds=300.0)
    spool.enqueue("k", {})

    async def handler(job: Job, ctx: Context) -> None:
        spool.close()

    worker = Worker(spool, {"k": handler}, grace_seconds=1.0)
    thread, out = _serve_in_thread(lambda: worker.run_forever(handle_signals=False))
    thread.join(60)
    assert not thread.is_alive()
    assert "closed" in str(out[0])


def test_a_spool_closed_after_its_worker_ended_closes_at_once(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    Worker(spool, {"k": lambda j, c: None}, grace_seconds=600.0).run_until_idle()
    began = time.monotonic()
    spool.close()
    assert time.monotonic() - began < 300  # no wait for a run that is over (guard only)


def test_closing_under_an_async_run_forever_in_another_thread(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=300.0)
    spool.enqueue_many("k", [{} for _ in range(3)])
    started = threading.Event()

    async def handler(job: Job, ctx: Context) -> None:
        started.set()
        await anyio.sleep(0.2)

    worker = Worker(spool, {"k": handler}, concurrency=1, batch_size=3)
    thread, out = _serve_in_thread(
        lambda: anyio.run(lambda: worker.arun_forever(handle_signals=False)))
    assert started.wait(30)
    spool.close()
    thread.join(60)
    assert not isinstance(out[0], BaseException), out[0]
    wait_until(lambda: make_any_spool().stats().counts["leased"] == 0, 10, "no lease left")
