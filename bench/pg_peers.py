"""The peers bench/pg.py measures jobspool's PostgreSQL store against.

- `minimal`: the minimal fenced queue of issue 16, exactly as the issue describes it:
  its own table; enqueue = one INSERT per job (one transaction per call); claim =
  `WITH c AS MATERIALIZED (SELECT id ... ORDER BY priority, run_at, id LIMIT B FOR UPDATE
  SKIP LOCKED) UPDATE ... FROM c RETURNING ...` with the token from a sequence; complete =
  one `UPDATE ... FROM unnest(ids, tokens, results)` per batch, guarded by token, state
  and expiry. psycopg 3, autocommit, prepared statements, no NOTIFY.
- `pgqueuer`: pgqueuer (if importable; `pip install pgqueuer asyncpg`, bench only), driven
  as its README does: `Queries.enqueue` per job, one `QueueManager` with a no-op async
  entrypoint, `run(batch_size=B, mode=drain)` timed until the queue is empty.

Every role runs in a fresh child process (bench/pg.py) and returns jobs/s; setup
(connecting, preparing, schema) is outside the timed span.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS mq_jobs (
    id          text PRIMARY KEY,
    kind        text NOT NULL,
    payload     jsonb NOT NULL,
    priority    integer NOT NULL DEFAULT 0,
    run_at      timestamptz NOT NULL DEFAULT now(),
    state       text NOT NULL DEFAULT 'ready',
    token       bigint,
    owner       text,
    attempts    integer NOT NULL DEFAULT 0,
    expires_at  timestamptz,
    result      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE SEQUENCE IF NOT EXISTS mq_token;
CREATE INDEX IF NOT EXISTS mq_claimable ON mq_jobs (priority, run_at, id) WHERE state = 'ready';
"""

ENQUEUE = "INSERT INTO mq_jobs (id, kind, payload) VALUES (%s, %s, %s::jsonb)"
ENQUEUE_NOTIFY = ("WITH i AS (INSERT INTO mq_jobs (id, kind, payload) VALUES (%s, %s, %s::jsonb)"
                  " RETURNING 1) SELECT pg_notify('mq_jobs', '') FROM i")
CLAIM = """
WITH c AS MATERIALIZED (
    SELECT id FROM mq_jobs
    WHERE state = 'ready' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED)
UPDATE mq_jobs j
SET state = 'leased', token = nextval('mq_token'), owner = %s, attempts = j.attempts + 1,
    expires_at = now() + %s * interval '1 second'
FROM c WHERE j.id = c.id
RETURNING j.id, j.token, j.kind, j.payload
"""
COMPLETE = """
UPDATE mq_jobs j
SET state = 'completed', result = u.result, expires_at = NULL, finished_at = now()
FROM unnest(%s::text[], %s::bigint[], %s::jsonb[]) AS u(id, token, result)
WHERE j.id = u.id AND j.token = u.token AND j.state = 'leased' AND j.expires_at > now()
RETURNING j.id
"""


def payload(i: int, pad: int) -> dict[str, Any]:
    """The payload every queue gets: a bench index and `pad` bytes of filler."""
    return {"i": i, "pad": "x" * pad}


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def minimal_setup(url: str) -> None:
    """Create the minimal queue's table (idempotent)."""
    with _connect(url) as conn:
        conn.execute(SCHEMA)


def minimal_fill(url: str, n: int, pad: int) -> None:
    """Untimed prefill: n jobs in one transaction (for consume-only measurements)."""
    with _connect(url) as conn, conn.cursor() as cur, conn.transaction():
        cur.executemany(ENQUEUE, [(uuid.uuid4().hex, "bench", json.dumps(payload(i, pad)))
                                  for i in range(n)])


def minimal_enqueue(url: str, n: int, pad: int, notify: bool = False) -> float:
    """Jobs/s enqueueing n jobs one per call (one INSERT, one commit each)."""
    sql = ENQUEUE_NOTIFY if notify else ENQUEUE
    with _connect(url) as conn:
        # Warm the prepared statement outside the timed span (psycopg prepares on reuse).
        for _ in range(2):
            conn.execute(sql, (uuid.uuid4().hex, "warm", "{}"), prepare=True)
        conn.execute("DELETE FROM mq_jobs WHERE kind = 'warm'")
        t = time.perf_counter()
        for i in range(n):
            conn.execute(sql, (uuid.uuid4().hex, "bench", json.dumps(payload(i, pad))), prepare=True)
        return n / (time.perf_counter() - t)


def _noop(_payload: Any) -> None:
    return None


def minimal_consume(url: str, n: int, batch: int, lease: float = 600.0) -> dict[str, float]:
    """Jobs/s draining the queue: claim `batch`, run a no-op handler, complete the batch."""
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    with _connect(url) as conn:
        for _ in range(2):  # warm, as the enqueue measurements do: prepared, nothing claimed
            conn.execute(CLAIM, (0, owner, lease), prepare=True).fetchall()
            conn.execute(COMPLETE, ([], [], []), prepare=True).fetchall()
        done = lost = 0
        t = time.perf_counter()
        while True:
            rows = conn.execute(CLAIM, (batch, owner, lease), prepare=True).fetchall()
            if not rows:
                break
            ids, tokens, results = [], [], []
            for job_id, token, _kind, body in rows:
                results.append(json.dumps(_noop(body)))
                ids.append(job_id)
                tokens.append(token)
            got = len(conn.execute(COMPLETE, (ids, tokens, results), prepare=True).fetchall())
            done += got
            lost += len(rows) - got
        dt = time.perf_counter() - t
    return {"rate": done / dt, "done": done, "lost": lost, "expected": n}


def minimal_pickup_worker(url: str, samples: Any, ready: Any, stop: Any, batch: int) -> None:
    """The minimal queue's idle worker: LISTEN on its own connection, claim on another when
    notified (or every 0.25 s), then the handler records its start (CLOCK_MONOTONIC)."""
    with _connect(url) as listen, _connect(url) as work:
        listen.execute("LISTEN mq_jobs")
        owner = f"pickup-{uuid.uuid4().hex[:8]}"
        ready.set()
        while not stop.is_set():
            rows = work.execute(CLAIM, (batch, owner, 600.0), prepare=True).fetchall()
            if not rows:
                for _ in listen.notifies(timeout=0.25, stop_after=1):
                    pass
                continue
            for _id, _token, _kind, body in rows:
                samples.put((body["sent"], time.clock_gettime(time.CLOCK_MONOTONIC)))
            work.execute(COMPLETE, ([r[0] for r in rows], [r[1] for r in rows],
                                    ["null"] * len(rows)), prepare=True)


def minimal_pickup_produce(url: str, count: int, gap: tuple[float, float], samples: Any,
                           seed: int) -> list[tuple[float, float]]:
    """Enqueue (INSERT + NOTIFY) one job at a time after random gaps; per job the pickup
    delay in ms from before the call, and from its return."""
    import random

    rng = random.Random(seed)
    out: list[tuple[float, float]] = []
    with _connect(url) as conn:
        for _ in range(count):
            time.sleep(rng.uniform(*gap))
            sent = time.clock_gettime(time.CLOCK_MONOTONIC)
            conn.execute(ENQUEUE_NOTIFY, (uuid.uuid4().hex, "pickup", json.dumps({"sent": sent})),
                         prepare=True)
            back = time.clock_gettime(time.CLOCK_MONOTONIC)
            s, got = samples.get(timeout=30)
            out.append(((got - s) * 1000, (got - back) * 1000))
    return out


# ------------------------------------------------------------------ pgqueuer


def pgqueuer_available() -> str | None:
    """None when pgqueuer can be driven here, else why not (one line)."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return ("pgqueuer is not importable: skipped (it is not a jobspool dependency; "
                "for the bench only: .venv/bin/pip install pgqueuer asyncpg)")
    return None


def _pgq_driver_name() -> str:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "psycopg"
    return "asyncpg"


async def _pgq_queries(url: str) -> tuple[Any, Any]:
    from pgqueuer.queries import Queries

    if _pgq_driver_name() == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(url)
        return Queries(AsyncpgDriver(conn)), conn
    import psycopg
    from pgqueuer.db import PsycopgDriver

    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return Queries(PsycopgDriver(aconn)), aconn


def pgqueuer_driver() -> str:
    """The driver pgqueuer runs on here: asyncpg (its recommendation) when installed."""
    return _pgq_driver_name()


def pgqueuer_setup(url: str) -> None:
    """Install pgqueuer's schema (what `pgq install` does)."""
    import asyncio

    async def main() -> None:
        q, conn = await _pgq_queries(url)
        try:
            if not await q.schema_is_installed():
                await q.install()
        finally:
            await conn.close()
    asyncio.run(main())


def pgqueuer_enqueue(url: str, n: int, pad: int, one_per_call: bool = True) -> float:
    """Jobs/s enqueueing n jobs with `Queries.enqueue`, one per call (or one untimed batch)."""
    import asyncio

    async def main() -> float:
        q, conn = await _pgq_queries(url)
        try:
            bodies = [json.dumps(payload(i, pad)).encode() for i in range(n)]
            t = time.perf_counter()
            if one_per_call:
                for b in bodies:
                    await q.enqueue("bench", b)
            else:
                for k in range(0, n, 1000):
                    chunk = bodies[k:k + 1000]
                    await q.enqueue(["bench"] * len(chunk), list(chunk), [0] * len(chunk))
            return n / (time.perf_counter() - t)
        finally:
            await conn.close()
    return asyncio.run(main())


def pgqueuer_consume(url: str, n: int, batch: int) -> dict[str, float]:
    """Jobs/s draining the queue with one QueueManager at `batch_size=batch`, no-op entrypoint."""
    import asyncio

    async def main() -> dict[str, float]:
        from pgqueuer.models import Job
        from pgqueuer.qm import QueueManager
        from pgqueuer.types import QueueExecutionMode

        q, conn = await _pgq_queries(url)
        qm = QueueManager(q)
        seen = 0

        @qm.entrypoint("bench")
        async def bench(job: Job) -> None:
            nonlocal seen
            seen += 1

        t = time.perf_counter()
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
        dt = time.perf_counter() - t
        left = await q.queued_work(["bench"])
        await conn.close()
        return {"rate": seen / dt, "done": seen, "left": left, "expected": n}
    return asyncio.run(main())
