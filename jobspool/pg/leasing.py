"""Claim, heartbeat and settle on PostgreSQL: one guarded statement per batch.

The state machine (`queue/machine.py`) computes what a settle writes (the
next state, attempts, backoff, clipped error) from the snapshot the claim
returned; the database applies it only where the lease is still current
(`sql.SETTLE`). What the machine decides does not depend on anything a lease
holder could not see: while a lease is current, nobody else may change its job.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import psycopg

from jobspool.errors import JobspoolError, JobTooLarge, LeaseLost, UnreadableJob
from jobspool.pg import sql
from jobspool.pg.beats import check_leases
from jobspool.pg.hotcursor import execute_hot
from jobspool.pg.refusal import refusal
from jobspool.pg.rows import COLUMNS, TOKEN_INDEX, dump, text, to_job
from jobspool.queue import claimnotes, machine
from jobspool.queue.backlog import Waiting
from jobspool.queue.job import KIND_RE, Job, Lease, LeaseInfo, evolve, fill_in, new_lease
from jobspool.queue.jobsize import encode_completed, fitted_anyway
from jobspool.queue.states import JobState

log = logging.getLogger("jobspool.pg")

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool

_IDLE = psycopg.pq.TransactionStatus.IDLE

# The sweep of expired leases runs inside claims at most this often per process.
SWEEP_EVERY = 1.0


def kinds_param(kinds: Iterable[str] | str | None) -> list[str] | None:
    if kinds is None:
        return None
    return [kinds] if isinstance(kinds, str) else list(kinds)


def sweep(spool: PgSpool, kinds: list[str] | None = None, *, exhausted_only: bool = False
          ) -> list[tuple[str, str]]:
    """Return expired leases to retryable (or dead_letter); (id, new state) per job."""
    params = {"now": spool.now_param(), "max_rescues": spool.max_rescues,
              "retry_base": spool.policy.base_seconds, "retry_max": spool.policy.max_seconds}
    statement = sql.sweep_sql(kinds, exhausted_only=exhausted_only)
    rows = spool.db.run(lambda c: c.execute(statement, params).fetchall(),
                        what="reclaiming expired leases")
    return [(r[0], r[1]) for r in rows]


def claim(spool: PgSpool, *, kinds: Iterable[str] | str | None, limit: int, owner: str,
          lease_seconds: float, exclude: Collection[str] = (),
          starts_noted: bool = False, take_over: bool = True) -> list[Lease]:
    """Lease due jobs, taking over expired leases in claim order as the file spool does
    (one statement; `take_over=False`: due jobs only). Expired leases out of attempts or
    rescues are dead-lettered by a sweep of the claim's kinds when one waits, when the
    claim came back empty, and at least once a second."""
    wanted = kinds_param(kinds)
    if wanted is not None and not wanted:
        return []  # no kind wanted: nothing (unfiltered, it took jobs of every kind)
    params = {"now": spool.now_param(), "max_rescues": spool.max_rescues,
              "owner": owner, "lease": lease_seconds, "proc": secrets.token_hex(8),
              "exclude": list(exclude), "started": False if starts_noted else None}
    statement = sql.claim_sql(wanted, limit, take_over=take_over)
    tries = 0

    def go(c: psycopg.Connection[Any]) -> list[Any]:
        nonlocal tries
        tries += 1
        if tries > 1:
            # Sent again after a lost connection: the first try may have committed before
            # its reply was lost. Its leases carry this call's mark (`proc`): adopt them,
            # or they would sit leased to nobody until they expire.
            adopted = c.execute(sql.ADOPT_CLAIM, params).fetchall()
            if adopted:
                return [(*r, True) for r in adopted]  # sweep: what it saw is unknown
        # Rows in binary: 50 rows of 21 columns decode ~3 µs a job faster than from text
        # (floats and integers are not parsed), ~9% of a claim + complete's client time.
        return c.execute(statement, params, binary=True).fetchall()  # payloads: not kept

    sent = spool.now()
    rows = spool.db.run(go, what="claim")
    if rows and tries == 1:
        _follow_the_database_clock(spool, rows, lease_seconds, sent)
    now = time.monotonic()
    exhausted = bool(rows) and bool(rows[0][-1])
    if spool.sweep_enabled and (not rows or exhausted or now >= spool.next_sweep):
        spool.next_sweep = now + SWEEP_EVERY
        _sweep_and_log(spool, wanted)
    jobs = sorted(_readable(spool, rows), key=lambda j: (j.priority, j.run_at, j.id))
    out = []
    for job in jobs:
        assert job.lease is not None
        out.append(new_lease(job_id=job.id, token=job.lease.token, owner=job.lease.owner,
                             expires_at=job.lease.expires_at, job=job, seconds=lease_seconds))
        if starts_noted and job.rescues:
            spool.unnoted_starts.add(job.lease.token)  # `note_started` records it
    return out


_EXPIRES = [c.strip() for c in COLUMNS.split(",")].index("expires_at")


def _follow_the_database_clock(spool: PgSpool, rows: list[Any], lease_seconds: float,
                               sent: float) -> None:
    """A fresh claim says what the database's clock read while it ran (its leases expire a
    lease from then): when that falls outside what this process's estimate read between
    sending the claim and getting its rows, by more than a little, the process follows.
    The estimate was measured once, at open: after the database's clock stepped back by
    more than a lease (an NTP correction there, a failover to a replica behind), every
    lease it handed out looked expired here, and the worker claimed and dropped jobs for
    ever without starting one. Inside the window is no evidence of a step: a claim that
    waited on a lock began long before its rows came back."""
    expires = rows[0][_EXPIRES]
    if spool.now_param() is not None or not isinstance(expires, float):  # a given clock
        return
    said = expires - lease_seconds  # the claim's transaction began then
    got = spool.now()
    slack = max(0.05, min(1.0, lease_seconds / 4))
    if sent - slack <= said <= got + slack:
        return
    spool.follow_clock(said)  # at or below the database's clock now: never ahead of it
    log.warning("the database's clock is %.1f s %s this process's estimate of it (a clock "
                "stepped there?); following it", abs(said - (sent if said < sent else got)),
                "behind" if said < sent else "ahead of")


def _readable(spool: PgSpool, rows: list[Any]) -> list[Job]:
    """The claimed jobs; a row that cannot be read as a job (a hand edit: JSON the parser
    refuses, a NaN time) is dead-lettered on its own, naming why, and its batch mates run.
    Decoded after the claim committed, one such row failed the whole claim: every lease
    of the batch was lost in the process, and the same row came back in every next batch."""
    jobs, unreadable = [], []
    for r in rows:
        try:
            jobs.append(to_job(r[:-1]))
        except UnreadableJob as exc:
            unreadable.append({"id": r[0], "token": r[TOKEN_INDEX], "why": str(exc)[:1024]})
    if unreadable:
        params = {"now": spool.now_param(), "rows": orjson.dumps(unreadable).decode()}
        spool.db.run(lambda c: c.execute(sql.DEAD_LETTER_UNREADABLE, params),
                     what="dead-lettering unreadable rows")
        for u in unreadable:
            log.error("dead-lettered %s", u["why"])
    return jobs


def note_started(spool: PgSpool, tokens: Iterable[int]) -> None:
    """Record, before its handler runs, that a rescued job's lease started (see sql.py,
    "charging an expired lease"): one statement, only for leases a Worker claimed of
    rescued jobs, which run alone. Others need no record: they are charged anyway."""
    marked = [t for t in tokens if t in spool.unnoted_starts]
    if not marked:
        return
    spool.db.run(lambda c: c.execute(
        "UPDATE jobspool_jobs SET started = true WHERE token = ANY(%s) AND state = 'leased'",
        (marked,)), what="recording a handler's start")
    spool.unnoted_starts.difference_update(marked)


def _sweep_and_log(spool: PgSpool, kinds: list[str] | None) -> list[tuple[str, str]]:
    swept = sweep(spool, kinds, exhausted_only=True)
    if swept:
        spool.log_swept(swept)
        claimnotes.dead_lettered(sum(1 for _, state in swept if state == "dead_letter"))
    return swept


def _as_holder(lease: Lease) -> Job:
    """The lease's snapshot as its holder sees it: the machine's lease check always
    passes here; the database's guard is the one that decides."""
    info = LeaseInfo(token=lease.token, owner=lease.owner, expires_at=math.inf)
    return evolve(lease.job, state=JobState.LEASED, lease=info)


def _execute(conn: psycopg.Connection[Any], query: str, params: Any, *,
             binary: bool = False) -> psycopg.Cursor[Any]:
    return conn.execute(query, params, binary=binary)


def _apply(spool: PgSpool, statement: str, leases: Sequence[Lease], params: dict[str, Any],
           what: str, locked_ok: bool = False,
           build: Callable[[Sequence[Any]], Job] = to_job) -> dict[str, Job | LeaseLost]:
    sends = 0

    def go(conn: psycopg.Connection[Any]) -> dict[str, Job | LeaseLost]:
        nonlocal sends
        sends += 1
        # Rows in binary, as the claim's; a kept cursor only for a statement returning the
        # few columns a settle changes (one returning whole rows would keep their payloads).
        run = execute_hot if build is not to_job else _execute
        rows = run(conn, statement, params, binary=True).fetchall()
        done: dict[str, Job | LeaseLost] = {r[0]: build(r) for r in rows}
        for lease in leases:
            if lease.job_id not in done:
                done[lease.job_id] = refusal(conn, lease, resent=sends > 1,
                                              now=spool.now() if locked_ok else math.inf)
        return done

    return spool.db.run(go, what=what)


def settle(spool: PgSpool, leases: Sequence[Lease], actions: Sequence[tuple[str, Any]]
           ) -> list[Job | JobspoolError]:
    """Complete, fail or release leases in one statement; per item the job or the refusal."""
    now = spool.now()
    out: list[Job | JobspoolError | None] = []
    chosen: list[tuple[Lease, Job, float | None]] = []
    seen: set[str] = set()
    refused: dict[str, JobTooLarge] = {}  # dead-lettered for a result that does not fit
    # Two leases of one job in a batch: the store says which is current before any is
    # settled. The first was taken, and the live lease after a stale one was refused as
    # "settled twice" (the job then ran again), where the file spool settles it.
    stale = _stale_doubles(spool, leases)
    for lease, (action, arg) in zip(leases, actions, strict=True):
        try:
            if id(lease) in stale:
                raise stale[id(lease)]
            if lease.job_id in seen:
                raise LeaseLost(lease.job_id, lease.token, "settled twice in one batch")
            try:
                new = _decide(spool, lease, action, arg, now, refused)
            except LeaseLost:
                raise
            except JobspoolError:
                fixed = _with_stored_payload(spool, lease)
                if fixed is None:
                    raise
                lease = fixed
                new = _decide(spool, lease, action, arg, now, refused)
        except LeaseLost as exc:
            out.append(exc)
            continue
        except JobspoolError as exc:
            # A result refused before anything is sent (not JSON): a lease no longer
            # current is what the caller hears first, as from the file spool, whose lease
            # check comes before the result's.
            current = check_leases(spool, [lease], margin=0.0,
                                   lease_seconds=spool.lease_seconds)[0]
            out.append(current if isinstance(current, LeaseLost) else exc)
            continue
        seen.add(lease.job_id)
        moved = new.run_at != lease.job.run_at
        chosen.append((lease, new, (new.run_at - now) if moved else None))
        out.append(None)
    if chosen:
        results = [None if new.result is None else dump(new.result) for _, new, _ in chosen]
        statement, params = _settle_params(spool, chosen, results)
        built = {lease.job_id: (new, stored)
                 for (lease, new, _), stored in zip(chosen, results, strict=True)}

        def settled(row: Sequence[Any]) -> Job:
            # The job as stored: the database's revision, clock and run_at; text columns
            # as `text()` stored them; the result as its JSON reads back. Filled into the
            # job built above, which nobody holds yet (idempotent if the settle is resent).
            new, stored = built[row[0]]
            return fill_in(new, revision=int(row[1]), updated_at=row[2], run_at=row[3],
                           last_error=text(new.last_error), traceback=text(new.traceback),
                           result=None if stored is None else orjson.loads(stored))

        done = _apply(spool, statement, [lease for lease, _, _ in chosen], params, "settle",
                      build=settled)
        got = [done[lease.job_id] for lease, _, _ in chosen]
        spool.note_terminal(sum(1 for g in got if isinstance(g, Job) and g.terminal))
        # A job dead-lettered for its result is reported by the error that says so.
        it = iter(refused.get(g.id, g) if isinstance(g, Job) else g for g in got)
        out = [next(it) if o is None else o for o in out]
    return [o for o in out if o is not None]


def _decide(spool: PgSpool, lease: Lease, action: str, arg: Any, now: float,
            refused: dict[str, JobTooLarge]) -> Job:
    """The job a settle of `lease` writes (`action`: complete, fail or release)."""
    if action == "complete":
        # machine.complete on the holder's snapshot, whose lease check always
        # passes (see `_as_holder`): the same job, built in one step.
        new = evolve(lease.job, state=JobState.COMPLETED, lease=None, result=arg,
                     revision=lease.job.revision + 1, updated_at=now)
        if arg is not None:
            # Without a result a completion only drops the lease: the job is no
            # larger than before its claim, when it fit. Nothing to check.
            try:
                new = encode_completed(new, max_bytes=spool.max_job_bytes)[0]
            except JobTooLarge as exc:
                new, told = machine.result_refused(_as_holder(lease), lease, exc,
                                                   now=now, policy=spool.policy)
                new = fitted_anyway(new, max_bytes=spool.max_job_bytes)[0]
                refused[lease.job_id] = told
    else:
        new = machine.settle(_as_holder(lease), lease, action, arg, now=now,
                             policy=spool.policy, rng=spool.rng)
        if new.last_error or new.traceback:
            # Cut to fit as the file spool cuts its file (DESIGN §9, sizes).
            new = fitted_anyway(new, max_bytes=spool.max_job_bytes)[0]
    return new


def _with_stored_payload(spool: PgSpool, lease: Lease) -> Lease | None:
    """The lease with its job's payload as stored, when the one in hand can no longer be
    encoded (its handler put a set or an object into `ctx.lease.job.payload`, which it
    shares); None when the payload is not the cause. The settle decides from the claim's
    snapshot: such a job could not be settled at all, stayed leased, ran again at every
    expiry and was dead-lettered as a dead worker's."""
    try:
        dump(lease.job.payload)
        return None
    except (TypeError, ValueError, JobspoolError):
        pass
    try:
        stored = spool.get(lease.job_id)
    except JobspoolError:
        return None
    if stored.created_at != lease.job.created_at:
        return None
    log.warning("job %s: its handler changed the claimed job's payload into something JSON "
                "cannot carry; settled with the payload as stored", lease.job_id,
                extra={"job_id": lease.job_id})
    return dataclasses.replace(lease, job=evolve(lease.job, payload=stored.payload))


def _settle_params(spool: PgSpool, chosen: list[tuple[Lease, Job, float | None]],
                   results: list[str | None]) -> tuple[str, dict[str, Any]]:
    """The settle statement for `chosen` and its parameters: plain completions as one JSON
    document (`sql.SETTLE_COMPLETE`), anything else as arrays (`sql.SETTLE`)."""
    # A completion whose result made room by cutting an earlier run's error (see
    # `encode_completed`) writes those columns too: the general form.
    if (all(new.state is JobState.COMPLETED and new.last_error == lease.job.last_error
            and new.traceback == lease.job.traceback for lease, new, _ in chosen)
            and not any(r is not None and "\\u0000" in r for r in results)):
        # Each result is already JSON text: embedded as it is (a Fragment), not re-encoded.
        batch = [{"id": lease.job_id, "token": lease.token, "created": lease.job.created_at,
                  "result": None if r is None else orjson.Fragment(r)}
                 for (lease, _, _), r in zip(chosen, results, strict=True)]
        return sql.SETTLE_COMPLETE, {"now": spool.now_param(),
                                     "batch": orjson.dumps(batch).decode()}
    params: dict[str, Any] = {
        "now": spool.now_param(),
        "ids": [lease.job_id for lease, _, _ in chosen],
        "tokens": [lease.token for lease, _, _ in chosen],
        "created": [lease.job.created_at for lease, _, _ in chosen],
        "states": [new.state.value for _, new, _ in chosen],
        "attempts": [new.attempts for _, new, _ in chosen],
        "rescues": [new.rescues for _, new, _ in chosen],
        "delays": [None if d is None else max(0.0, d) for _, _, d in chosen],
        "results": results,
        "errors": [text(new.last_error) for _, new, _ in chosen],
        "tracebacks": [text(new.traceback) for _, new, _ in chosen],
        "max_attempts": [new.max_attempts for _, new, _ in chosen],
    }
    return sql.SETTLE, params


def _stale_doubles(spool: PgSpool, leases: Sequence[Lease]) -> dict[int, LeaseLost]:
    """For a job named by several leases of a batch, the refusals of those not current
    (by `id()` of the lease): one statement, only when a batch has such a job."""
    counts = Counter(lease.job_id for lease in leases)
    doubles = [lease for lease in leases if counts[lease.job_id] > 1]
    if not doubles:
        return {}
    verdicts = check_leases(spool, doubles, margin=0.0, lease_seconds=None)
    return {id(lease): v for lease, v in zip(doubles, verdicts, strict=True)
            if isinstance(v, LeaseLost)}


def next_due_at(spool: PgSpool, kinds: Iterable[str] | None) -> float | None:
    wanted = kinds_param(kinds)
    if wanted is not None:
        # A name no kind can have has no job (and is written into the statement's text).
        wanted = [str.__str__(k) for k in wanted if isinstance(k, str) and KIND_RE.fullmatch(k)]
        if not wanted:
            return None
    statement = sql.next_due_sql(None if wanted is None else tuple(sorted(set(wanted))))
    params = {"now": spool.now_param()}
    row = spool.db.run(lambda c: c.execute(statement, params).fetchone(),
                       what="finding the next due job")
    if row is None or row[0] is None:
        return None
    # In this process's clock (`PgSpool.now`), which the worker compares it with.
    return float(row[0]) - float(row[1]) + spool.now()


def waiting(spool: PgSpool) -> dict[str, Waiting]:
    params = {"now": spool.now_param()}
    rows = spool.db.run(lambda c: c.execute(sql.WAITING, params).fetchall(),
                        what="counting the jobs waiting")
    # `next_at` in this process's clock (`PgSpool.now`), as `next_due_at` gives it.
    return {kind: Waiting(due, later, None if first is None
                          else float(first) - float(db_now) + spool.now())
            for kind, due, later, first, db_now in rows}


