"""Enqueue and prepare on PostgreSQL.

Generated ids are new by construction: one INSERT of the whole batch, one
NOTIFY. Caller-given ids may exist: the batch then runs in one transaction
that locks the existing rows, lets the state machine decide each conflict
(`machine.decide_enqueue`: keep, replace, error), and writes the outcome — so
one refused id (`on_conflict="error"`) leaves nothing of the batch behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg.errors

from jobspool.errors import JobNotFound
from jobspool.pg import sql
from jobspool.pg.hotcursor import execute_hot
from jobspool.pg.rows import COLUMNS, INSERT_SQL, UPDATE_SQL, dump, to_job, write_values
from jobspool.queue import machine
from jobspool.queue.job import EnqueueResult, Job
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool
    from jobspool.queue.backpressure import Backlog


def insert_fresh(spool: PgSpool, fresh: list[Job]) -> set[str]:
    """Insert new jobs of one kind in one statement; returns the ids that were inserted."""
    first = fresh[0]
    params = {"kind": first.kind, "priority": first.priority,
              "max_attempts": first.max_attempts, "created": first.created_at,
              "timeout": first.timeout, "channel": spool.channel}
    one = len(fresh) == 1
    if one:
        params.update(id=first.id, state=first.state.value, run_at=first.run_at,
                      payload=dump(first.payload))
    else:
        params.update(ids=[j.id for j in fresh], states=[j.state.value for j in fresh],
                      run_ats=[j.run_at for j in fresh],
                      payloads=[dump(j.payload) for j in fresh])
    fast, safe = (sql.INSERT_ONE, sql.INSERT_ONE_SAFE) if one else \
        (sql.INSERT_FRESH, sql.INSERT_FRESH_SAFE)

    def go(c: psycopg.Connection[Any]) -> Any:
        try:
            return execute_hot(c, fast, params).fetchone()
        except psycopg.errors.UniqueViolation:
            # Sent again after a lost reply (see sql.INSERT_FRESH): autocommit, so the
            # failed statement left the connection idle for the form that skips them.
            return execute_hot(c, safe, params).fetchone()

    row = spool.db.run(go, what="enqueue")
    if row is None:
        return set()
    return {row[0]} if one else set(row[0])


def insert_generated(spool: PgSpool, fresh: list[Job]) -> list[EnqueueResult]:
    """Insert jobs whose ids this call generated; each is "created" unless a resend after
    a lost reply met a row it did not write."""
    inserted = insert_fresh(spool, fresh)
    missing = [j for j in fresh if j.id not in inserted]
    if not missing:
        return [EnqueueResult(j, "created") for j in fresh]
    # A reply lost to a dropped connection, the insert sent again: the rows are this
    # call's own (created by it), unless a generated id met another job's.
    out = []
    for j in fresh:
        if j.id in inserted:
            out.append(EnqueueResult(j, "created"))
            continue
        there = spool.get(j.id)
        ours = there.created_at == j.created_at and there.kind == j.kind
        out.append(EnqueueResult(there, "created" if ours else "existing"))
    return out


def admit(spool: PgSpool, n: int, conn: psycopg.Connection[Any] | None = None) -> None:
    """`PgSpool.admit`: the jobs are written after this returns, outside any lock, so they
    are counted in flight until `landed`. `conn`: the caller's own connection, which the
    backlog is measured on. Measured on a second pooled one, a caller already holding a
    connection waited for the pool while holding the backpressure state, and as many such
    callers as the pool has connections (threads enqueuing with ids) starved it: nothing
    was enqueued at all (a lock-order probe)."""
    if n == 0 or (spool.max_due is None and spool.max_lag_seconds is None):
        return
    from jobspool.queue.backpressure import admit as admit_jobs  # only where it is on

    admit_jobs(spool, n, lambda: measure_backlog(spool, conn), in_flight=True)


def landed(spool: PgSpool, n: int, written: bool) -> None:
    """`PgSpool.landed`."""
    if n == 0 or (spool.max_due is None and spool.max_lag_seconds is None):
        return
    from jobspool.queue.backpressure import landed as land

    land(spool, n, written)


def measure_backlog(spool: PgSpool, conn: psycopg.Connection[Any] | None = None
                    ) -> Backlog:
    """The ready rows' count and how long the first of them (in claim order, an index
    scan rather than every row) has waited since `run_at`, or its arrival when later.
    On `conn` when given (the caller's transaction), else on a pooled connection."""
    from jobspool.queue.backpressure import Backlog  # only where backpressure is on

    def go(c: psycopg.Connection[Any]) -> Any:
        return c.execute(
            "SELECT (SELECT count(*) FROM jobspool_jobs WHERE state = 'ready'), "
            "(SELECT min(greatest(run_at, updated_at)) FROM (SELECT run_at, updated_at "
            "FROM jobspool_jobs WHERE state = 'ready' ORDER BY priority, run_at, id "
            "LIMIT 100) s)").fetchone()

    row = go(conn) if conn is not None else spool.db.run(go, what="measuring the backlog")
    due, oldest = (int(row[0]), row[1]) if row else (0, None)
    return Backlog(due=due, oldest_run_at=oldest, measured_at=spool.now())


def lock_rows(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, Job]:
    rows = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = ANY(%s) "
                        "ORDER BY id FOR UPDATE", (ids,)).fetchall()
    return {r[0]: to_job(r) for r in rows}


def write(conn: psycopg.Connection[Any], old: Job | None, new: Job) -> None:
    """Write a decided snapshot over the row it was decided from (locked by the caller)."""
    if old is None:
        conn.execute(INSERT_SQL, [new.id, *write_values(new)])
    else:
        conn.execute(UPDATE_SQL, [*write_values(new), new.id, old.revision])


def _written_by_this_call(old: Job, job: Job, reservation: str | None) -> bool:
    """Whether `old` is the row an earlier try of this very call wrote: the same creation
    time (the call's clock reading, to the bit), kind and payload, and reservation."""
    return (old.created_at == job.created_at and old.kind == job.kind
            and dump(old.payload) == dump(job.payload)
            and (reservation is None or reservation in old.reservations))


# Advisory lock keys for caller-given ids (`insert_given`): a batch takes at most this many,
# whatever its size; two producers of ids in one bucket wait for each other's transaction.
ID_LOCK_BUCKETS = 1024


def insert_given(spool: PgSpool, fresh: list[Job], *, on_conflict: str,
                 unique_states: frozenset[JobState] | None,
                 reservation: str | None = None) -> list[EnqueueResult]:
    """Insert jobs whose ids the caller chose, deciding every conflict under a row lock."""
    ids = sorted({j.id for j in fresh})
    # Set once a try got as far as its commit: only a try after such a one can meet rows
    # this call wrote. Judged on every try, a clock that reads the same twice (a test's
    # frozen clock) made an earlier job with this id, kind and payload "this call's own":
    # a duplicate passed `on_conflict="error"`, and a canceled job was not reopened.
    committing = [False]
    admitted = [0]  # by the latest try, in flight until it is known written (or not)

    def go(conn: psycopg.Connection[Any]) -> list[EnqueueResult]:
        resent = committing[0]
        spool.landed(admitted[0], False)  # a try sent again: what it admitted is not written
        admitted[0] = 0
        with conn.transaction():
            # Lock the ids first (an advisory lock also covers ids with no row yet, so two
            # producers of one new id cannot both insert it): one lock per bucket of ids,
            # in bucket order. A lock per id put 15,000 entries into the server's shared
            # lock table (max_locks_per_transaction x max_connections, ~6,400 by default)
            # and a batch of them failed with "out of shared memory", for ever.
            conn.execute(f"SELECT pg_advisory_xact_lock(b) FROM (SELECT DISTINCT "
                         f"hashtextextended(x, 7) %% {ID_LOCK_BUCKETS} AS b "
                         f"FROM unnest(%s::text[]) AS x) k ORDER BY b", (ids,))
            existing = lock_rows(conn, ids)
            now = spool.now()
            out: list[EnqueueResult] = []
            writes: list[tuple[Job | None, Job]] = []
            seen: dict[str, EnqueueResult] = {}
            for job in fresh:
                if job.id in seen:
                    out.append(EnqueueResult(seen[job.id].job, "existing"))
                    continue
                old = existing.get(job.id)
                if old is None:
                    result = EnqueueResult(job, "created")
                    writes.append((None, job))
                elif resent and _written_by_this_call(old, job, reservation):
                    # Sent again after a lost connection: the first try committed and its
                    # reply was lost. Deciding again would call our own row a conflict
                    # (`DuplicateJob` under on_conflict="error").
                    result = EnqueueResult(old, "created")
                else:
                    outcome, new = machine.decide_enqueue(
                        old, job, now=now, on_conflict=on_conflict,
                        unique_states=unique_states, reservation=reservation,
                        max_bytes=spool.max_job_bytes)
                    if outcome != "existing":
                        writes.append((old, new))
                    result = EnqueueResult(new, outcome)
                seen[job.id] = result
                out.append(result)
            # Backpressure counts only what this call adds to the backlog: an idempotent
            # re-enqueue is never refused. Raising here rolls the whole batch back. Measured
            # before the batch's own rows are written: inside a caller's transaction (a
            # scheduler's, whose connection is pinned) the count saw them, and a schedule's
            # tick was refused with an empty queue.
            adding = sum(1 for old_row, new_row in writes
                         if machine.adds_to_backlog(old_row, new_row))
            spool.admit(adding, conn)
            admitted[0] = adding
            for old_row, new_row in writes:
                write(conn, old_row, new_row)
            if any(r.outcome != "existing" and r.job.state in (JobState.READY, JobState.RETRYABLE)
                   for r in out):
                conn.execute("SELECT pg_notify(%s, '')", (spool.channel,))
            committing[0] = True
            return out

    written = False
    try:
        results = spool.db.run(go, what="enqueue")
        written = True
    finally:
        spool.landed(admitted[0], written)
    return results


def mutate(spool: PgSpool, job_id: str, decide: Callable[[Job, float], Job | None], *,
           missing: Callable[[], Any] | None, what: str) -> Any:
    """`PgSpool.mutate_job`: lock one job's row, let `decide` compute its next snapshot
    (None or the job itself: nothing to write), write it and wake the workers when it is
    claimable; `missing()` answers for a job that is not there, else `JobNotFound`."""
    def go(conn: psycopg.Connection[Any]) -> Any:
        with conn.transaction():
            row = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = %s "
                               "FOR UPDATE", (job_id,)).fetchone()
            if row is None:
                if missing is not None:
                    return missing()
                raise JobNotFound(job_id)
            job = to_job(row)
            new = decide(job, spool.now())
            if new is not None and new is not job:
                write(conn, job, new)
                if new.state in (JobState.READY, JobState.RETRYABLE):
                    conn.execute("SELECT pg_notify(%s, '')", (spool.channel,))
            return new

    return spool.db.run(go, what=what)
