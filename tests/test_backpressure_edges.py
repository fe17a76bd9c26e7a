"""Writer backpressure at its edges (a limits probe), on both stores.

- A replace that makes a waiting job ready now adds it to the backlog: `max_due=3` let
  ten such replaces in (13 ready), even while the producer refused everything else.
- A batch too large for the room left is refused alone: it latched the producer, which
  then refused every single job that fitted until the backlog fell under half.
- On PostgreSQL, threads of one producer overshot `max_due` (8 threads: 107 for 100, 150
  in batches of 10): jobs admitted and not yet committed dropped out of the estimate
  when it was measured again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from jobspool import JobState, Spool
from jobspool.errors import Backpressure


def _ready(spool: Spool) -> int:
    return int(spool.stats().ready)


def test_a_replace_that_makes_jobs_ready_counts_toward_max_due(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(max_due=3)
    ids = [f"later-{i}" for i in range(10)]
    spool.enqueue_many("k", [{}] * 10, job_ids=ids, delay=3600)
    spool.enqueue_many("k", [{}] * 3)
    with pytest.raises(Backpressure):
        spool.enqueue("k", {})
    with pytest.raises(Backpressure):
        spool.enqueue_many("k", [{"now": True}] * 10, job_ids=ids, on_conflict="replace")
    assert _ready(spool) == 3
    assert {spool.get(i).state for i in ids} == {JobState.RETRYABLE}  # as they were: delayed
    assert all(spool.get(i).payload == {} for i in ids)


def test_a_batch_too_large_for_the_room_left_does_not_refuse_what_fits(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(max_due=100)
    spool.enqueue_many("k", [{}] * 60)
    with pytest.raises(Backpressure, match="would be over"):
        spool.enqueue_many("k", [{}] * 50)
    spool.enqueue("k", {})  # 61: fits, admitted at once
    spool.enqueue_many("k", [{}] * 39)  # up to the limit exactly
    assert _ready(spool) == 100
    with pytest.raises(Backpressure):
        spool.enqueue("k", {})


@pytest.mark.parametrize("batch", [1, 10])
def test_threads_of_one_producer_stay_within_max_due(make_any_spool: Callable[..., Spool],
                                                     batch: int) -> None:
    spool = make_any_spool(max_due=100)
    refused = []

    def produce() -> None:
        while True:
            try:
                spool.enqueue_many("k", [{}] * batch)
            except Backpressure:
                refused.append(1)
                return

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)  # a hang guard
    assert len(refused) == 8
    assert _ready(spool) <= 100


def test_a_batch_committed_and_not_yet_landed_is_not_counted_twice(pg_url: str) -> None:
    """A thread whose batch was committed but not yet counted as written (a thread switch
    right after COMMIT) was counted twice by another thread's fresh count: a batch that
    fitted was refused, and the producer latched, refusing single jobs."""
    import time

    from tests.spools import make_spool

    spool = make_spool(pg_url, max_due=100)
    real = spool.landed  # type: ignore[attr-defined]

    def late(n: int, written: bool) -> None:
        if n == 50:
            time.sleep(0.5)  # committed, not yet landed
        real(n, written)

    spool.landed = late  # type: ignore[attr-defined]
    first = threading.Thread(target=lambda: spool.enqueue_many("k", [{}] * 50))
    first.start()
    time.sleep(0.3)
    spool.enqueue_many("k", [{}] * 40)  # 90: fits
    first.join(60)
    spool.enqueue("k", {})  # 91: fits, not latched
    assert _ready(spool) == 91
    spool.close()
