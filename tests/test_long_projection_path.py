"""A projection path too long for the filesystem: the error that defers the job names the
cause. The path came first in the one-line summaries and used them up; "File name too
long" was cut off, in the log and in the job's last_error (a projection probe)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobspool import App, Worker
from tests.spools import make_spool


def _put(job: object, ctx: object) -> None:
    ctx.upsert("notes", {"id": "a", "v": 1})  # type: ignore[attr-defined]


def test_a_too_long_projection_path_is_named_with_its_cause(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    projection = tmp_path / ("x" * 300) / "db"
    with make_spool(tmp_path / "s") as spool:
        job = spool.enqueue("put", {})
        worker = Worker(spool, App(handlers={"put": _put}, projection=str(projection)),
                        maintenance=False)
        with caplog.at_level(logging.ERROR, logger="jobspool"):
            worker.run_until_idle()
        last_error = spool.get(job.id).last_error
    assert last_error is not None and "File name too long" in last_error, last_error
    logged = [r.getMessage() for r in caplog.records if "could not be written" in r.getMessage()]
    assert logged and "File name too long" in logged[0]
    assert len(last_error) < 600 and "x" * 100 not in last_error


def test_one_line_cuts_long_words_before_the_line() -> None:
    from jobspool.projection.faults import one_line

    text = one_line("cannot open\n" + "/p/" + "y" * 500 + ": Permission denied " + "z" * 400)
    assert text.startswith("cannot open /p/yyy") and "Permission denied" in text
    assert len(text) <= 300 and "\n" not in text
