"""The two-phase path when recovery and the producer disagree (both stores).

- A producer slower than `prepare_grace_seconds` whose job recovery dead-lettered (its replay
  hook said "unknown" until attempts ran out) commits after all: its change happened, so the
  job runs. Before, `commit` returned the dead letter without a word and the job never ran.
- A replay hook's "committed" publishes the job as its producer's commit would have: a
  delayed job waits for its time instead of running at once.
- A batch of many caller-given ids on PostgreSQL (one advisory lock per id ran out of the
  server's lock table: "out of shared memory", retried for 30 s as an outage, for ever).
"""

from __future__ import annotations

import time
from pathlib import Path

from jobspool import JobState
from tests.spools import make_spool


def test_a_late_commit_publishes_a_job_recovery_gave_up_on(store_root: str | Path) -> None:
    with make_spool(store_root, prepare_grace_seconds=0.1) as spool:
        reservation = spool.prepare("charge", {"order": 7}, max_attempts=1)
        time.sleep(0.3)  # the producer is slow past the grace period
        spool.recover(replay={"charge": lambda job: "unknown"})
        assert spool.get(reservation.job_id).state is JobState.DEAD_LETTER
        job = spool.commit(reservation)  # ...and its change did happen
        assert job.state is JobState.READY
        assert (job.attempts, job.last_error) == (0, None)
        [lease] = spool.claim(kinds="charge")
        assert lease.job_id == reservation.job_id
        assert spool.commit(reservation).state is JobState.LEASED  # idempotent afterwards


def test_a_replayed_commit_keeps_the_jobs_delay(store_root: str | Path) -> None:
    with make_spool(store_root, prepare_grace_seconds=0.1) as spool:
        spool.prepare("remind", {"u": 2}, job_id="b", delay=3600)  # its producer dies
        time.sleep(0.3)
        spool.recover(replay={"remind": lambda job: "committed"})
        job = spool.get("b")
        assert job.state is JobState.RETRYABLE
        assert job.run_at > time.time() + 3000
        assert spool.claim(kinds="remind") == []


def test_a_big_batch_of_given_ids_is_taken_whole(store_root: str | Path) -> None:
    # Past the lock table of the test server (max_connections 300: ~19,200 entries).
    n = 40_000 if isinstance(store_root, str) else 5_000
    with make_spool(store_root) as spool:
        jobs = spool.enqueue_many("k", list(range(n)), job_ids=[f"n-{i}" for i in range(n)])
        assert len(jobs) == n
        assert spool.get(f"n-{n - 1}").payload == n - 1
        again = spool.enqueue_many("k", list(range(n)), job_ids=[f"n-{i}" for i in range(n)],
                                   on_conflict="replace")
        assert len(again) == n
