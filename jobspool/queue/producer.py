"""`Producer`: adding jobs to a file spool — enqueue (one call, many jobs) and two-phase.

Producers write their new files before they take the spool lock: creating
inodes is the costly part of an enqueue, and other processes need not wait
for it. Only the renames that publish them happen under the lock, and a
batch of pure inserts shares its directory flush with concurrent producers
(`Journal.await_group_flush`, groupflush.py) before the call returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from jobspool.errors import SpoolError, WriteFailed
from jobspool.queue import machine
from jobspool.queue.arguments import naming_item, new_batch, new_reservation
from jobspool.queue.job import EnqueueResult, Job, Reservation, evolve, validate_delay
from jobspool.queue.jobsize import encode_admitted
from jobspool.queue.journal import Journal
from jobspool.queue.states import JobState
from jobspool.queue.store import Change

log = logging.getLogger(__name__)


class Producer:
    """Enqueue, prepare, commit and abort on a `Journal`."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        """`enqueue_many`, returning an `EnqueueResult` per payload."""
        batch = new_batch(kind, payloads, job_ids=job_ids, delay=delay, run_at=run_at,
                          priority=priority, max_attempts=max_attempts,
                          on_conflict=on_conflict, unique_states=unique_states,
                          timeout=timeout, now=self.journal.now(), default_attempts=self.journal.max_attempts)
        fresh, at = batch.fresh, batch.run_at
        # Encode (refusing bad input) and write the new files before taking the lock:
        # creating inodes is the costly part of an enqueue, and other processes need not
        # wait for it. Only the renames that publish them happen under the lock.
        datas = []
        for i, job in enumerate(fresh):
            with naming_item(i, len(fresh)):
                datas.append(encode_admitted(job, max_bytes=self.journal.max_job_bytes))
        # One staged file per id: an id given twice in one batch stores its first payload
        # (the second is an idempotent repeat), and nothing is staged for the repeat.
        firsts = {job.id: i for i, job in reversed(list(enumerate(fresh)))}
        order = sorted(firsts.values())
        paths = self.journal.store.prestage([datas[i] for i in order])
        staged = {fresh[i].id: path for i, path in zip(order, paths, strict=True)}
        try:
            with self.journal.lock.hold():
                out = self._insert(fresh, given=job_ids is not None, now=self.journal.now(),
                                   delay=batch.delay, run_at=at, on_conflict=batch.on_conflict,
                                   unique_states=batch.unique_states, staged=staged,
                                   encoded={fresh[i].id: datas[i] for i in order}, group=True)
        finally:
            self.journal.store.discard(list(staged.values()))  # whatever was not published
        # Published under the lock; durable once a flush shared with concurrent producers
        # covers it (groupflush.py). Only then is the enqueue reported done.
        self.journal.await_group_flush()
        return out

    def _refuse_unreadable(self, job_id: str) -> None:
        """An id whose only file is unreadable is not free: writing over it would destroy
        what `recover` would quarantine for a human to look at."""
        where = self.journal.unreadable_file(job_id)
        if where is not None:
            raise SpoolError(f"job id {job_id!r} is taken by an unreadable file {where}; run "
                             "`jobspool recover` (it moves the file to quarantine/) before "
                             "reusing the id", path=str(self.journal.root / where))

    def _insert(self, fresh: list[Job], *, given: bool, now: float, delay: float,
                run_at: float | None = None, on_conflict: str = "keep",
                unique_states: frozenset[JobState] | None = None,
                reservation: str | None = None,
                staged: dict[str, str] | None = None,
                encoded: dict[str, bytes] | None = None,
                group: bool = False) -> list[EnqueueResult]:
        """Publish new jobs; `staged` maps ids to files already written for them (those
        that get published are removed from it, the caller discards the rest). With
        `group`, a batch of pure inserts leaves its directory flush to the caller's
        `_await_group_flush` after the lock is released."""
        staged = {} if staged is None else staged
        publish: dict[str, str] = {}
        out: list[EnqueueResult] = []
        pairs: list[tuple[Job | None, Job | None]] = []
        stale: list[Change] = []
        seen: dict[str, EnqueueResult] = {}
        try:
            for job in fresh:
                if job.id in seen:
                    out.append(EnqueueResult(seen[job.id].job, "existing"))
                    continue
                existing, copies = self.journal.locate(job.id) if given else (None, [])
                if given and existing is None:
                    self._refuse_unreadable(job.id)
                stale.extend(self.journal.stale_removals(job.id, copies))
                if existing is None:
                    if job.id in staged:
                        new = job  # exactly what was written outside the lock
                        publish[job.id] = staged.pop(job.id)
                    else:
                        due = now + delay if run_at is None else run_at
                        new = evolve(job, created_at=now, updated_at=now, run_at=due)
                    pairs.append((None, new))
                    result = EnqueueResult(new, "created")
                else:
                    outcome, new = machine.decide_enqueue(
                        existing, job, now=now, on_conflict=on_conflict,
                        unique_states=unique_states, reservation=reservation,
                        max_bytes=self.journal.max_job_bytes)
                    if outcome != "existing":
                        pairs.append((existing, new))
                    result = EnqueueResult(new, outcome)
                seen[job.id] = result
                out.append(result)
            # Backpressure counts only what this call adds to the backlog: an idempotent
            # re-enqueue of an existing job adds nothing and is never refused.
            self._admit(sum(1 for old, new in pairs
                            if new is not None and machine.adds_to_backlog(old, new)))
            self.journal.commit_changes(pairs, stale, staged=publish, group=group,
                                        encoded={i: encoded[i] for i in publish}
                                        if encoded else None)
        except BaseException:
            # Not published: the caller discards them. (A refusal met after an earlier id
            # had taken its staged file left that file in tmp/ for good.)
            staged.update(publish)
            raise
        return out

    def _admit(self, n: int) -> None:
        """Writer backpressure (off unless `max_due`/`max_lag_seconds` are set)."""
        if n == 0 or (self.journal.max_due is None and self.journal.max_lag_seconds is None):
            return
        from jobspool.queue.backpressure import admit

        admit(self.journal, n)

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        job = new_reservation(kind, payload, job_id=job_id, delay=delay, run_at=run_at,
                              priority=priority, max_attempts=max_attempts, timeout=timeout,
                              now=self.journal.now(), default_attempts=self.journal.max_attempts)
        jid, rid, at = job.id, job.reservations[0], job.run_at if run_at is not None else None
        delay = validate_delay(delay)
        encode_admitted(job, max_bytes=self.journal.max_job_bytes)
        with self.journal.lock.hold():
            try:
                (stored,) = self._insert([job], given=job_id is not None,
                                         now=self.journal.now(), delay=delay, run_at=at,
                                         reservation=rid)
            except WriteFailed as exc:
                if jid not in exc.landed:
                    raise
                # Published, not confirmed durable: the reservation holds the job. Raised,
                # the caller prepared again (a second reservation, under a new id) and the
                # first, which no one could name, kept the job in `prepared` for good.
                log.warning("prepare: %s; the reservation reached the disk and is returned",
                            exc)
                found, _ = self.journal.locate(jid)
                if found is None or rid not in found.reservations:
                    raise
                return Reservation(job_id=jid, reservation_id=rid, job=found)
        return Reservation(job_id=jid, reservation_id=rid, job=stored.job)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        with self.journal.lock.hold():
            job, stale = self.journal.locate(reservation.job_id)
            if job is None:
                raise self.journal.missing(reservation.job_id)
            new = machine.commit_reserved(job, reservation.reservation_id,
                                          now=self.journal.now())
            if new is not job:
                self.journal.commit_changes([(job, new)],
                                            self.journal.stale_removals(job.id, stale))
            return new

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        with self.journal.lock.hold():
            job, stale = self.journal.locate(reservation.job_id)
            if job is None:
                return None
            new = machine.abort_reserved(job, reservation.reservation_id,
                                         now=self.journal.now())
            if new is job:
                return None
            self.journal.commit_changes([(job, new)], self.journal.stale_removals(job.id, stale))
            return new if new.state is JobState.CANCELED else None
