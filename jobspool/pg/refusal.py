"""Why a guarded write on PostgreSQL skipped a lease: the one reading shared by settles,
heartbeats and lease checks, in the file spool's order (`machine.check_lease`), so that
both stores give one reason for one situation.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg

from jobspool.errors import LeaseLost
from jobspool.pg.rows import COLUMNS, to_job
from jobspool.queue import machine
from jobspool.queue.job import Job, Lease
from jobspool.queue.states import JobState


def refusal(conn: psycopg.Connection[Any], lease: Lease, resent: bool = False,
             now: float = math.inf) -> LeaseLost | Job:
    """Why a guarded write skipped `lease`; or, for a statement `resent` after its reply was
    lost to a dropped connection, the job when that lease already settled it (the first
    send landed). A settle made twice on purpose is refused, as on the file spool."""
    row = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = %s",
                       (lease.job_id,)).fetchone()
    if row is None:
        return LeaseLost(lease.job_id, lease.token, "job is gone")
    job = to_job(row)
    token = row[10]
    same_job = job.created_at == lease.job.created_at
    # In the file spool's order (machine.check_lease), so both stores give one reason.
    if job.state is not JobState.LEASED:
        if resent and same_job and token == lease.token and job.revision > lease.job.revision:
            return job
        return LeaseLost(lease.job_id, lease.token, f"job is {job.state.value}")
    if token != lease.token:
        return LeaseLost(lease.job_id, lease.token, machine.token_mismatch(token, lease.token))
    if not same_job:
        return LeaseLost(lease.job_id, lease.token, "the lease is for another job of this id "
                                                    "(issued by another spool?)")
    if job.lease is not None and job.lease.expires_at > now:
        return job  # current, its row held by a `fenced` block (which extends it on exit)
    return LeaseLost(lease.job_id, lease.token, "lease expired")


def lost(conn: psycopg.Connection[Any], lease: Lease) -> LeaseLost:
    got = refusal(conn, lease)
    if isinstance(got, LeaseLost):
        return got
    return LeaseLost(lease.job_id, lease.token, f"job is {got.state.value}")
