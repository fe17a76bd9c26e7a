"""A prune removes the job its scan saw, never a newer job under the same id.

A prune scans without the lock, then removes its victims under it, checking each is still
the version it saw. The check was the revision alone: an id pruned elsewhere meanwhile,
enqueued again, claimed and completed is back at the same revision, so the prune removed
the new job milliseconds after its completion, its result lost (a retention probe: 112
jobs in 13 s, with `older_than=1`). Recovery's replay of prepared jobs had the same check.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import jobspool.recovery.prune as prune_module
from jobspool import JobState, Spool


def _finish(spool: Spool, job_id: str, result: str) -> None:
    spool.enqueue("k", {}, job_id=job_id)
    (lease,) = spool.claim()
    spool.complete(lease, result)


def test_a_prune_keeps_a_job_that_reused_a_pruned_id(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool, Spool(root) as other:
        _finish(spool, "X", "old")
        time.sleep(0.01)
        _finish(spool, "Y", "y")
        real = prune_module._remove
        calls = 0

        def meanwhile(journal: Any, victims: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:  # the other prune's own removal
                return real(journal, victims)
            # Between the scan and the removal: old X pruned elsewhere, the id used again.
            assert other.prune(keep=1).counts["completed"] == 1
            _finish(other, "X", "new")
            assert other.get("X").revision == next(v for v in victims if v.job_id == "X").revision
            return real(journal, victims)

        monkeypatch.setattr(prune_module, "_remove", meanwhile)
        report = spool.prune(keep=1)
        monkeypatch.setattr(prune_module, "_remove", real)
        assert report.counts["completed"] == 0
        job = spool.get("X")
        assert (job.state, job.result) == (JobState.COMPLETED, "new")
