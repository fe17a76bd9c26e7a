"""The dashboard's "purge dead letters" removes the versions it read, no later one.

On PostgreSQL the purge deleted every id it had read still in `dead_letter`: a job
requeued and dead-lettered again between that read and the delete (or an id purged,
reused and dead again) was removed too, though it changed after the page's `until`. The
file spool already re-checked each version under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import jobspool.recovery.prune as prune_module
from jobspool import JobState, Spool
from jobspool.dashboard.actions import purge_dead


def _dead(spool: Spool, job_id: str) -> None:
    spool.enqueue("k", {}, job_id=job_id, max_attempts=1, on_conflict="replace")
    (lease,) = spool.claim(kinds="k")
    spool.fail(lease, "boom", retryable=False)


def test_a_dead_letter_changed_before_the_delete_is_not_purged(
        make_any_spool: Callable[..., Spool], monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_any_spool()
    _dead(spool, "a")
    _dead(spool, "b")
    until = max(j.updated_at for j in spool.jobs(JobState.DEAD_LETTER)) + 3600

    def again() -> None:  # between the purge's read and its delete
        spool.requeue("a")
        (lease,) = spool.claim(kinds="k")
        spool.fail(lease, "boom again", retryable=False)

    if hasattr(spool, "remove_terminal"):
        real_remove = spool.remove_terminal

        def remove(*args: Any) -> Any:
            again()
            return real_remove(*args)

        monkeypatch.setattr(spool, "remove_terminal", remove)
    else:
        real = prune_module._remove

        def hooked(journal: Any, victims: Any) -> Any:
            again()
            return real(journal, victims)

        monkeypatch.setattr(prune_module, "_remove", hooked)
    assert purge_dead(spool, "k", until) == "purged 1 dead letter of kind k"
    assert [j.id for j in spool.jobs(JobState.DEAD_LETTER)] == ["a"]
    assert spool.get("a").last_error == "boom again"
