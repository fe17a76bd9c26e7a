"""How often a Worker's claims take over expired leases on a store where looking costs a
read of every leased row (PostgreSQL, `queue/takeover.py`).

An idle worker's pickup of a new job looked every time (its last claim had come back
empty): 0.45-0.59 ms of server time against 0.15-0.17 ms without looking (EXPLAIN ANALYZE,
one due job), on the path of issue 16's pickup target. What must not change: an expired
lease is still taken over within the second, and `run_until_idle` does not end without
having looked."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from jobspool import JobState, Worker
from jobspool.queue.takeover import TAKE_OVER_SECONDS, TakeOvers
from tests.spools import make_spool


def test_a_store_that_always_takes_over_gets_no_option() -> None:
    looks = TakeOvers(lazy=False)
    assert looks.options() == {}
    looks.arrival = True
    assert looks.options() == {}


def test_claims_look_once_a_second_and_after_any_short_claim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    looks = TakeOvers(lazy=True)
    first = looks.options()
    assert first == {"take_over": True}  # the first claim of a run looks
    looks.claimed(first, short=False)
    full = looks.options()
    assert full == {"take_over": False}  # within the second, full claims skip
    looks.claimed(full, short=False)
    again = looks.options()
    assert again == {"take_over": False}
    looks.claimed(again, short=True)  # short: the next one looks
    assert looks.skipped
    looked = looks.options()
    assert looked == {"take_over": True}
    looks.claimed(looked, short=True)  # short again (an idle queue): the next looks too
    assert looks.options() == {"take_over": True}
    now[0] += TAKE_OVER_SECONDS / 2
    assert looks.options() == {"take_over": False}  # after a full one, within the second
    now[0] += TAKE_OVER_SECONDS
    assert looks.options() == {"take_over": True}  # a second on: it looks again


def test_a_claim_for_a_job_that_just_arrived_does_not_look_within_the_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    looks = TakeOvers(lazy=True)
    looks.claimed(looks.options(), short=True)  # looked, idle: the next would look
    looks.arrival = True
    pickup = looks.options()
    assert pickup == {"take_over": False}  # ... but a pickup need not
    looks.claimed(pickup, short=True)
    assert looks.options() == {"take_over": True}  # the one after it does
    now[0] += 2 * TAKE_OVER_SECONDS
    looks.arrival = True
    assert looks.options() == {"take_over": True}  # a second on, even a pickup looks


def _claims_spied(spool: Any) -> list[tuple[bool | None, int]]:
    calls: list[tuple[bool | None, int]] = []
    real = spool.claim

    def claim(**kwargs: Any) -> Any:
        got = real(**kwargs)
        calls.append((kwargs.get("take_over"), len(got)))
        return got

    spool.claim = claim
    return calls


def test_a_drain_looks_before_it_ends(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", {"n": -1}, job_id="lapsed", priority=5)
        [lease] = spool.claim(kinds="k", owner="dead", lease_seconds=0.4)
        spool.enqueue_many("k", [{"n": i} for i in range(4)])
        calls = _claims_spied(spool)
        seen: list[int] = []

        def handler(job: Any, ctx: Any) -> None:
            seen.append(job.payload["n"])
            time.sleep(0.15)  # the batch outlasts the dead worker's lease

        report = Worker(spool, handlers={"k": handler}, concurrency=1).run_until_idle()
        assert report.completed == 5
        assert sorted(seen) == [-1, 0, 1, 2, 3]
        assert spool.get("lapsed").state is JobState.COMPLETED
        assert spool.get("lapsed").rescues == 1
        # An empty claim that skipped the leases proves nothing: the next one looked.
        for (looked, n), (looked_next, _) in itertools.pairwise(calls):
            if looked is False and n == 0:
                assert looked_next is True, calls
        assert calls[-1] == (True, 0), calls  # the drain ended on a claim that looked
        assert (True, 1) in calls, calls  # the one that took the lapsed lease over
        assert lease.job_id == "lapsed"


def test_an_idle_workers_pickup_of_a_new_job_does_not_look(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        calls = _claims_spied(spool)
        done = threading.Event()
        worker = Worker(spool, handlers={"k": lambda job, ctx: done.set()})
        t = threading.Thread(target=lambda: worker.run_forever(poll_seconds=30,
                                                               handle_signals=False))
        t.start()
        try:
            deadline = time.monotonic() + 30
            while not any(looked for looked, _ in calls) and time.monotonic() < deadline:
                time.sleep(0.01)  # the worker's first claim looked
            time.sleep(0.1)
            spool.enqueue("k", {})
            assert done.wait(30)
        finally:
            worker.stop()
            t.join(30)
        took = [looked for looked, n in calls if n]
        assert took == [False], calls


def test_an_idle_worker_takes_over_a_lease_as_it_expires_not_at_its_next_poll(
        pg_url: str) -> None:
    """Found by a probe of the first form: woken by a lease's expiry within a second of
    its last look, an idle worker skipped the leases, and took the lapsed one over only at
    its next poll (`poll_seconds` late: 10 s at `poll_seconds=10`). The test idles the
    worker 11 s first, for its backoff to reach the poll."""
    import psycopg

    with make_spool(pg_url) as spool:
        spool.enqueue("k", {}, job_id="lapsed")
        spool.claim(kinds="k", owner="dead", lease_seconds=600)
        calls = _claims_spied(spool)
        real = spool.claim
        shortened: list[float] = []
        done = threading.Event()

        started = time.monotonic()

        def claim(**kwargs: Any) -> Any:
            got = real(**kwargs)
            # Once idle long enough that its backoff reached `poll_seconds` (from 10 ms,
            # doubling after each empty claim: past 6 s in 0.01 * 2**10 s).
            idle_long = time.monotonic() - started > 11
            if kwargs.get("take_over") and not got and not shortened and idle_long:
                # Right after a look, before the worker reads when the next lease expires:
                # the dead worker's lease now runs out in half a second.
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute("UPDATE jobspool_jobs SET expires_at = "
                                 "extract(epoch from clock_timestamp()) + 0.5 "
                                 "WHERE id = 'lapsed'")
                shortened.append(time.monotonic() + 0.5)
            return got

        spool.claim = claim
        worker = Worker(spool, handlers={"k": lambda job, ctx: done.set()})
        t = threading.Thread(target=lambda: worker.run_forever(poll_seconds=6,
                                                               handle_signals=False))
        t.start()
        try:
            assert done.wait(60)  # a hang guard
            taken_after = time.monotonic() - shortened[0]
        finally:
            worker.stop()
            t.join(30)
        assert spool.get("lapsed").rescues == 1
        # On its expiry (at once), not at the next poll (6 s on): half a poll apart.
        assert taken_after < 3, (taken_after, calls)
