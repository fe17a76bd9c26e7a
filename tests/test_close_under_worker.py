"""Closing a spool while a worker runs on it stops the worker first, on both stores.

Before, `close()` cut the worker off mid-batch: it raised `WorkerSpoolClosed` and every
job it held (running or waiting in its batch) stayed leased until the lease ran out. Now
the running handlers finish within the worker's grace, the jobs not begun go back
uncounted, and the run returns its report.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import Context, Job, JobState, Spool, Worker
from jobspool.errors import SpoolClosed
from tests.spools import make_spool
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
    worker: Worker

    def handler(job: Job, ctx: Context) -> str:
        started.release()
        # Still running when close() asks the stop, however late this thread or the test's
        # is scheduled: a fixed 0.3 s let a handler end first on a loaded machine, and the
        # worker start a third job before the stop (completed 3, released 3).
        wait_until(lambda: worker.stopping, 60, "close() to ask the worker to stop")
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


@pytest.mark.parametrize("sync", [True, False], ids=["sync-handler", "async-handler"])
def test_a_handler_closing_its_own_spool_lets_its_run_end_then_the_spool_closes(
        make_any_spool: Callable[..., Spool], sync: bool) -> None:
    """From inside a run, `close` cannot wait for that run: it asks it to stop and the run
    closes the spool as it ends. Before, a sync handler waited out the whole grace inside
    its own handler and its job was released "interrupted"; an async one closed the spool
    under its own run, which raised `WorkerSpoolClosed` with the job still leased."""
    spool = make_any_spool(lease_seconds=300.0)
    job = spool.enqueue("k", {})
    other = spool.enqueue("k", {})  # not begun: goes back uncounted

    def closing(job: Job, ctx: Context) -> str:
        spool.close()
        return "closed it"

    async def closing_async(job: Job, ctx: Context) -> str:
        return closing(job, ctx)

    worker = Worker(spool, {"k": closing if sync else closing_async}, concurrency=1,
                    batch_size=2, grace_seconds=2.0)
    thread, out = _serve_in_thread(lambda: worker.run_forever(handle_signals=False))
    thread.join(60)
    assert not thread.is_alive()
    (report,) = out
    assert not isinstance(report, BaseException), report
    assert (report.completed, report.released) == (1, 1)
    with pytest.raises(SpoolClosed):
        spool.stats()
    reopened = make_any_spool()
    assert reopened.get(job.id).state is JobState.COMPLETED
    assert reopened.get(other.id).attempts == 0
    assert reopened.stats().counts["leased"] == 0


def test_closing_stops_every_run_of_one_worker_serving_in_two_threads(
        make_any_spool: Callable[..., Spool]) -> None:
    """The register keyed runs by worker: a worker's second run hid its first, and `close`
    did not wait for the first, whose job then could not settle (it stayed leased)."""
    spool = make_any_spool(lease_seconds=300.0)
    slow = spool.enqueue("k", {"slow": True})
    slow_started, fast_started = threading.Event(), threading.Event()

    def handler(job: Job, ctx: Context) -> None:
        if job.payload.get("slow"):
            slow_started.set()
            time.sleep(1.0)
        else:
            fast_started.set()
            time.sleep(0.05)

    worker = Worker(spool, {"k": handler}, concurrency=1, batch_size=1)
    runs = [_serve_in_thread(lambda: worker.run_forever(handle_signals=False))]
    assert slow_started.wait(30)
    spool.enqueue_many("k", [{} for _ in range(10)])
    runs.append(_serve_in_thread(lambda: worker.run_forever(handle_signals=False)))
    assert fast_started.wait(30)
    spool.close()
    for thread, out in runs:
        thread.join(60)
        assert not thread.is_alive()
        assert not isinstance(out[0], BaseException), out[0]
    reopened = make_any_spool()
    assert reopened.get(slow.id).state is JobState.COMPLETED
    counts = reopened.stats().counts
    assert counts["leased"] == 0
    assert counts["completed"] + counts["ready"] == 11


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


def test_a_forked_child_closing_its_copy_does_not_wait_for_the_parents_run(
        tmp_path: Path) -> None:
    """The child's copy of the register listed the parent's runs: its `close()` waited
    their whole grace (and a margin) for runs it does not have; and it waited for ever for
    a lock another thread of the parent held at the fork."""
    spool = make_spool(tmp_path / "spool", lease_seconds=300.0)
    spool.enqueue("k", {})
    started, finish = threading.Event(), threading.Event()

    def handler(job: Job, ctx: Context) -> None:
        started.set()
        finish.wait(60)

    worker = Worker(spool, {"k": handler}, grace_seconds=600.0)
    thread, out = _serve_in_thread(lambda: worker.run_forever(handle_signals=False))
    assert started.wait(30)
    # As the worker's heartbeat or a settle may at the moment of the fork: a lock held by
    # another thread stays held in the child, where close() waited for it for ever.
    held = [spool.journal.lock._thread_lock, spool.journal._group._thread_lock]  # noqa: SLF001
    holding, fork_done = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in held:
            lock.acquire()
        holding.set()
        fork_done.wait(60)
        for lock in held:
            lock.release()

    threading.Thread(target=hold, daemon=True).start()
    assert holding.wait(30)
    pid = os.fork()
    fork_done.set()
    if pid == 0:  # pragma: no cover - the child
        faulthandler.dump_traceback_later(60, exit=True)  # a hang fails, not hangs
        spool.close()
        os._exit(0)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        finish.set()
    assert os.waitstatus_to_exitcode(status) == 0  # 1 when the hang guard fired
    worker.stop()
    thread.join(60)
    assert out[0].completed == 1
    spool.close()


def test_a_spool_dropped_without_close_gives_its_descriptors_back(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root, durable=True).enqueue("k", {})  # this process's one liveness file

    def open_fds() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    for _ in range(20):
        dropped = make_spool(root, durable=True)
        dropped.enqueue("k", {})
        dropped.stats()
    del dropped
    assert open_fds() - before < 20  # 3 per spool before: the lock, its directory, tmp/
