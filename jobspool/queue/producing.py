"""`EnqueueForms`: `enqueue`, `enqueue_result` and `enqueue_many`, derived once for every
store from its one batch form, `enqueue_many_results`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from jobspool.queue.job import EnqueueResult, Job
from jobspool.queue.states import JobState


class EnqueueForms:
    """Mixed into each store (the file `Spool`, `PgSpool`), which supplies
    `enqueue_many_results`."""

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        raise NotImplementedError

    def enqueue(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, on_conflict: str = "keep",
                unique_states: Iterable[JobState | str] | None = None,
                timeout: float | None = None) -> Job:
        """Add a job; `delay` > 0 or a future `run_at` parks it (scheduled) until due.

        `timeout` (seconds) limits each run of this job, over its kind's `Policy`.

        With the `job_id` of an existing job, `on_conflict` decides (DESIGN §9):
        `"keep"` returns it unchanged (a canceled one is reopened), `"replace"`
        rewrites it (a finished one runs again; a leased one raises
        `DuplicateJob`), `"error"` raises `DuplicateJob`. `unique_states` narrows
        the conflict to existing jobs in those states (a leased job always
        conflicts); any other existing job is replaced. `enqueue_result` says
        whether the call created anything.
        """
        return self.enqueue_result(kind, payload, job_id=job_id, delay=delay, run_at=run_at,
                                   priority=priority, max_attempts=max_attempts,
                                   on_conflict=on_conflict, unique_states=unique_states,
                                   timeout=timeout).job

    def enqueue_result(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                       delay: float = 0.0, run_at: float | datetime | None = None,
                       priority: int = 0, max_attempts: int | None = None,
                       on_conflict: str = "keep",
                       unique_states: Iterable[JobState | str] | None = None,
                       timeout: float | None = None) -> EnqueueResult:
        """`enqueue`, returning an `EnqueueResult`: the job and whether this call created it."""
        ids = None if job_id is None else [job_id]
        return self.enqueue_many_results(kind, [payload], job_ids=ids, delay=delay,
                                         run_at=run_at, priority=priority,
                                         max_attempts=max_attempts, on_conflict=on_conflict,
                                         unique_states=unique_states, timeout=timeout)[0]

    def enqueue_many(self, kind: str, payloads: Iterable[Any], *,
                     job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                     run_at: float | datetime | None = None, priority: int = 0,
                     max_attempts: int | None = None, on_conflict: str = "keep",
                     unique_states: Iterable[JobState | str] | None = None,
                     timeout: float | None = None) -> list[Job]:
        """Add many jobs of one kind under one lock hold and one shared flush.

        All input is validated before anything is written: one bad item (or,
        with `on_conflict="error"`, one taken id) and nothing of the batch lands.
        """
        return [r.job for r in self.enqueue_many_results(
            kind, payloads, job_ids=job_ids, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, on_conflict=on_conflict, unique_states=unique_states,
            timeout=timeout)]
