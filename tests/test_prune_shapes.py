"""A prune by count, by age, or both, on both stores: the PostgreSQL store sends one
statement text per shape (which states keep a number, whether an age applies), so that each
shape's bound is an index condition; each must remove exactly what the file spool does."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import JobState
from tests.spools import make_spool


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _finish(spool, clock: _Clock, ids: list[str], at: float) -> None:  # type: ignore[no-untyped-def]
    clock.now = at
    for job_id in ids:
        spool.enqueue("k", {}, job_id=job_id)
        [lease] = spool.claim(kinds="k")
        if job_id.startswith("d"):
            spool.fail(lease, "broken", retryable=False)
        else:
            spool.complete(lease, None)


@pytest.mark.parametrize(("options", "completed_left", "dead_left"), [
    ({"keep": 1}, ["c3"], ["d0", "d1"]),
    ({"keep": 0}, [], ["d0", "d1"]),
    ({"older_than": 50.0}, ["c2", "c3"], ["d0", "d1"]),
    ({"keep": 3, "older_than": 50.0}, ["c1", "c2", "c3"], ["d0", "d1"]),
    ({"keep": 1, "older_than": 50.0}, ["c2", "c3"], ["d0", "d1"]),
    ({"keep": 1, "keep_dead": 1}, ["c3"], ["d1"]),
    ({"keep": 0, "keep_dead": 0}, [], []),
    ({"older_than": 500.0}, ["c0", "c1", "c2", "c3"], ["d0", "d1"]),
])
def test_each_prune_shape_removes_what_the_rule_says(
        store_root: str | Path, options: dict[str, float], completed_left: list[str],
        dead_left: list[str]) -> None:
    clock = _Clock()
    with make_spool(store_root, clock=clock, keep_terminal=100) as spool:
        _finish(spool, clock, ["d0", "d1"], 1_000_100.0)
        _finish(spool, clock, ["c0", "c1"], 1_000_100.0)
        _finish(spool, clock, ["c2", "c3"], 1_000_200.0)
        clock.now = 1_000_220.0
        spool.prune(**options)  # type: ignore[arg-type]
        assert sorted(j.id for j in spool.jobs(state=JobState.COMPLETED)) == completed_left
        assert sorted(j.id for j in spool.jobs(state=JobState.DEAD_LETTER)) == dead_left
