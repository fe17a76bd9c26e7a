"""A projection table damaged or removed by hand under a running worker.

- `_versions/` deleted: the table was made anew inside its directory when the damage was
  less than 30 s old (it touched the directory, which read as another process's creation
  in progress), i.e. always for a running worker, which tries again within a second: its
  rows lost, a key's version 100 lost to a version 1 write, nothing said.
- A table dropped by hand while a worker held it open: the next job was charged an
  attempt for LanceDB's "Not found" (dead-lettered with max_attempts=1); it is a storage
  fault now, deferred uncounted, and the retry makes the table anew.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import lancedb
import pytest

from jobspool import App, Context, Job, JobState, Spool, Worker
from jobspool.projection.lance import LanceProjection


def _project(job: Job, ctx: Context) -> None:
    ctx.upsert("t", {"id": job.payload["key"], "n": job.payload["n"]}, version=job.payload["n"])


def _age_data_files(table: Path, seconds: float) -> None:
    """The table's rows were written `seconds` ago (its data files are that old)."""
    old = time.time() - seconds
    for f in (table / "data").iterdir():
        os.utime(f, (old, old))


@pytest.mark.parametrize("same_worker", [True, False])
def test_a_table_that_lost_its_versions_just_now_is_not_made_anew(
        tmp_path: Path, same_worker: bool) -> None:
    proj = tmp_path / "proj"
    app = App(handlers={"p": _project}, projection=str(proj))
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("p", {"key": "a", "n": 100}, job_id="k100")
        spool.enqueue("p", {"key": "b", "n": 1}, job_id="kb")
        worker = Worker(spool, app, maintenance=False)
        assert worker.run_until_idle().completed == 2
        table = proj / "t.lance"
        _age_data_files(table, 120)  # an established table
        shutil.rmtree(table / "_versions")  # the damage: a second ago, not 30
        spool.enqueue("p", {"key": "a", "n": 1}, job_id="stale", max_attempts=1)
        if not same_worker:
            worker = Worker(spool, app, maintenance=False)
        report = worker.run_until_idle(wait_for_retries=0)
        assert report.completed == 0 and report.deferred >= 1
        got = spool.get("stale")
        assert got is not None and (got.state, got.attempts) == (JobState.RETRYABLE, 0)
        assert not (table / "_versions").exists()  # nothing made in its place
        assert len(list((table / "data").iterdir())) >= 1  # the rows' files kept for a restore


def test_a_table_dropped_under_a_running_worker_costs_no_attempt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proj = tmp_path / "proj"
    app = App(handlers={"p": _project}, projection=str(proj))
    with Spool(tmp_path / "spool", retry_base_seconds=0.1, retry_max_seconds=0.2) as spool:
        spool.enqueue("p", {"key": "a", "n": 1})
        worker = Worker(spool, app, maintenance=False)
        assert worker.run_until_idle().completed == 1
        lancedb.connect(str(proj)).drop_table("t")
        spool.enqueue("p", {"key": "a", "n": 2}, job_id="after", max_attempts=1)
        caplog.set_level(logging.WARNING, logger="jobspool")
        report = worker.run_until_idle(wait_for_retries=0)
        assert report.deferred == 1 and report.dead_lettered == 0
        time.sleep(1.1)  # a deferral waits a second (a run of a script ends meanwhile)
        report = worker.run_until_idle(wait_for_retries=0)
        got = spool.get("after")
        assert got is not None and got.state is JobState.COMPLETED, (got, report)
        assert got.attempts == 1  # the deferral was not charged
        assert LanceProjection(str(proj), "t").get("a")["n"] == 2  # type: ignore[index]
        assert "creating it anew" in caplog.text


@pytest.mark.filterwarnings("ignore:optimize\\(cleanup_older_than=0\\):UserWarning")
def test_a_compacted_table_that_lost_its_versions_is_not_made_anew(tmp_path: Path) -> None:
    """After a compaction and cleanup the only data file is new, as a creation's are: the
    transaction files (a commit on top of version 3) say the table existed."""
    from datetime import timedelta

    proj = tmp_path / "proj"
    app = App(handlers={"p": _project}, projection=str(proj))
    with Spool(tmp_path / "spool") as spool:
        for i in range(4):
            spool.enqueue("p", {"key": f"k{i}", "n": 100})
            assert Worker(spool, app, maintenance=False).run_until_idle().completed == 1
        table = proj / "t.lance"
        lancedb.connect(str(proj)).open_table("t").optimize(cleanup_older_than=timedelta(0))
        shutil.rmtree(table / "_versions")
        spool.enqueue("p", {"key": "k0", "n": 1}, job_id="stale")
        report = Worker(spool, app, maintenance=False).run_until_idle(wait_for_retries=0)
        assert report.completed == 0 and report.deferred >= 1
        assert not (table / "_versions").exists()
