"""Fences a projection write may carry: 0 to 2**62. A fence of 2**63 failed as "commit
failed, outcome unknown: OverflowError" (nothing could have been written); one of
2**63-1 was stored, and the next worker raised its spool's tokens above it, so every
later write failed with OverflowError until its jobs were dead-lettered."""

from __future__ import annotations

from pathlib import Path

import lancedb
import pytest

from jobspool import Context, Job, JobState, ProjectionError, Spool, Worker
from jobspool.projection.lance import LanceProjection


@pytest.mark.parametrize("fence", [2**63, 2**64, 2**62 + 1, -1])
def test_a_fence_out_of_range_is_refused_in_one_line(tmp_path: Path, fence: int) -> None:
    rows = LanceProjection(str(tmp_path / "proj"), "t")
    with pytest.raises(ProjectionError, match=r"'fence' must be an integer from 0 to 2\*\*62"):
        rows.upsert({"id": "x", "text": "a"}, fence=fence)
    assert rows.count() == 0


def _write(job: Job, ctx: Context) -> None:
    ctx.upsert("t", {"id": "x", "text": "worker"}, version=2.0)


def test_a_row_with_a_huge_fence_written_by_hand_is_not_followed(tmp_path: Path) -> None:
    proj = str(tmp_path / "proj")
    rows = LanceProjection(proj, "t")
    rows.upsert({"id": "x", "text": "first"}, version=1.0, fence=2**62)  # the most allowed
    table = lancedb.connect(proj).open_table("t")
    table.update(where="id = 'x'", values={"fence": 2**63 - 1})  # a hand edit past it
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("w", {}, job_id="j1")
        report = Worker(spool, handlers={"w": _write}, projection=proj,
                        maintenance=False).run_until_idle()
        assert report.dead_lettered == 0
        assert spool.stats().fence < 2**62  # its tokens were not pushed past the column
        job = spool.get("j1")
        assert job is not None and job.state is JobState.COMPLETED
