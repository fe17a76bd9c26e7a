"""Two-phase jobs and what the stores report about them, on both stores (a differential probe
found the PostgreSQL store disagreeing with the file spool):

- recovery counts a replay under the verdict that wrote it, and only when it wrote: a delayed
  job the hook committed was "unresolved", a job its producer committed while the hook ran
  was "replayed";
- a clock that reads the same twice (a test's frozen clock) does not make an earlier job
  "this call's own": a duplicate passed `on_conflict="error"`, a canceled job was not
  reopened;
- aborts and cancels are terminal writes that count toward retention;
- a producer that aborts late cancels the job recovery dead-lettered unresolved, as a late
  commit publishes it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.errors import DuplicateJob, InvalidJob, InvalidTransition
from tests.spools import make_spool


def test_recovery_reports_what_each_verdict_wrote(store_root: str | Path) -> None:
    now = [time.time()]
    with make_spool(store_root, clock=lambda: now[0], prepare_grace_seconds=10) as spool:
        spool.prepare("later", None, job_id="delayed", delay=3600)
        raced = spool.prepare("raced", None, job_id="raced")
        spool.prepare("joined", None, job_id="joined")
        now[0] += 20

        def producer_commits(job: object) -> str:
            spool.commit(raced)  # the producer speaks while recovery asks
            return "aborted"

        def another_producer_prepares(job: object) -> str:
            spool.prepare("joined", None, job_id="joined")
            return "aborted"

        report = spool.recover({"later": lambda job: "committed", "raced": producer_commits,
                                "joined": another_producer_prepares})
        assert report.replayed_committed == ("delayed",)
        assert report.replayed_aborted == ()
        assert report.replay_unknown == ()
        assert spool.get("delayed").state is JobState.RETRYABLE
        assert spool.get("raced").state is JobState.READY
        joined = spool.get("joined")
        assert (joined.state, joined.attempts, len(joined.reservations)) == (
            JobState.PREPARED, 0, 2)


def test_a_frozen_clock_still_tells_a_duplicate_from_a_resend(store_root: str | Path) -> None:
    frozen = float(int(time.time()))
    with make_spool(store_root, clock=lambda: frozen) as spool:
        assert spool.enqueue_result("k", {"a": 1}, job_id="x").outcome == "created"
        with pytest.raises(DuplicateJob):
            spool.enqueue_result("k", {"a": 1}, job_id="x", on_conflict="error")
        assert spool.enqueue_result("k", {"a": 1}, job_id="x").outcome == "existing"
        spool.cancel("x")
        reopened = spool.enqueue_result("k", {"a": 1}, job_id="x")
        assert reopened.outcome == "reopened"
        assert spool.get("x").state is JobState.READY
        spool.enqueue("k", {"a": 1}, job_id="y")
        spool.cancel("y")
        assert spool.enqueue_result("k", {"a": 1}, job_id="y",
                                    on_conflict="replace").outcome != "created"
        assert spool.get("y").state is JobState.READY


def test_aborts_and_cancels_count_toward_retention(store_root: str | Path) -> None:
    with make_spool(store_root, keep_terminal=5) as spool:
        for i in range(150):
            spool.abort(spool.prepare("k", i, job_id=f"b{i}"))
        assert spool.stats().counts["canceled"] < 150
        for i in range(150):
            spool.enqueue("k", i, job_id=f"c{i}")
            spool.cancel(f"c{i}")
        assert spool.stats().counts["canceled"] < 150
        spool.enqueue_many("m", list(range(150)))
        spool.cancel_matching(kind="m")
        assert spool.stats().counts["canceled"] < 150


def test_requeue_all_names_a_bad_state(store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        with pytest.raises(InvalidJob, match="'bogus' is not a job state"):
            spool.requeue_all("bogus")
        with pytest.raises(InvalidTransition, match="takes dead_letter, canceled or completed") \
                as refused:
            spool.requeue_all("ready")
        assert "'*'" not in str(refused.value)
        with pytest.raises(InvalidJob, match="requeue_all needs a state"):
            spool.requeue_all(None)  # type: ignore[arg-type]


def test_a_late_abort_cancels_the_job_recovery_gave_up_on(store_root: str | Path) -> None:
    with make_spool(store_root, prepare_grace_seconds=0.1) as spool:
        first = spool.prepare("charge", {"order": 7}, job_id="o7", max_attempts=1)
        second = spool.prepare("charge", {"order": 7}, job_id="o7", max_attempts=1)
        time.sleep(0.3)  # both producers are slow past the grace period
        spool.recover(replay={"charge": lambda job: "unknown"})
        assert spool.get("o7").state is JobState.DEAD_LETTER
        assert spool.abort(first) is None  # another producer still holds it
        assert spool.get("o7").state is JobState.DEAD_LETTER
        with pytest.raises(InvalidTransition, match="released by an abort"):
            spool.commit(first)  # its producer aborted: it cannot publish the job now
        canceled = spool.abort(second)  # ...and rolled its change back too
        assert canceled is not None and canceled.state is JobState.CANCELED
        assert spool.get("o7").state is JobState.CANCELED
        assert spool.requeue_all() == []  # nothing dead to run by mistake


def test_an_abort_after_the_job_was_requeued_changes_nothing(store_root: str | Path) -> None:
    with make_spool(store_root, prepare_grace_seconds=0.1) as spool:
        held = spool.prepare("charge", {"order": 8}, job_id="o8", max_attempts=1)
        time.sleep(0.3)
        spool.recover(replay={"charge": lambda job: "unknown"})
        spool.requeue("o8")  # an operator ran it again: no producer holds it any more
        assert spool.get("o8").reservations == ()
        assert spool.abort(held) is None
        assert spool.get("o8").state is JobState.READY


def test_a_producer_joining_a_job_recovery_gave_up_on_can_commit_or_abort_it(
        store_root: str | Path) -> None:
    """Before, its `prepare` handed back a reservation the job never recorded, and its
    commit was refused as "reservation released", a release it never made."""
    with make_spool(store_root, prepare_grace_seconds=0.1) as spool:
        slow = spool.prepare("charge", {"order": 9}, job_id="o9", max_attempts=1)
        time.sleep(0.3)
        spool.recover(replay={"charge": lambda job: "unknown"})
        assert spool.get("o9").state is JobState.DEAD_LETTER
        joined = spool.prepare("charge", {"order": 9}, job_id="o9")
        assert joined.job.state is JobState.DEAD_LETTER
        assert spool.get("o9").reservations == (slow.reservation_id, joined.reservation_id)
        assert spool.abort(joined) is None  # the slow producer still holds it
        assert spool.get("o9").reservations == (slow.reservation_id,)
        again = spool.prepare("charge", {"order": 9}, job_id="o9")
        published = spool.commit(again)
        assert published.state is JobState.READY
        assert published.reservations == ()
        assert spool.commit(slow).state is JobState.READY  # idempotent once published


def test_a_commit_of_a_reservation_never_held_names_it(store_root: str | Path) -> None:
    # "in state 'prepared (reservation released)'": the holder of a mixed-up reservation
    # went looking for an abort nobody made.
    with make_spool(store_root) as spool:
        held = spool.prepare("charge", {"order": 8}, job_id="o8")
        with pytest.raises(InvalidTransition, match="holds no reservation 'zzz'") as err:
            spool.commit(dataclasses.replace(held, reservation_id="zzz"))
        assert err.value.job_id == "o8"
        assert spool.get("o8").state is JobState.PREPARED  # nothing changed
        assert spool.commit(held).state is JobState.READY
