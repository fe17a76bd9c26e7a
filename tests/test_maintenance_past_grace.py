"""A run's end waits for projection maintenance in progress only within a stop's grace.

The end of every run joined the maintenance beat (a LanceDB compaction step in progress)
for up to 30 s, past `--grace` whatever was asked: a worker stopped with `--grace 2` could
take 32 s to exit. After a stop it now waits what is left of the grace, after a hurry
nothing; a run that drained the queue still waits up to 30 s. What a step left is one lance
commits whole or not at all, retried by a later run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Worker
from jobspool.projection.beat import Beat
from jobspool.queue.worker import MAINTENANCE_WAIT
from tests.spools import SpoolFactory
from tests.waiting import wait_until


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    seen: list[float | None] = []
    original = Beat.close

    def close(self: Beat, timeout: float | None = 30.0,
              give_up: Callable[[], bool] | None = None) -> None:
        seen.append(timeout)
        original(self, timeout, give_up)

    monkeypatch.setattr(Beat, "close", close)
    return seen


def _upsert(job: Any, ctx: Any) -> None:
    ctx.upsert("notes", {"id": job.id, "text": "x"})


def _stopping(worker: list[Worker], hurry: bool = False) -> Any:
    def handler(job: Any, ctx: Any) -> None:
        _upsert(job, ctx)
        worker[0].hurry() if hurry else worker[0].stop()
    return handler


def test_a_stopped_run_waits_for_maintenance_within_its_grace(
        make_spool: SpoolFactory, tmp_path: Path, waits: list[float | None]) -> None:
    spool = make_spool()
    spool.enqueue_many("note", [None] * 3)
    box: list[Worker] = []
    worker = Worker(spool, {"note": _stopping(box)}, projection=str(tmp_path / "index"),
                    grace_seconds=2.0)
    box.append(worker)
    worker.run_forever(handle_signals=False)
    assert waits and all(w is not None and w <= 2.0 for w in waits), waits


def test_a_hurried_run_does_not_wait_for_maintenance(
        make_spool: SpoolFactory, tmp_path: Path, waits: list[float | None]) -> None:
    spool = make_spool()
    spool.enqueue("note", None, job_id="first", priority=0)
    spool.enqueue("late", None, job_id="second", priority=1)
    box: list[Worker] = []

    def late(job: Any, ctx: Any) -> None:
        # Hurried once the first job's commit landed (a hurry drops commits not started).
        wait_until(lambda: spool.get("first").state is JobState.COMPLETED, 60,
                   "the first job's commit")
        box[0].hurry()

    worker = Worker(spool, {"note": _upsert, "late": late}, projection=str(tmp_path / "index"),
                    grace_seconds=60.0, concurrency=1, batch_size=1)
    box.append(worker)
    worker.run_forever(handle_signals=False)
    assert waits and all(w == 0.0 for w in waits), waits


def test_a_drained_run_waits_for_maintenance_as_before(
        make_spool: SpoolFactory, tmp_path: Path, waits: list[float | None]) -> None:
    spool = make_spool()
    spool.enqueue_many("note", [None] * 3)
    worker = Worker(spool, {"note": _upsert}, projection=str(tmp_path / "index"),
                    grace_seconds=2.0)
    assert worker.run_until_idle().completed == 3
    assert waits == [MAINTENANCE_WAIT]


def test_a_second_signal_ends_the_wait_for_a_maintenance_step(
        make_spool: SpoolFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait was worked out once, at the run's end: a hurry (the second SIGTERM) asked
    # during it did not cut it short (a regression probe: 20 s with --grace 20).
    from jobspool.projection.maintenance import MaintenanceBeat
    from jobspool.queue import worker as worker_module

    monkeypatch.setattr(worker_module, "MAINTENANCE_WAIT", 3600.0)
    in_step, release = threading.Event(), threading.Event()

    def slow_step(self: MaintenanceBeat, tables: list[str]) -> None:
        in_step.set()
        release.wait(300)  # a compaction step that takes its time

    monkeypatch.setattr(MaintenanceBeat, "_run", slow_step)
    made = MaintenanceBeat.__init__

    def at_once(self: MaintenanceBeat, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **{**kwargs, "interval": 0.0, "commit_threshold": 1})

    monkeypatch.setattr(MaintenanceBeat, "__init__", at_once)  # a step after each commit
    closing = threading.Event()
    close = Beat.close

    def waiting_close(self: Beat, *args: Any, **kwargs: Any) -> None:
        closing.set()
        close(self, *args, **kwargs)

    monkeypatch.setattr(Beat, "close", waiting_close)
    spool = make_spool()
    spool.enqueue_many("note", [None] * 3)
    worker = Worker(spool, {"note": _upsert}, projection=str(tmp_path / "index"),
                    grace_seconds=3600.0)
    run = threading.Thread(target=worker.run_until_idle, daemon=True)
    run.start()
    try:
        assert in_step.wait(120)
        worker.stop()  # a grace of an hour: the run's end waits for the step
        assert closing.wait(120)
        worker.hurry()  # the second signal, while it waits
        run.join(120)  # a guard against the wait, not a timing
        assert not run.is_alive(), "the run waited out the maintenance step after a hurry"
    finally:
        release.set()
