"""A handler's error that JSON cannot hold (a lone surrogate: a file name made of non-UTF-8
bytes by `os.fsdecode`, put in an exception's message) is still that job's failure, recorded
with the surrogate written out, never the worker's crash (DESIGN §9: a failure can always be
recorded). Before, the worker crashed settling the batch and the job went back uncounted, to
crash every worker that claimed it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobspool import Fail, JobState, Retry, Worker
from tests.spools import make_spool

NAME = os.fsdecode(b"report-\xff.csv")  # 'report-\udcff.csv'


def _raise_value_error(job, ctx):  # type: ignore[no-untyped-def]
    raise ValueError(f"cannot parse {NAME}")


async def _raise_async(job, ctx):  # type: ignore[no-untyped-def]
    raise ValueError(f"cannot parse {NAME}")


def _retry(job, ctx):  # type: ignore[no-untyped-def]
    raise Retry(f"cannot parse {NAME}")


def _fail(job, ctx):  # type: ignore[no-untyped-def]
    raise Fail(f"cannot parse {NAME}")


@pytest.mark.parametrize(("handler", "state"), [
    (_raise_value_error, JobState.RETRYABLE), (_raise_async, JobState.RETRYABLE),
    (_retry, JobState.RETRYABLE), (_fail, JobState.DEAD_LETTER)])
def test_an_error_with_a_lone_surrogate_is_recorded(store_root: str | Path, handler: object,
                                                    state: JobState) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("parse", job_id="p1")
        spool.enqueue("ok", job_id="ok1")
        report = Worker(spool, handlers={"parse": handler, "ok": lambda job, ctx: "fine"}
                        ).run_until_idle()
        job = spool.get("p1")
        assert (job.state, job.attempts) == (state, 1)
        assert "report-\\udcff.csv" in (job.last_error or "")
        if handler in (_raise_value_error, _raise_async):
            assert "report-\\udcff.csv" in (job.traceback or "")
        assert spool.get("ok1").state is JobState.COMPLETED
    assert report.crashes == 0
    assert report.completed == 1


def test_spool_fail_takes_such_an_error_too(store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("parse", job_id="p1")
        [lease] = spool.claim(kinds="parse")
        job = spool.fail(lease, f"cannot parse {NAME}", retryable=False)
        assert job.state is JobState.DEAD_LETTER
        assert spool.get("p1").last_error == "cannot parse report-\\udcff.csv"
