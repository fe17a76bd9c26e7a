"""A run's end waits for projection maintenance in progress only within a stop's grace.

The end of every run joined the maintenance beat (a LanceDB compaction step in progress)
for up to 30 s, past `--grace` whatever was asked: a worker stopped with `--grace 2` could
take 32 s to exit. After a stop it now waits what is left of the grace, after a hurry
nothing; a run that drained the queue still waits up to 30 s. What a step left is one lance
commits whole or not at all, retried by a later run.
"""

from __future__ import annotations

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

    def close(self: Beat, timeout: float | None = 30.0) -> None:
        seen.append(timeout)
        original(self, timeout)

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
