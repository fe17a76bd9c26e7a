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


@pytest.mark.parametrize("huge", [2**62, 2**62 - 2, 2**61 + 1, 2**63 - 1])
def test_a_row_with_a_huge_fence_is_not_followed(tmp_path: Path, huge: int) -> None:
    """Followed, a fence at or near the bound handed every later write a token past it:
    each failed, for good (the spool's tokens never go back)."""
    proj = str(tmp_path / "proj")
    rows = LanceProjection(proj, "t")
    rows.upsert({"id": "x", "text": "first"}, version=1.0, fence=0)
    table = lancedb.connect(proj).open_table("t")
    table.update(where="id = 'x'", values={"fence": huge})  # by hand, or a fence given so
    with Spool(tmp_path / "spool") as spool:
        for i in range(3):
            spool.enqueue("w", {}, job_id=f"j{i}")
        report = Worker(spool, handlers={"w": _write}, projection=proj,
                        maintenance=False).run_until_idle()
        assert report.dead_lettered == 0 and report.completed == 3
        assert spool.stats().fence < 2**61  # its tokens were not pushed up to the bound
        job = spool.get("j2")
        assert job is not None and job.state is JobState.COMPLETED


def test_a_huge_fence_in_one_table_does_not_stop_following_the_others(tmp_path: Path) -> None:
    """An older spool's rows (fences up to 50) and one row fenced by hand past 2**61: the
    rows below are still followed, so a fresh spool's write of a key wins. Ignoring them all
    for that one row lost the new run's write to the old one, silently."""
    proj = str(tmp_path / "proj")
    LanceProjection(proj, "t").upsert({"id": "x", "text": "old spool"}, fence=50)
    LanceProjection(proj, "other").upsert({"id": "y", "text": "hand"}, fence=2**62)

    def write_x(job: Job, ctx: Context) -> None:
        ctx.upsert("t", {"id": "x", "text": "new run"})  # its version: its token

    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("w", {}, job_id="j1")
        report = Worker(spool, handlers={"w": write_x}, projection=proj,
                        maintenance=False).run_until_idle()
        assert report.completed == 1
        assert 50 < spool.stats().fence < 2**61
    assert LanceProjection(proj, "t").get("x")["text"] == "new run"  # type: ignore[index]
