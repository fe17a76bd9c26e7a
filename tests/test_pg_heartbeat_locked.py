"""PostgreSQL: a heartbeat meeting a row lock another transaction holds (an enqueue of the
same id deciding "existing", a cancel, a commit) waits for it and extends the lease. It
skipped such rows and returned the lease unextended as if extended: 1,419 of 2,000 beats
beside two producers re-enqueueing the id; a caller asking for 600 s kept its 2 s lease
and lost it. Rows held by a `fenced` block of this process are still skipped (the block
extends the lease as it ends): the worker's beat never waits out a handler's block."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tests.spools import make_spool


def test_a_heartbeat_waits_for_a_brief_row_lock_and_extends(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="a")
        (lease,) = spool.claim(lease_seconds=5)
        other = psycopg.connect(pg_url)
        other.execute("SELECT 1 FROM jobspool_jobs WHERE id = 'a' FOR UPDATE")
        releaser = threading.Timer(0.3, other.rollback)
        releaser.start()
        try:
            beat = spool.heartbeat(lease, lease_seconds=600)
        finally:
            releaser.join()
            other.close()
        assert beat.expires_at > time.time() + 500
        assert beat.job.revision == lease.job.revision + 1
        assert spool.get("a").lease.expires_at == beat.expires_at


def test_heartbeats_beside_producers_re_enqueueing_the_id_all_extend(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="b")
        (lease,) = spool.claim(lease_seconds=30)
        stop = threading.Event()

        def produce() -> None:
            with make_spool(pg_url) as producer:
                while not stop.is_set():
                    producer.enqueue("k", 1, job_id="b")  # "existing": locks the row

        threads = [threading.Thread(target=produce) for _ in range(2)]
        for t in threads:
            t.start()
        unextended = 0
        try:
            for _ in range(300):
                before = lease.job.revision
                lease = spool.heartbeat(lease)
                unextended += lease.job.revision == before
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert unextended == 0


def test_a_beat_beside_this_process_s_own_fenced_block_does_not_wait(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The beat returns while the block still holds the row: it did not wait for the lock
    (set to a minute here, so a wait would outlast the test's hang guard)."""
    from jobspool.pg import beats

    monkeypatch.setattr(beats, "HEARTBEAT_LOCK_WAIT", 60.0)
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="c")
        (lease,) = spool.claim(lease_seconds=600)  # the wait: a quarter of it, capped at 60 s
        inside, leave, beaten = threading.Event(), threading.Event(), threading.Event()
        got: list[Any] = []

        def block() -> None:
            with spool.fenced(lease):
                inside.set()
                leave.wait(60)

        def beat() -> None:
            got.append(spool.heartbeat(lease))
            beaten.set()

        holder = threading.Thread(target=block)
        holder.start()
        try:
            assert inside.wait(10)
            beater = threading.Thread(target=beat)
            beater.start()
            returned_while_held = beaten.wait(30)  # a hang guard, not a timing
        finally:
            leave.set()
            holder.join()
        beater.join()
        assert returned_while_held
        assert got[0].token == lease.token  # current: the block extends it as it ends
        assert spool.get("c").lease.expires_at > lease.expires_at


def test_a_statement_timeout_shorter_than_the_lock_wait_reports_what_was_extended(
        pg_url: str) -> None:
    """A connection given `statement_timeout=500` (in the URL's options): the wait for a
    row held longer is cut by it; the beat still reports every lease, the free one
    extended and the held one as it stands, instead of failing whole."""
    url = pg_url + "%20-cstatement_timeout%3D500" if "options=" in pg_url else \
        pg_url + ("&" if "?" in pg_url else "?") + "options=-cstatement_timeout%3D500"
    with make_spool(url) as spool:
        spool.enqueue("k", 1, job_id="a")
        spool.enqueue("k", 2, job_id="b")
        leases = {x.job_id: x for x in spool.claim(limit=2, lease_seconds=30)}
        other = psycopg.connect(pg_url)
        other.execute("SELECT 1 FROM jobspool_jobs WHERE id = 'a' FOR UPDATE")
        try:
            beats = spool.heartbeat_many([leases["a"], leases["b"]], lease_seconds=600)
        finally:
            other.rollback()
            other.close()
        held, free = beats
        assert free.expires_at > time.time() + 500
        assert held.expires_at < time.time() + 60  # reported as it stands


def test_a_row_held_by_another_transaction_does_not_cost_other_jobs_their_short_leases(
        pg_url: str) -> None:
    # Found by a probe: the beat's wait for the held row (a fixed 2 s) held the heartbeat
    # thread past the 1.5 s leases of every other job, which were lost and dead-lettered.
    from jobspool import Context, Job, JobState, Worker

    started = threading.Event()
    runs: list[str] = []

    def handler(job: Job, ctx: Context) -> str:
        runs.append(job.id)
        started.set()
        time.sleep(4.0)  # past two leases: only beats keep them
        return "ok"

    def hold_row_a() -> None:
        started.wait(30)
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT 1 FROM jobspool_jobs WHERE id = 'a' FOR UPDATE")
            time.sleep(5.0)
            other.rollback()

    with make_spool(pg_url, lease_seconds=1.5) as spool:
        spool.enqueue("k", {}, job_id="a", max_attempts=1)
        spool.enqueue("k", {}, job_id="b", max_attempts=1)
        holder = threading.Thread(target=hold_row_a)
        holder.start()
        try:
            report = Worker(spool, {"k": handler}, concurrency=2,
                            maintenance=False).run_until_idle()
        finally:
            holder.join()
        assert sorted(runs).count("b") == 1
        assert spool.get("b").state is JobState.COMPLETED
        assert report.lease_lost <= 1  # "a" may lose its lease to the held row; "b" not
