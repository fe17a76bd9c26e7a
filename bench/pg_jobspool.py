"""jobspool's roles in bench/pg.py: its public API on a `postgresql://` root, nothing else.

Each function runs in a fresh child process and returns jobs/s (or samples); opening
the spool and building the worker happen before the timed span.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.pg_peers import payload

WARM = 10  # jobs enqueued before the clock starts (connections, prepared statements)


def _noop(job: Any, ctx: Any) -> None:
    return None


def setup(url: str) -> None:
    """Create the store's schema (what `jobspool init --root URL` does)."""
    from jobspool import Spool

    with Spool(url, create=True):
        pass


def enqueue(url: str, n: int, pad: int) -> float:
    """Jobs/s of `spool.enqueue`, one job per call; `n` jobs land in the queue."""
    from jobspool import Spool

    with Spool(url) as spool:
        for i in range(min(WARM, n)):
            spool.enqueue("bench", payload(i, pad))
        t = time.perf_counter()
        for i in range(WARM, n):
            spool.enqueue("bench", payload(i, pad))
        return (n - WARM) / (time.perf_counter() - t)


def statement_enqueue(url: str, n: int, pad: int) -> float:
    """Jobs/s of the statement a one-job `spool.enqueue` sends (its INSERT, RETURNING a
    NOTIFY), sent by bare psycopg one per call with the parameters jobspool would bind:
    what the store's schema and its NOTIFY cost, without jobspool's Python around them.
    The gap from here to `enqueue` is jobspool's client; from the minimal queue to here,
    the statement's (a wider row, three indexes to update, the NOTIFY)."""
    import orjson
    import psycopg

    from jobspool import Spool
    from jobspool.pg import sql
    from jobspool.queue.ids import new_job_id

    with Spool(url) as spool:
        channel = spool.channel  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as conn:

        def one(i: int) -> None:
            now = time.time()
            conn.execute(sql.INSERT_ONE, {
                "kind": "bench", "priority": 0, "max_attempts": 5, "created": now,
                "timeout": None, "channel": channel, "id": new_job_id(), "state": "ready",
                "run_at": now, "payload": orjson.dumps(payload(i, pad)).decode()},
                prepare=True).fetchone()

        for i in range(min(WARM, n)):
            one(i)
        t = time.perf_counter()
        for i in range(WARM, n):
            one(i)
        return (n - WARM) / (time.perf_counter() - t)


def enqueue_many(url: str, n: int, pad: int, batch: int) -> float:
    """Jobs/s of `spool.enqueue_many` in batches of `batch` (a fill; reported for information)."""
    from jobspool import Spool

    with Spool(url) as spool:
        t = time.perf_counter()
        for k in range(0, n, batch):
            spool.enqueue_many("bench", [payload(i, pad) for i in range(k, min(n, k + batch))])
        return n / (time.perf_counter() - t)


def worker_consume(url: str, n: int, batch: int) -> dict[str, float]:
    """Jobs/s of `Worker(spool, handlers={'bench': no-op}, batch_size=batch).run_until_idle()`."""
    from jobspool import Spool, Worker

    with Spool(url) as spool:
        # Before the clock, as the enqueue measurements warm up: a first run, on WARM jobs
        # of another kind, pays the process's one-time costs (imports, the pool's
        # connections, prepared statements). The timed run's own start and end still count.
        spool.enqueue_many("warm", [payload(i, 0) for i in range(WARM)])
        Worker(spool, handlers={"warm": _noop}, batch_size=batch).run_until_idle()
        worker = Worker(spool, handlers={"bench": _noop}, batch_size=batch)
        t = time.perf_counter()
        report = worker.run_until_idle()
        dt = time.perf_counter() - t
    return {"rate": report.completed / dt, "done": report.completed,
            "lost": report.lease_lost, "expected": n}


def raw_consume(url: str, n: int, batch: int) -> dict[str, float]:
    """Jobs/s of `claim(limit=batch)` + `complete_many` until the queue is empty."""
    from jobspool import Spool

    with Spool(url) as spool:
        for _ in range(2):  # warm (connection, prepared statements): a kind with no jobs
            spool.complete_many([(lease, None) for lease in spool.claim(kinds="warm", limit=batch)])
        done = lost = 0
        t = time.perf_counter()
        while True:
            leases = spool.claim(kinds="bench", limit=batch)
            if not leases:
                break
            out = spool.complete_many([(lease, None) for lease in leases])
            ok = sum(1 for o in out if not isinstance(o, BaseException))
            done += ok
            lost += len(out) - ok
        dt = time.perf_counter() - t
    return {"rate": done / dt, "done": done, "lost": lost, "expected": n}


# ------------------------------------------------------------------ idle pickup


def pickup_worker(url: str, samples: Any, ready: Any, stop: Any, batch: int) -> None:
    """Serve `run_forever` on an idle queue; the handler sends (sent, received) to `samples`.

    Times are CLOCK_MONOTONIC, which is system-wide on Linux, so the producer's and this
    process's readings compare.
    """
    from jobspool import Spool, Worker

    def handler(job: Any, ctx: Any) -> None:
        got = time.clock_gettime(time.CLOCK_MONOTONIC)
        samples.put((job.payload["sent"], got))

    with Spool(url) as spool:
        worker = Worker(spool, handlers={"pickup": handler}, batch_size=batch)
        threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
        ready.set()
        worker.run_forever(handle_signals=False)


def pickup_produce(url: str, count: int, gap: tuple[float, float], samples: Any,
                   seed: int) -> list[tuple[float, float]]:
    """Enqueue `count` jobs one at a time, each after a random idle gap; per job the pickup
    delay in ms measured from before `enqueue` was called, and from its return.

    The first includes the enqueue's own commit (an fsync), the NOTIFY, the wakeup, the
    claim and the dispatch to the handler; the second leaves out the enqueue call.
    """
    import random

    from jobspool import Spool

    rng = random.Random(seed)
    out: list[tuple[float, float]] = []
    with Spool(url) as spool:
        for _ in range(count):
            time.sleep(rng.uniform(*gap))
            sent = time.clock_gettime(time.CLOCK_MONOTONIC)
            spool.enqueue("pickup", {"sent": sent})
            back = time.clock_gettime(time.CLOCK_MONOTONIC)
            s, got = samples.get(timeout=30)
            out.append(((got - s) * 1000, (got - back) * 1000))
    return out


# ------------------------------------------------------------------ dead tuples


def churn_worker(url: str, done: Any, ready: Any, stop: Any, batch: int) -> None:
    """Serve `run_forever` with a no-op handler, counting completions in `done`."""
    from jobspool import Spool, Worker

    def handler(job: Any, ctx: Any) -> None:
        with done.get_lock():
            done.value += 1

    with Spool(url) as spool:
        worker = Worker(spool, handlers={"bench": handler}, batch_size=batch)
        threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
        ready.set()
        worker.run_forever(handle_signals=False)
