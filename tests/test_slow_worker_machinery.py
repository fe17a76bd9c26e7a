"""The worker's own machinery being slow never costs a run that succeeded in time its lease.

Found by a probe of slow paths (each repro here failed before its fix):
- an event loop held by a blocking async handler (or the worker's own slow code): the
  heartbeat thread judged a sync run that had returned in time "past its time limit" (its
  end is seen on the loop), stopped extending its lease, and the job ran again or was
  dead-lettered;
- slow progress-file writes, made one after another before the beat on the same thread,
  held the beat past every lease;
- thousands of stale progress files pruned on the heartbeat thread before its first beat.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from jobspool import Context, Job, JobState, Policy, Worker
from jobspool.queue import context as context_module
from jobspool.queue.jobprogress import make_progress, write_progress
from tests.spools import make_spool


def test_a_run_done_in_time_survives_a_loop_held_by_another_handler(tmp_path: Path) -> None:
    runs: list[int] = []

    def quick(job: Job, ctx: Context) -> str:
        runs.append(ctx.token)
        time.sleep(0.1)
        return "ok"

    async def blocker(job: Job, ctx: Context) -> str:
        await anyio.sleep(0.05)
        time.sleep(3.0)  # misuse: blocks the event loop, past the 1.5 s lease
        return "b"

    spool = make_spool(tmp_path / "s", lease_seconds=1.5)
    spool.enqueue("blocker", {}, job_id="b", max_attempts=1)
    spool.enqueue("quick", {}, job_id="q", max_attempts=1)
    report = Worker(spool, {"quick": quick, "blocker": blocker},
                    policies={"quick": Policy(timeout=0.5)}, concurrency=2,
                    maintenance=False).run_until_idle()
    assert runs == [runs[0]]  # once
    assert spool.get("q").state is JobState.COMPLETED
    assert report.lease_lost == 0


def test_slow_progress_writes_do_not_cost_the_leases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = context_module.write_progress

    def slow_write(*args: object, **kwargs: object) -> None:
        time.sleep(0.5)  # a bad disk
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(context_module, "write_progress", slow_write)
    runs: list[str] = []

    def reports(job: Job, ctx: Context) -> str:
        runs.append(job.id)
        end = time.monotonic() + 3.0  # two leases long
        while time.monotonic() < end:
            ctx.progress(time.monotonic())
            time.sleep(0.05)
        return "ok"

    spool = make_spool(tmp_path / "s", lease_seconds=1.5)
    ids = [spool.enqueue("k", {}, max_attempts=1).id for _ in range(4)]
    report = Worker(spool, {"k": reports}, concurrency=4, maintenance=False).run_until_idle()
    assert sorted(runs) == sorted(ids)
    assert report.completed == 4 and report.lease_lost == 0


def test_many_stale_progress_files_do_not_hold_the_first_beat(tmp_path: Path) -> None:
    spool = make_spool(tmp_path / "s", lease_seconds=1.0)
    for i in range(8000):  # left by dead runs: each costs a store read to judge
        write_progress(spool.root, f"dead{i}", make_progress(i + 1, 1, None, None))
    runs: list[str] = []

    def slow(job: Job, ctx: Context) -> str:
        runs.append(job.id)
        time.sleep(2.5)  # past the 1 s lease: only beats keep it
        return "ok"

    job = spool.enqueue("k", {}, max_attempts=1)
    report = Worker(spool, {"k": slow}, maintenance=False).run_until_idle()
    assert runs == [job.id]
    assert report.completed == 1 and report.lease_lost == 0


def test_a_hung_sync_run_is_not_beaten_while_another_handler_blocks_the_loop(
        tmp_path: Path) -> None:
    # Found by a regression probe of the loop-stall rule: with the loop held, a sync run
    # past its limit (its thread says it never returned) kept its lease for as long as the
    # loop stood still, for ever with a loop blocked for good.
    import threading

    from tests.waiting import wait_until

    release = threading.Event()

    def hangs(job: Job, ctx: Context) -> None:
        release.wait(60)

    async def blocker(job: Job, ctx: Context) -> None:
        await anyio.sleep(0.3)  # the hung run has started
        time.sleep(8.0)  # misuse: holds the loop

    spool = make_spool(tmp_path / "s", lease_seconds=1.5)
    spool.enqueue("hangs", {}, job_id="h", max_attempts=1)
    spool.enqueue("blocker", {}, job_id="b", max_attempts=1)
    worker = Worker(spool, {"hangs": hangs, "blocker": blocker},
                    policies={"hangs": Policy(timeout=0.5)}, concurrency=2, maintenance=False)
    runner = threading.Thread(target=worker.run_until_idle, daemon=True)
    runner.start()
    try:
        def lapsed() -> bool:
            job = spool.get("h")
            return job.lease is not None and job.lease.expires_at < spool.now()

        wait_until(lapsed, 7.0, "the hung run's lease to lapse while the loop is held")
    finally:
        release.set()
        runner.join(60)


def test_slow_progress_writes_reach_every_job_in_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # From the front of the list each turn, the last jobs' progress was never written.
    real_write = context_module.write_progress
    written: set[str] = set()

    def slow_write(root: Path, job_id: str, *args: object, **kwargs: object) -> None:
        time.sleep(0.3)
        written.add(job_id)
        real_write(root, job_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(context_module, "write_progress", slow_write)

    def reports(job: Job, ctx: Context) -> None:
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            ctx.progress(time.monotonic())
            time.sleep(0.05)

    spool = make_spool(tmp_path / "s", lease_seconds=1.5)
    ids = {spool.enqueue("k", {}, max_attempts=1).id for _ in range(8)}
    report = Worker(spool, {"k": reports}, concurrency=8, maintenance=False).run_until_idle()
    assert report.completed == 8
    assert written == ids


def test_junk_progress_files_are_pruned(tmp_path: Path) -> None:
    from jobspool.queue.jobprogress import PROGRESS_DIR, prune_stale_progress

    spool = make_spool(tmp_path / "s")
    directory = spool.root / PROGRESS_DIR
    directory.mkdir(exist_ok=True)
    for name in ("bad id!.3.json", ".hidden.2.json", "x" * 240 + ".1.json"):
        (directory / name).write_text("{}")
    assert prune_stale_progress(spool) == 3
    assert list(directory.iterdir()) == []
