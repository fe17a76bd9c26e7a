"""Replays that could not tell ("unknown") count against a prepared job's attempts, so
that a job nobody can resolve is dead-lettered in the end (DESIGN §6). Once its producer
commits (or a replay says "committed"), the job never ran: it gets its full attempts. Two
"unknown" replays of a slow producer's job left it one run of three."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from jobspool import JobState, Spool, Worker
from jobspool.errors import InvalidType


def slow_producer(make_any_spool: Callable[..., Spool]) -> tuple[Spool, Any]:
    spool = make_any_spool(prepare_grace_seconds=0, max_attempts=3, retry_base_seconds=0,
                           retry_max_seconds=0)
    reservation = spool.prepare("k", {"n": 1}, job_id="slow")
    for _ in range(2):
        time.sleep(0.02)
        report = spool.recover(replay={"k": lambda job: "unknown"})
        assert report.replay_unknown == ("slow",)
    assert spool.get("slow").attempts == 2
    return spool, reservation


@pytest.mark.parametrize("published_by", ["commit", "replay"])
def test_a_committed_job_gets_its_full_attempts_after_unknown_replays(
        make_any_spool: Callable[..., Spool], published_by: str) -> None:
    spool, reservation = slow_producer(make_any_spool)
    if published_by == "commit":
        job = spool.commit(reservation)
    else:
        time.sleep(0.02)
        assert spool.recover(replay={"k": lambda job: "committed"}).replayed_committed == ("slow",)
        job = spool.get("slow")
    assert job.state is JobState.READY and job.attempts == 0 and job.last_error is None
    runs: list[int] = []

    def flaky(job: Any, ctx: Any) -> None:
        runs.append(job.attempts)
        raise RuntimeError("transient")

    Worker(spool, {"k": flaky}).run_until_idle(wait_for_retries=10)
    assert runs == [1, 2, 3]
    assert spool.get("slow").state is JobState.DEAD_LETTER


@pytest.mark.parametrize("replay", [{"k": "committed"}, 42, {"k": None}, "committed"],
                         ids=["str-hook", "int", "none-hook", "str"])
def test_replay_hooks_that_are_not_callables_are_refused_before_anything_is_counted(
        make_any_spool: Callable[..., Spool], replay: Any) -> None:
    spool = make_any_spool(prepare_grace_seconds=0)
    spool.prepare("k", job_id="p")
    time.sleep(0.02)
    with pytest.raises(InvalidType, match="replay") as caught:
        spool.recover(replay=replay)
    assert "\n" not in str(caught.value)
    job = spool.get("p")
    assert job.state is JobState.PREPARED and job.attempts == 0
