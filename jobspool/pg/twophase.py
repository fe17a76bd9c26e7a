"""Two-phase enqueue on PostgreSQL (the outbox): publishing and releasing a reservation.

`prepare` (step 1) is an insert of a caller-given id (`produce.insert_given`); `commit`
and `abort` lock the row and let the state machine decide (`machine.commit_reserved`,
`machine.abort_reserved`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobspool.queue import machine
from jobspool.queue.arguments import check_reservation
from jobspool.queue.job import Job, Reservation
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool


def commit(spool: PgSpool, reservation: Reservation) -> Job:
    """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
    check_reservation(reservation)

    def decide(job: Job, now: float) -> Job:
        return machine.commit_reserved(job, reservation.reservation_id, now=now)

    result: Job = spool.mutate_job(reservation.job_id, decide, what="commit")
    return result


def abort(spool: PgSpool, reservation: Reservation) -> Job | None:
    """Release one reservation; returns the canceled job when it was the last, else None."""
    check_reservation(reservation)
    changed: list[Job] = []

    def decide(job: Job, now: float) -> Job:
        new = machine.abort_reserved(job, reservation.reservation_id, now=now)
        if new is not job:
            changed.append(new)
        return new

    spool.mutate_job(reservation.job_id, decide, missing=lambda: None, what="abort")
    if changed and changed[-1].state is JobState.CANCELED:
        # Terminal writes count toward retention however they are made: counted on the
        # settle path alone, canceled rows grew without bound under producers that abort
        # and operators that cancel.
        spool.note_terminal(1)
        return changed[-1]
    return None
