"""Bulk cancel and requeue against jobs that move while they run (helper probe, 2026-12-04).

Before: each listed id was re-read only in the state it was listed in, so a job that
moved meanwhile (a retry cycling through `leased` and `retryable`) was skipped without
a word, and kept running after "cancel every job of this kind"; a crash's stale copy
(a completed job's old `dead_letter` file) was the one requeued, counted as requeued
though the job stayed completed; and `requeue_all` held the spool lock for the whole
set (20,000 dead letters: every producer stalled for 7 s).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.queue import bulk
from jobspool.queue import store as store_mod


def _after_listing(spool: Spool, state: str, then: Callable[[], None],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `then` right after the first listing of `state` (before any job is re-read)."""
    real = spool.store.names
    armed = {"on": True}

    def names(directory: str) -> list[str]:
        out = real(directory)
        if armed["on"] and directory == state:
            armed["on"] = False
            then()
        return out

    monkeypatch.setattr(spool.store, "names", names)


def test_a_job_that_moves_to_an_already_listed_state_is_still_canceled(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue_many("r", [{}, {}], job_ids=["a", "b"])
    lease_a, _lease_b = spool.claim(limit=2)
    spool.fail(lease_a, "again", delay=0)  # a: retryable, due now; b: leased
    taken: list[Any] = []
    # While the cancel lists `retryable`, a worker claims `a` again (into `leased`).
    _after_listing(spool, "retryable", lambda: taken.extend(spool.claim(kinds="r")),
                   monkeypatch)
    canceled = spool.cancel_matching(kind="r")
    assert [lease.job_id for lease in taken] == ["a"]
    assert sorted(j.id for j in canceled) == ["a", "b"]
    assert {j.id: j.state for j in spool.jobs()} == {"a": JobState.CANCELED,
                                                     "b": JobState.CANCELED}


def test_a_stale_copy_left_by_a_crash_is_not_what_a_bulk_requeue_moves(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue("k", job_id="d", max_attempts=1)
    spool.fail(spool.claim()[0], "boom", retryable=False)
    assert spool.get("d").state is JobState.DEAD_LETTER
    spool.store.pool_size = 0  # superseded files are unlinked: make that unlink fail once
    real_unlink = store_mod.os_unlink
    calls = {"n": 0}

    def unlink_failing_once(path: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "injected I/O error", str(path))
        real_unlink(path)

    with monkeypatch.context() as m:
        m.setattr(store_mod, "os_unlink", unlink_failing_once)
        spool.requeue("d")  # ready now, its dead_letter copy left behind
    assert (spool.root / "dead_letter" / "d.json").exists()
    spool.complete(spool.claim()[0], "done")
    assert spool.requeue_matching() == []  # nothing moved: the dead letter is stale
    assert spool.requeue_all() == []
    assert spool.get("d").state is JobState.COMPLETED
    spool.recover()
    assert [p.parent.name for p in spool.root.glob("*/d.json")] == ["completed"]


def test_requeue_all_commits_in_chunks(spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue_many("k", [{}] * 5, max_attempts=1)
    for lease in spool.claim(limit=5):
        spool.fail(lease, "boom", retryable=False)
    monkeypatch.setattr(bulk, "CHUNK", 2)
    holds: list[int] = []
    real_commit = spool.journal.commit_changes

    def commit(pairs: Any, *args: Any, **kwargs: Any) -> None:
        holds.append(len(pairs))
        real_commit(pairs, *args, **kwargs)

    monkeypatch.setattr(spool.journal, "commit_changes", commit)
    requeued = spool.requeue_all()
    assert len(requeued) == 5 and holds == [2, 2, 1]
    assert {j.state for j in spool.jobs()} == {JobState.READY}
