"""`recover` on the PostgreSQL store: DESIGN §6 without the file steps.

A database has no duplicate copies, temp files or unreadable files to settle, so
recovery raises the token sequence above any token a row holds, sweeps expired
leases, replays prepared jobs older than the grace period through the kinds' hooks,
and prunes; it reports in the file spool's `RecoveryReport`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from jobspool.errors import JobspoolError
from jobspool.pg.admin import prune, still_above
from jobspool.pg.leasing import sweep
from jobspool.pg.rows import COLUMNS, to_job
from jobspool.pg.schema import fence_above_tokens
from jobspool.queue import machine
from jobspool.queue.job import Job
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool
    from jobspool.recovery.recover import RecoveryReport

log = logging.getLogger("jobspool.pg")


def recover(spool: PgSpool, replay: Any = None) -> RecoveryReport:
    """Reclaim expired leases, replay prepared jobs older than the grace period, prune."""
    from jobspool.recovery.recover import RecoveryReport
    from jobspool.recovery.replay import ask, hook_for

    fence_before = spool.fence_value()
    raised = _raise_fence(spool, fence_before)
    swept = sweep(spool)
    reclaimed = tuple(i for i, s in swept if s == JobState.RETRYABLE.value)
    dead = [i for i, s in swept if s == JobState.DEAD_LETTER.value]
    swept_dead = len(dead)  # replay's dead letters follow
    cutoff = spool.now() - spool.prepare_grace_seconds
    out: dict[str, list[str]] = {"committed": [], "aborted": [], "unknown": []}
    pending: list[str] = []
    for job in list(spool.jobs(state=JobState.PREPARED)):
        if job.updated_at > cutoff:
            continue
        hook = hook_for(replay, job.kind)
        if hook is None:
            pending.append(job.id)
            continue
        verdict = ask(hook, job)
        written: list[Job] = []

        def decide(cur: Job, now: float, v: Any = verdict, written: list[Job] = written
                   ) -> Job:
            if cur.state is not JobState.PREPARED or cur.revision != v.job.revision \
                    or cur.updated_at != v.job.updated_at:
                return cur  # the producer spoke meanwhile: its word wins over the hook's
            new = machine.replay(cur, v.outcome, now=now, error=v.error)
            written.append(new)
            return new

        try:
            spool.mutate_job(job.id, decide, missing=lambda: None, what="replay")
        except JobspoolError:
            continue
        # Counted by what was written, under the verdict that wrote it (as the file spool
        # does): sorted by the row's state instead, a job committed by its producer while
        # the hook ran was reported replayed, and a delayed one the hook committed (now
        # retryable, not yet due) was reported unresolved.
        if not written:
            continue
        if written[-1].state is JobState.DEAD_LETTER:
            dead.append(job.id)
        else:
            out[verdict.outcome].append(job.id)
    fence_after = spool.fence_value()
    pruned = prune(spool).pruned
    report = RecoveryReport(leases_reclaimed=reclaimed, dead_lettered=tuple(dead),
                            replayed_committed=tuple(out["committed"]),
                            replayed_aborted=tuple(out["aborted"]),
                            replay_unknown=tuple(out["unknown"]),
                            prepared_pending=tuple(pending), pruned=tuple(pruned),
                            fence_before=fence_before, fence_after=fence_after,
                            fence_raised=raised)
    _log_recovery(spool, report, swept_dead=swept_dead)
    return report


def _log_recovery(spool: PgSpool, report: Any, *, swept_dead: int) -> None:
    """What the file spool's recovery logs: each dead letter (a human must look), then the
    counts. Silent here, a boot log never said that recovery dead-lettered jobs."""
    from jobspool.recovery.recover import warn_dead

    ids = list(report.dead_lettered)
    if ids:
        rows = spool.db.run(lambda c: c.execute(
            f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = ANY(%s)", (ids,)).fetchall(),
            what="recover")
        held = {row[0]: row for row in rows}
        for n, job_id in enumerate(ids):
            if job_id in held:  # else pruned or requeued since: nothing left to point at
                with contextlib.suppress(JobspoolError):
                    warn_dead(to_job(held[job_id]),
                              "on reclaim by recovery" if n < swept_dead else "by replay")
    if report.changed:
        log.info("recovery of %s: %s", spool.display,
                 {k: v for k, v in report.counts.items() if v})


def _raise_fence(spool: PgSpool, fence: int) -> tuple[str, ...]:
    """Raise the token sequence above every token a row holds (rows restored from a
    backup, or written by hand): otherwise claims would hand those tokens out again."""
    rows = spool.db.run(lambda c: c.execute(
        "SELECT id, token FROM jobspool_jobs WHERE token > %s ORDER BY id", (fence,)
    ).fetchall(), what="reading tokens above the fence")
    rows = still_above(spool, rows)
    if not rows:
        return ()
    # Claims may draw tokens while it is set: `FENCE_MARGIN` above the highest token on
    # disk, no token they drew meanwhile is handed out again afterwards.
    spool.db.run(fence_above_tokens, what="raising the fence")
    ids = tuple(r[0] for r in rows)
    log.warning("fence of %s raised from %d (tokens in rows above it: %s)", spool.display,
                fence, ", ".join(ids[:10]))
    return ids
