"""PostgreSQL backpressure measures the backlog on the enqueue's own connection.

Found by a lock-order probe: an enqueue with given ids holds a pooled connection (its
transaction) while it admits its jobs, and measured the backlog on a second pooled one,
holding the backpressure state meanwhile. As many such threads as the pool has connections
starved it: each held one and waited for the state, the measuring one waited for a free
connection, and nothing was enqueued at all (2 threads on a pool of 2: none in 30 s).
"""

from __future__ import annotations

import threading

from jobspool import JobState, Spool

THREADS = 4
EACH = 25


def test_threads_enqueuing_with_ids_under_backpressure_do_not_starve_the_pool(
        pg_url: str) -> None:
    with Spool(pg_url, pool_size=2, max_due=1_000_000) as spool:
        errors: list[BaseException] = []

        def produce(t: int) -> None:
            try:
                for i in range(EACH):
                    spool.enqueue("bp", {"i": i}, job_id=f"t{t}-{i}")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "enqueues stalled"
        assert errors == []
        assert len(list(spool.jobs(state=JobState.READY, kind="bp"))) == THREADS * EACH
