"""Automatic pruning under `keep_terminal_seconds` does not read a directory again before
its next job is old enough to go. It read all of `completed/` at every automatic prune and
removed nothing while every job was younger than the age: with 50,000 completed jobs each
batch of completions took longer than the one before (a scale probe)."""

from __future__ import annotations

from pathlib import Path

import pytest

import jobspool.recovery.prune as prune_mod
from tests.helpers_spool import FakeClock
from tests.spools import make_spool


def test_young_completed_jobs_are_read_once_then_pruned_when_old_enough(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    reads: list[str] = []
    real = prune_mod._scan  # noqa: SLF001 - the seam: each read of a terminal directory

    def counted(spool: object, state: object) -> object:
        reads.append(str(state))
        return real(spool, state)  # type: ignore[arg-type]

    monkeypatch.setattr(prune_mod, "_scan", counted)
    with make_spool(tmp_path / "s", clock=clock, keep_terminal=10,
                    keep_terminal_seconds=3600) as spool:
        def finish(n: int) -> None:
            spool.enqueue_many("k", [{}] * n)
            for lease in spool.claim(limit=n):
                spool.complete(lease)

        finish(200)  # over the count, every one of them too young to go
        assert spool.stats().counts["completed"] == 200
        first = len(reads)
        assert first >= 1
        clock.advance(60)
        finish(400)  # several automatic prunes' worth of completions
        assert len(reads) == first  # not read again before the first can go
        assert spool.stats().counts["completed"] == 600
        clock.advance(3600)  # the first 200 are old enough now
        finish(100)
        assert len(reads) > first
        assert spool.stats().counts["completed"] == 500  # the old ones went; the rest stay
