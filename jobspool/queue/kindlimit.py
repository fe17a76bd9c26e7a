"""A kind's attempt limit (`Policy(max_attempts=)`) over jobs whose worker died running them.

A policy's limit replaces the job's own at the job's first recorded failure (`machine.fail`).
A run whose process died records no failure: the claim that takes the expired lease over
counts the attempt against the job's own limit (the spool's default, 5), which the store
alone knows. A kind limited to one attempt ran a second time after a crash. The worker
that claims such a job knows the kind's limit: past it, the job is dead-lettered unrun.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobspool.errors import JobspoolError
from jobspool.queue.job import Lease
from jobspool.queue.machine import Failure
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI
    from jobspool.queue.config import WorkerConfig

log = logging.getLogger("jobspool.queue.worker")


def over_kind_limit(config: WorkerConfig, leases: Sequence[Lease]) -> list[Lease]:
    """The claimed leases whose attempt (this one counted) is past their kind's limit."""
    out = []
    for lease in leases:
        limit = config.max_attempts_for(lease.job.kind)
        if limit is not None and lease.job.attempts > limit:
            out.append(lease)
    return out


def dead_letter_over_limit(spool: SpoolAPI, config: WorkerConfig,
                           leases: Sequence[Lease]) -> int:
    """Dead-letter each of `leases` (from `over_kind_limit`) without running it; how many
    were. A lease lost meanwhile is left to whoever holds the job now."""
    dead = 0
    for lease in leases:
        job = lease.job
        limit = config.max_attempts_for(job.kind)
        why = (f"attempts exhausted: attempt {job.attempts} is past its kind's max_attempts="
               f"{limit}" + (" (a worker died running it)" if job.rescues else ""))
        with contextlib.suppress(JobspoolError):
            done = spool.fail(lease, Failure(error=why, max_attempts=limit), retryable=False)
            if done.state is JobState.DEAD_LETTER:
                dead += 1
                log.warning("job %s (%s) dead-lettered unrun: %s", job.id, job.kind, why,
                            extra={"job_id": job.id, "kind": job.kind,
                                   "state": "dead_letter"})
    return dead


def give_back_strays(spool: SpoolAPI, config: WorkerConfig, leases: list[Lease],
                     strays: set[str]) -> list[Lease]:
    """Release, uncounted, claimed jobs of a kind this worker has no handler for (a claim
    must never return them; one did from a stale cache, and the missing handler crashed
    the worker), adding their ids to `strays` (never claimed again by this run); the rest
    run."""
    keep: list[Lease] = []
    for lease in leases:
        if lease.job.kind in config.handlers:
            keep.append(lease)
            continue
        log.error("job %s: claimed with kind %r, which this worker has no handler for; "
                  "released for a worker that has", lease.job_id, lease.job.kind,
                  extra={"job_id": lease.job_id, "kind": lease.job.kind})
        strays.add(lease.job_id)
        with contextlib.suppress(JobspoolError):
            spool.release(lease, reason="claimed by a worker without its handler")
    return keep
