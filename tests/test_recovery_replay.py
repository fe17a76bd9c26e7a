"""Replay of prepared jobs left behind by a producer that died (DESIGN §6 step 4).

A prepared job older than the grace period is put to its kind's hook:
"committed" publishes it, "aborted" cancels it, "unknown" (or an exception,
or any other answer) keeps it prepared with the attempt counted until
`max_attempts`, then dead-letters it. Without a hook it is reported and left.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from jobspool import Job, JobState, Spool
from tests.helpers_spool import assert_disk_consistent

GRACE = 300.0  # the default prepare_grace_seconds


def _orphan(spool: Spool, clock: Any, kind: str, job_id: str, **kw: Any) -> None:
    spool.prepare(kind, {"id": job_id}, job_id=job_id, **kw)
    clock.advance(GRACE + 1)


def test_committed_publishes_the_job(spool: Spool, clock: Any) -> None:
    _orphan(spool, clock, "note", "j")
    seen: list[Job] = []

    def hook(job: Job) -> str:
        seen.append(job)
        return "committed"

    report = spool.recover(replay={"note": hook})

    assert report.replayed_committed == ("j",)
    assert [j.payload for j in seen] == [{"id": "j"}]
    assert seen[0].state is JobState.PREPARED
    job = spool.get("j")
    assert job.state is JobState.READY and job.reservations == ()
    (lease,) = spool.claim()
    assert lease.job_id == "j"


def test_aborted_cancels_the_job(spool: Spool, clock: Any) -> None:
    _orphan(spool, clock, "note", "j")
    report = spool.recover(replay={"note": lambda job: "aborted"})
    assert report.replayed_aborted == ("j",)
    job = spool.get("j")
    assert job.state is JobState.CANCELED
    assert spool.claim() == []


def test_unknown_keeps_it_prepared_counts_the_attempt_and_waits_another_grace(
        spool: Spool, clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    _orphan(spool, clock, "note", "j", max_attempts=3)
    calls: list[str] = []

    def hook(job: Job) -> str:
        calls.append(job.id)
        return "unknown"

    report = spool.recover(replay={"note": hook})
    assert report.replay_unknown == ("j",)
    job = spool.get("j")
    assert job.state is JobState.PREPARED
    assert job.attempts == 1
    assert job.last_error and "unknown" in job.last_error

    again = spool.recover(replay={"note": hook})  # within the new grace period: not asked
    assert calls == ["j"] and not again.changed

    clock.advance(GRACE + 1)
    spool.recover(replay={"note": hook})
    assert spool.get("j").attempts == 2
    clock.advance(GRACE + 1)
    with caplog.at_level(logging.WARNING, logger="jobspool"):
        last = spool.recover(replay={"note": hook})
    assert any(getattr(r, "job_id", None) == "j" and "dead-lettered" in r.getMessage()
               for r in caplog.records), "a dead letter is never silent"
    assert last.dead_lettered == ("j",)
    assert last.replay_unknown == ()
    job = spool.get("j")
    assert job.state is JobState.DEAD_LETTER
    assert job.attempts == 3
    assert job.last_error and "replay unresolved" in job.last_error


def test_a_hook_that_raises_counts_as_unknown(spool: Spool, clock: Any) -> None:
    _orphan(spool, clock, "note", "j")

    def hook(job: Job) -> str:
        raise ConnectionError("database down")

    report = spool.recover(replay={"note": hook})
    assert report.replay_unknown == ("j",)
    job = spool.get("j")
    assert job.state is JobState.PREPARED and job.attempts == 1
    assert job.last_error and "database down" in job.last_error


@pytest.mark.parametrize("said", ["raise", "return"])
def test_a_hooks_huge_exception_or_answer_is_logged_clipped(
        spool: Spool, clock: Any, caplog: pytest.LogCaptureFixture, said: str) -> None:
    # Found by a two-phase probe: a 200,000-character message was logged whole, once per
    # job and recovery, while the job's own error was clipped.
    _orphan(spool, clock, "note", "j")

    def hook(job: Job) -> str:
        if said == "raise":
            raise RuntimeError("x" * 200_000)
        return "y" * 200_000

    with caplog.at_level(logging.WARNING, logger="jobspool"):
        report = spool.recover(replay={"note": hook})
    assert report.replay_unknown == ("j",)
    (line,) = [r.getMessage() for r in caplog.records if "replay hook for job j" in r.getMessage()]
    assert len(line) < 2000 and "characters cut" in line
    assert ("RuntimeError('xxx" if said == "raise" else "'yyy") in line


def test_an_answer_outside_the_three_counts_as_unknown(spool: Spool, clock: Any) -> None:
    _orphan(spool, clock, "note", "j")
    report = spool.recover(replay={"note": lambda job: "yes"})
    assert report.replay_unknown == ("j",)
    last_error = spool.get("j").last_error
    assert last_error and "'yes'" in last_error


def test_without_a_hook_the_job_is_reported_and_left_untouched(spool: Spool, clock: Any,
                                                               spool_root: Path) -> None:
    _orphan(spool, clock, "note", "a")
    _orphan(spool, clock, "other", "b")
    before = (spool_root / "prepared" / "a.json").read_bytes()

    bare = spool.recover()
    partial = spool.recover(replay={"other": lambda job: "aborted"})

    assert bare.prepared_pending == ("a", "b")
    assert not bare.changed
    assert partial.prepared_pending == ("a",)
    assert partial.replayed_aborted == ("b",)
    assert (spool_root / "prepared" / "a.json").read_bytes() == before


def test_one_callable_decides_for_every_kind(spool: Spool, clock: Any) -> None:
    _orphan(spool, clock, "note", "a")
    _orphan(spool, clock, "mail", "b")
    report = spool.recover(replay=lambda job: "committed" if job.kind == "note" else "aborted")
    assert report.replayed_committed == ("a",)
    assert report.replayed_aborted == ("b",)


def test_a_young_prepared_job_is_not_replayed(spool: Spool, clock: Any) -> None:
    spool.prepare("note", job_id="j")
    clock.advance(GRACE - 1)
    calls: list[str] = []
    report = spool.recover(replay={"note": lambda job: calls.append(job.id) or "aborted"})
    assert calls == []
    assert report.prepared_pending == ()
    assert spool.get("j").state is JobState.PREPARED


def test_the_producer_committing_during_the_hook_wins(spool: Spool, clock: Any,
                                                     spool_root: Path) -> None:
    reservation = spool.prepare("note", job_id="j")
    clock.advance(GRACE + 1)

    def slow_hook(job: Job) -> str:
        spool.commit(reservation)  # the "dead" producer was only slow
        return "aborted"

    report = spool.recover(replay={"note": slow_hook})

    assert report.replayed_aborted == ()
    assert spool.get("j").state is JobState.READY
    assert assert_disk_consistent(spool_root) == {"j": "ready"}


def test_a_failing_hook_does_not_stop_the_other_replays(spool: Spool, clock: Any) -> None:
    for job_id in ("a", "b", "c"):
        spool.prepare("note", job_id=job_id)
    clock.advance(GRACE + 1)

    def hook(job: Job) -> str:
        if job.id == "b":
            raise RuntimeError("boom")
        return "committed"

    report = spool.recover(replay={"note": hook})
    assert report.replayed_committed == ("a", "c")
    assert report.replay_unknown == ("b",)


@pytest.mark.parametrize("outcome,state", [("committed", "ready"), ("aborted", "canceled")])
def test_a_replayed_job_survives_a_second_recovery(spool: Spool, clock: Any, spool_root: Path,
                                                   outcome: str, state: str) -> None:
    _orphan(spool, clock, "note", "j")
    spool.recover(replay={"note": lambda job: outcome})
    assert not spool.recover(replay={"note": lambda job: "aborted"}).changed
    assert assert_disk_consistent(spool_root) == {"j": state}
