"""Heartbeats, lease checks and `fenced` blocks on PostgreSQL.

A heartbeat extends every current lease of a batch in one guarded statement; rows that
another transaction holds locked are waited for briefly, except those held by a
`fenced` block of this process (the block extends its lease as it ends). A `fenced`
block holds its job's row locked while it runs, checks the lease before and extends it
after, in one transaction.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from jobspool.errors import LeaseLost
from jobspool.pg import sql
from jobspool.pg.refusal import lost, refusal
from jobspool.pg.rows import COLUMNS, TOKEN_INDEX, to_job
from jobspool.queue import machine
from jobspool.queue.job import Job, Lease

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool

log = logging.getLogger("jobspool.pg")

_IDLE = psycopg.pq.TransactionStatus.IDLE


# Row locks `fenced` blocks of this process hold: (database, job id, token) -> blocks.
# A heartbeat skips those rows (the block extends the lease as it ends); it waits, briefly,
# for any other holder's lock.
_FENCED: Counter[tuple[str, str, int]] = Counter()
_FENCED_MUTEX = threading.Lock()
# How long a heartbeat waits for a row lock another transaction holds before it reports
# the lease as it stands (unextended, with a warning): at most this, and at most a quarter
# of the shortest lease beaten. The wait holds the heartbeat thread, every other lease's
# next beat with it: a fixed 2 s cost 1.5 s leases of unrelated jobs (a probe).
HEARTBEAT_LOCK_WAIT = 2.0


def _heartbeat_params(spool: PgSpool, leases: Sequence[Lease], lengths: Sequence[float]
                      ) -> dict[str, Any]:
    return {"now": spool.now_param(), "leases": list(lengths),
            "ids": [x.job_id for x in leases], "tokens": [x.token for x in leases],
            "created": [x.job.created_at for x in leases]}


def _heartbeat_rows(spool: PgSpool, leases: Sequence[Lease], lengths: Sequence[float]
                    ) -> dict[str, Job | LeaseLost]:
    sends = 0

    def go(conn: psycopg.Connection[Any]) -> dict[str, Job | LeaseLost]:
        nonlocal sends
        sends += 1
        rows = conn.execute(sql.HEARTBEAT, _heartbeat_params(spool, leases, lengths),
                            binary=True).fetchall()
        done: dict[str, Job | LeaseLost] = {r[0]: to_job(r) for r in rows}
        with _FENCED_MUTEX:
            held = {(k[1], k[2]) for k in _FENCED if k[0] == spool.display}
        waiting = [(x, n) for x, n in zip(leases, lengths, strict=True)
                   if x.job_id not in done and (x.job_id, x.token) not in held]
        if waiting and conn.info.transaction_status == _IDLE:
            wait_ms = max(1, int(1000 * min(HEARTBEAT_LOCK_WAIT, min(lengths) / 4)))
            try:
                with conn.transaction():
                    conn.execute(f"SET LOCAL lock_timeout = '{wait_ms}ms'")
                    rows = conn.execute(sql.HEARTBEAT_WAITING, _heartbeat_params(
                        spool, [x for x, _ in waiting], [n for _, n in waiting]),
                        binary=True).fetchall()
                done.update({r[0]: to_job(r) for r in rows})
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                # Past the lock wait, or past a shorter statement_timeout the connection
                # was given: the leases the first pass extended are still reported.
                log.warning("heartbeat: a job's row stayed locked by another transaction "
                            "for %d ms (or the statement timeout); its lease is reported as "
                            "it stands, unextended", wait_ms)
        for lease in leases:
            if lease.job_id not in done:
                done[lease.job_id] = refusal(conn, lease, resent=sends > 1, now=spool.now())
        return done

    return spool.db.run(go, what="heartbeat")


def heartbeat_many(spool: PgSpool, leases: Sequence[Lease], lease_seconds: float | None
                   ) -> list[Lease | LeaseLost]:
    """Extend each lease by `lease_seconds`, else by its own length (`Lease.seconds`), else
    by the spool's default."""
    if not leases:
        return []
    lengths = [lease_seconds or x.seconds or spool.lease_seconds for x in leases]
    done = _heartbeat_rows(spool, leases, lengths)
    out: list[Lease | LeaseLost] = []
    for lease, seconds in zip(leases, lengths, strict=True):
        got = done[lease.job_id]
        if isinstance(got, Job) and got.lease is not None and got.lease.token == lease.token:
            out.append(Lease(job_id=lease.job_id, token=lease.token, owner=lease.owner,
                             expires_at=got.lease.expires_at, job=got, seconds=seconds))
        elif isinstance(got, LeaseLost):
            out.append(got)
        elif got.lease is not None:  # the live lease of its job was in the batch too
            out.append(LeaseLost(lease.job_id, lease.token,
                                 machine.token_mismatch(got.lease.token, lease.token)))
        else:
            out.append(LeaseLost(lease.job_id, lease.token, f"job is {got.state.value}"))
    return out


def check_leases(spool: PgSpool, leases: Sequence[Lease], margin: float,
                 lease_seconds: float | None) -> list[Lease | LeaseLost]:
    """Which leases are current; those with less than `margin` seconds left are extended."""
    if not leases:
        return []
    now = spool.now()
    short = [x for x in leases if x.expires_at - now < margin]
    # By id and token: keyed by id alone, a stale lease checked beside the live lease of
    # its job passed for current (and with a margin, came back as the live one's).
    extended = {(x.job_id, x.token): x for x in heartbeat_many(spool, short, lease_seconds)
                if isinstance(x, Lease)} if short else {}
    rest = [x for x in leases if (x.job_id, x.token) not in extended]
    params = {"now": spool.now_param(), "ids": [x.job_id for x in rest],
              "tokens": [x.token for x in rest], "created": [x.job.created_at for x in rest]}
    live = ({(r[0], r[TOKEN_INDEX]) for r in spool.db.run(
        lambda c: c.execute(sql.CHECK, params).fetchall(), what="checking leases")}
        if rest else set())
    out: list[Lease | LeaseLost] = []
    for lease in leases:
        if (lease.job_id, lease.token) in extended:
            out.append(extended[(lease.job_id, lease.token)])
        elif (lease.job_id, lease.token) in live:
            out.append(lease)
        else:
            out.append(spool.db.run(functools.partial(lost, lease=lease), what="checking leases"))
    return out


@contextmanager
def fenced(spool: PgSpool, lease: Lease) -> Iterator[Lease]:
    """`PgSpool.fenced`: the job's row locked for the block, the lease checked before it
    and extended after it, in one transaction (`Database.block`: opened again after a lost
    connection, before anything of the block ran; a savepoint when nested)."""
    lost: LeaseLost | None = None

    def begin(conn: psycopg.Connection[Any]) -> tuple[Any, Any]:
        row = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = %s FOR UPDATE",
                           (lease.job_id,)).fetchone()
        return row, conn.execute("SELECT extract(epoch from now())::float8").fetchone()

    pid = os.getpid()
    with spool.db.block(begin, what="opening a fenced block") as (conn, (row, db_now)):
        if row is None:
            raise LeaseLost(lease.job_id, lease.token, "job is gone")
        clock = spool.now_param()
        now = clock if clock is not None else float(db_now[0]) if db_now else 0.0
        machine.check_lease(to_job(row), lease, now)
        key = (spool.display, lease.job_id, lease.token)
        with _FENCED_MUTEX:
            _FENCED[key] += 1
        try:
            with spool.db.pinned(conn):
                yield lease
        finally:
            with _FENCED_MUTEX:
                _FENCED[key] -= 1
                if _FENCED[key] <= 0:
                    del _FENCED[key]
        if os.getpid() != pid:
            return  # a child forked inside the block: the block is the parent's to end
        with spool.db.one_line_errors("ending a fenced block (what it did is rolled back)"):
            lost = _end_block(spool, conn, lease)
    if lost is not None:
        # As on the file spool: what the block did stands (committed above), and the
        # lease it ended is reported lost.
        raise lost


def _end_block(spool: PgSpool, conn: psycopg.Connection[Any], lease: Lease) -> LeaseLost | None:
    # From the block's end, not its start: a block longer than the lease left it
    # expired. Guarded: the block may have settled (or canceled) the job itself.
    end = spool.now_param()
    extended = conn.execute(
        "UPDATE jobspool_jobs SET expires_at = greatest(expires_at, "
        "coalesce(%s, extract(epoch from clock_timestamp())::float8) + %s), "
        "revision = revision + 1 WHERE id = %s AND state = 'leased' AND token = %s "
        "RETURNING 1", (end, lease.seconds or spool.lease_seconds, lease.job_id,
                        lease.token)).fetchone()
    if extended is not None:
        return None
    now_row = conn.execute("SELECT state FROM jobspool_jobs WHERE id = %s",
                           (lease.job_id,)).fetchone()
    return LeaseLost(lease.job_id, lease.token, f"job is {now_row[0] if now_row else 'gone'}")
