"""How often a Worker's claims take over expired leases on a store where looking costs a
read of every leased row (PostgreSQL, `queue/takeover.py`).

An idle worker's pickup of a new job looked every time (its last claim had come back
empty): 0.45-0.59 ms of server time against 0.15-0.17 ms without looking (EXPLAIN ANALYZE,
one due job), on the path of issue 16's pickup target. What must not change: an expired
lease is still taken over within the second, and `run_until_idle` does not end without
having looked."""

from __future__ import annotations

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


def test_claims_look_once_a_second_and_after_a_short_claim_that_did_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    looks = TakeOvers(lazy=True)
    first = looks.options()
    assert first == {"take_over": True}  # the first claim of a run looks
    looks.claimed(first, short=True)  # it looked: a short one proves the leases were read
    full = looks.options()
    assert full == {"take_over": False}
    looks.claimed(full, short=False)
    short = looks.options()
    assert short == {"take_over": False}
    looks.claimed(short, short=True)  # short without looking: the next one looks
    assert looks.skipped
    assert looks.options() == {"take_over": True}
    now[0] += TAKE_OVER_SECONDS / 2
    assert looks.options() == {"take_over": False}
    now[0] += TAKE_OVER_SECONDS
    assert looks.options() == {"take_over": True}  # a second on: it looks again


def test_a_claim_for_a_job_that_just_arrived_does_not_look_within_the_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    looks = TakeOvers(lazy=True)
    looks.claimed(looks.options(), short=True)  # looked, idle
    skipped = looks.options()
    looks.claimed(skipped, short=True)  # an idle poll that did not look: the next would
    looks.arrival = True
    assert looks.options() == {"take_over": False}  # ... but a pickup need not
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
        for (looked, n), (looked_next, _) in zip(calls, calls[1:], strict=False):
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
