"""A projection LanceDB refuses as configured, before any I/O (an `az://` URI without an
account name, `oss://` without an endpoint): the worker stops in one line and charges no
job. Each run was charged an attempt ("could not read the projection's highest fencing
token: ValueError: Invalid input, ...") until the whole queue was dead-lettered."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import Context, Job, JobState, ProjectionUnusable, Spool, Worker
from tests.cli_harness import run_jobspool


def writes(job: Job, ctx: Context) -> None:
    ctx.upsert("docs", {"id": job.id, "n": 1})


handlers = {"w": writes}


@pytest.mark.parametrize("uri", ["az://container/x", "oss://bucket/x"])
def test_a_worker_stops_before_claiming_and_charges_nothing(spool: Spool, uri: str) -> None:
    jobs = [spool.enqueue("w", n) for n in range(3)]
    with pytest.raises(ProjectionUnusable, match="cannot be used as configured"):
        Worker(spool, handlers, projection=uri, maintenance=False).run_until_idle()
    for job in jobs:
        left = spool.get(job.id)
        assert (left.state, left.attempts) == (JobState.READY, 0)


def test_the_command_says_so_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue("w", 1)
    done = run_jobspool("run-until-idle", "--app", "tests.test_projection_unusable:handlers",
                        "--projection", "az://container/x", root=root)
    assert done.code == 1
    assert done.err.count("\n") == 1 and "cannot be used as configured" in done.err
    assert "no Azure account name" in done.err
    with Spool(root) as spool:
        assert spool.stats()["ready"] == 1
