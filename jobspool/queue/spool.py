"""`Spool`: the public face of one spool directory.

Every mutation runs under the spool lock in three steps: read the job files
it concerns, let the state machine (`machine.py`) compute the next
snapshots, hand them to the store (`store.py`) as one batch. Reads that do
not need a consistent view (`get`, `jobs`) run without the lock.

Cost per operation is independent of how many jobs the spool holds: an
operation on one job reads and writes that job's files only (a lookup by id
probes the seven state directories by name, it never lists them), and a
claim lists `ready/`, `retryable/` and `leased/` at most once per batch —
and only when another writer changed them since this process last looked
(see `index.py`) — then reads only the candidate files it needs. Listing
whole directories is left to `jobs`, `stats` and recovery, which are
administrative and O(jobs) by nature.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from jobspool.errors import (
    InvalidTransition,
    JobNotFound,
    SpoolError,
)
from jobspool.queue import machine
from jobspool.queue.arguments import (
    job_states,
    new_batch,
    new_reservation,
    wait_until_terminal,
)
from jobspool.queue.job import (
    EnqueueResult,
    Job,
    Reservation,
    encode_admitted,
    evolve,
    validate_job_id,
    validate_kind,
    validate_seconds,
)
from jobspool.queue.leasing import LeasingSpool
from jobspool.queue.marks import read_marks, write_marks
from jobspool.queue.perms import file_mode
from jobspool.queue.producing import EnqueueForms
from jobspool.queue.states import ALL_STATES, JobState, check_source
from jobspool.queue.stats import Stats, collect_stats
from jobspool.queue.store import Change
from jobspool.queue.wakeup import DirWatcher

if TYPE_CHECKING:
    from jobspool.health import Health
    from jobspool.recovery.fsck import FsckReport
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport, ReplayHook


class Spool(EnqueueForms, LeasingSpool):
    """A durable job queue in one directory, shared safely by threads and processes.

    Given a `postgresql://` URL instead of a directory, `Spool(url, ...)` returns a
    `jobspool.pg.spool.PgSpool`: the same API on the PostgreSQL store (DESIGN §9).
    """

    def __new__(cls, root: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Spool:
        from jobspool.pg import is_url

        if is_url(root):
            from jobspool.pg.spool import PgSpool

            # Not a subclass: __init__ is not run again on it. Same public API (duck-typed).
            return cast("Spool", PgSpool(str(root), *args, **kwargs))
        return super().__new__(cls)

    def _autoprune(self) -> None:
        from jobspool.recovery.prune import prune_if_over

        prune_if_over(self)

    def schedule_marks(self) -> dict[str, int]:
        """The last fired tick of each schedule (`<root>/schedules.json`)."""
        return read_marks(self.root)

    @contextmanager
    def hold_schedule_marks(self) -> Iterator[dict[str, int]]:
        """The marks under the spool lock; what the block leaves in the dict is saved."""
        with self._lock.hold():
            marks = read_marks(self.root)
            before = dict(marks)
            yield marks
            if marks != before:
                write_marks(self.root, marks, durable=self.durable,
                            mode=file_mode(self.access))

    def stop_retrying(self, stop: bool = True) -> None:
        """Nothing to give up: a local disk does not go away (the database store's hook)."""

    def arrival_watcher(self) -> DirWatcher:
        """Wakes an idle worker when a job file lands in ready/ or retryable/ (inotify)."""
        return DirWatcher([self.root / JobState.READY.value,
                           self.root / JobState.RETRYABLE.value])

    # ------------------------------------------------------------ producing

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
                          timeout=timeout, now=self.now(), default_attempts=self.max_attempts)
        fresh, at = batch.fresh, batch.run_at
        # Encode (refusing bad input) and write the new files before taking the lock:
        # creating inodes is the costly part of an enqueue, and other processes need not
        # wait for it. Only the renames that publish them happen under the lock.
        datas = [encode_admitted(job, max_bytes=self.max_job_bytes) for job in fresh]
        # One staged file per id: an id given twice in one batch stores its first payload
        # (the second is an idempotent repeat), and nothing is staged for the repeat.
        firsts = {job.id: i for i, job in reversed(list(enumerate(fresh)))}
        order = sorted(firsts.values())
        paths = self._store.prestage([datas[i] for i in order])
        staged = {fresh[i].id: path for i, path in zip(order, paths, strict=True)}
        try:
            with self._lock.hold():
                out = self._insert(fresh, given=job_ids is not None, now=self.now(),
                                   delay=batch.delay, run_at=at, on_conflict=batch.on_conflict,
                                   unique_states=batch.unique_states, staged=staged,
                                   group=True)
        finally:
            self._store.discard(list(staged.values()))  # whatever was not published
        # Published under the lock; durable once a flush shared with concurrent producers
        # covers it (groupflush.py). Only then is the enqueue reported done.
        self._await_group_flush()
        return out

    def _refuse_unreadable(self, job_id: str) -> None:
        """An id whose only file is unreadable is not free: writing over it would destroy
        what `recover` would quarantine for a human to look at."""
        for state in ALL_STATES:
            path = self.root / state.value / f"{job_id}.json"
            if os.path.lexists(path):
                raise SpoolError(f"job id {job_id!r} is taken by an unreadable file "
                                 f"{state.value}/{job_id}.json; run `jobspool recover` (it "
                                 "moves the file to quarantine/) before reusing the id",
                                 path=str(path))

    def _insert(self, fresh: list[Job], *, given: bool, now: float, delay: float,
                run_at: float | None = None, on_conflict: str = "keep",
                unique_states: frozenset[JobState] | None = None,
                reservation: str | None = None,
                staged: dict[str, str] | None = None,
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
        for job in fresh:
            if job.id in seen:
                out.append(EnqueueResult(seen[job.id].job, "existing"))
                continue
            existing, copies = self.locate(job.id) if given else (None, [])
            if given and existing is None:
                self._refuse_unreadable(job.id)
            stale.extend(self.stale_removals(job.id, copies))
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
                    unique_states=unique_states, reservation=reservation)
                if outcome != "existing":
                    pairs.append((existing, new))
                result = EnqueueResult(new, outcome)
            seen[job.id] = result
            out.append(result)
        # Backpressure counts only what this call adds to the backlog: an idempotent
        # re-enqueue of an existing job adds nothing and is never refused.
        try:
            self._admit(sum(1 for old, new in pairs if old is None or old.terminal))
            self.commit_changes(pairs, stale, staged=publish, group=group)
        except BaseException:
            staged.update(publish)  # not published: the caller discards them
            raise
        return out

    def _admit(self, n: int) -> None:
        """Writer backpressure (off unless `max_due`/`max_lag_seconds` are set)."""
        if n == 0 or (self.max_due is None and self.max_lag_seconds is None):
            return
        from jobspool.queue.backpressure import admit

        admit(self, n)

    # ------------------------------------------------------------ two-phase

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        job = new_reservation(kind, payload, job_id=job_id, delay=delay, run_at=run_at,
                              priority=priority, max_attempts=max_attempts, timeout=timeout,
                              now=self.now(), default_attempts=self.max_attempts)
        jid, rid, at = job.id, job.reservations[0], job.run_at if run_at is not None else None
        delay = validate_seconds("delay", delay)
        encode_admitted(job, max_bytes=self.max_job_bytes)
        with self._lock.hold():
            (stored,) = self._insert([job], given=job_id is not None, now=self.now(),
                                     delay=delay, run_at=at, reservation=rid)
        return Reservation(job_id=jid, reservation_id=rid, job=stored.job)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        with self._lock.hold():
            job, stale = self.locate(reservation.job_id)
            if job is None:
                raise JobNotFound(reservation.job_id)
            if job.state is not JobState.PREPARED:
                if job.state is JobState.CANCELED:
                    raise InvalidTransition(job.id, job.state.value, "commit")
                return job
            if reservation.reservation_id not in job.reservations:
                raise InvalidTransition(job.id, "prepared (reservation released)", "commit")
            new = machine.commit(job, now=self.now())
            self.commit_changes([(job, new)], self.stale_removals(job.id, stale))
            return new

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        with self._lock.hold():
            job, stale = self.locate(reservation.job_id)
            if job is None or job.state is not JobState.PREPARED:
                return None
            if reservation.reservation_id not in job.reservations:
                return None
            new = machine.abort(job, reservation.reservation_id, now=self.now())
            self.commit_changes([(job, new)], self.stale_removals(job.id, stale))
            return new if new.state is JobState.CANCELED else None

    # ------------------------------------------------------------ administration

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not finished (a leased one too: its holder is fenced out)."""
        new = self._admin_move(job_id, "cancel", machine.cancel)
        self._maybe_autoprune()
        return new

    def requeue(self, job_id: str) -> Job:
        """Run a dead-lettered or canceled job again from scratch (attempts reset)."""
        return self._admin_move(job_id, "requeue", machine.requeue)

    def _admin_move(self, job_id: str, action: str, decide: Callable[..., Job]) -> Job:
        """Move one job by id (an operator's action), clearing any crash leftover of it."""
        validate_job_id(job_id)
        with self._lock.hold():
            job, stale = self.locate(job_id)
            if job is None:
                raise JobNotFound(job_id)
            check_source(job_id, action, job.state)
            new = decide(job, now=self.now())
            self.commit_changes([(job, new)], self.stale_removals(job_id, stale))
            return new

    def requeue_all(self, state: JobState | str = JobState.DEAD_LETTER) -> list[Job]:
        """Requeue every job in `state` (dead letters by default) in one batch."""
        src = JobState(state)
        check_source("*", "requeue", src)
        with self._lock.hold():
            now = self.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for job_id in sorted(self._store.names(src.value)):
                job = self.read_job(src, job_id)
                if job is not None:
                    pairs.append((job, machine.requeue(job, now=now)))
            self.commit_changes(pairs)
        return [new for _, new in pairs if new is not None]

    def cancel_matching(self, *, kind: str | None = None,
                        states: Iterable[JobState | str] | str | None = None,
                        older_than: float | None = None) -> list[Job]:
        """Cancel every unfinished job of `kind`, in `states` (all cancelable ones by
        default), last changed more than `older_than` seconds ago; returns them."""
        from jobspool.queue.bulk import cancel_matching

        moved = cancel_matching(self, kind=kind, states=states, older_than=older_than)
        self._maybe_autoprune()
        return moved

    def requeue_matching(self, *, kind: str | None = None,
                         states: Iterable[JobState | str] | str | None = None,
                         older_than: float | None = None) -> list[Job]:
        """Requeue every job of `kind`, in `states` (dead letters by default; canceled on
        request), last changed more than `older_than` seconds ago; returns them."""
        from jobspool.queue.bulk import requeue_matching

        return requeue_matching(self, kind=kind, states=states, older_than=older_than)

    def get(self, job_id: str) -> Job:
        """The current snapshot of a job; `JobNotFound` if no state directory holds it."""
        validate_job_id(job_id)
        job, _ = self.locate(job_id)
        if job is None:
            # Lock-free probing can miss a job moving between two directories we probe
            # in the wrong order; the lock makes the second look exact.
            with self._lock.hold():
                job, _ = self.locate(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def jobs(self, state: JobState | str | None = None, kind: str | None = None) -> Iterator[Job]:
        """Jobs in id (creation) order per state directory; unreadable files are skipped.

        Each directory is listed once; a job that moves while the listing is
        read may be skipped or seen in both directories. A bad `state` or `kind`
        raises `InvalidJob` at the call, not at the first `next()`.
        """
        states = job_states(state)
        if kind is not None:
            validate_kind(kind)
        return self._iter_jobs(states, kind)

    def _iter_jobs(self, states: Sequence[JobState], kind: str | None) -> Iterator[Job]:
        for s in states:
            for job_id in sorted(self._store.names(s.value)):
                job = self.read_job(s, job_id)
                if job is not None and (kind is None or job.kind == kind):
                    yield job

    def stats(self, *, by_kind: bool = False) -> Stats:
        """Counts per state, the age of the oldest due job, the fence, quarantine size."""
        return collect_stats(self, by_kind=by_kind)

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job:
        """Block until the job reaches a terminal state; `WaitTimeout` after `timeout` seconds."""
        return wait_until_terminal(self.get, job_id, timeout, poll_seconds)

    # ------------------------------------------------------------ recovery (jobspool.recovery)

    def recover(self, replay: ReplayHook | dict[str, ReplayHook] | None = None) -> RecoveryReport:
        """Repair what a crash left, reclaim expired leases, replay prepared jobs, prune."""
        from jobspool.recovery.recover import recover

        with self._lock.hold():
            suspect = self._lock.suspect()
        report = recover(self, replay)
        with self._lock.hold():
            self._lock.clear_suspect(suspect)
        return report

    def prune(self, keep: int | None = None, older_than: float | None = None, *,
              keep_dead: int | None = None) -> PruneReport:
        """Remove terminal jobs beyond the newest `keep` of their state (`keep_dead` for dead
        letters, default `keep`) AND older than `older_than` seconds; either bound alone is
        the whole rule; neither: the spool's `keep_terminal` and `keep_terminal_seconds`."""
        from jobspool.recovery.prune import prune

        return prune(self, keep=keep, older_than=older_than, keep_dead=keep_dead)

    def health(self, **options: Any) -> Health:
        """An `ok` / `degraded` verdict with reasons (see `jobspool.health.check_health`)."""
        from jobspool.health import check_health

        return check_health(self, **options)

    def fsck(self) -> FsckReport:
        """Check every invariant of the spool without changing anything."""
        from jobspool.recovery.fsck import fsck

        return fsck(self)


def _init_signature() -> inspect.Signature:
    # `__new__` (which picks the store) takes *args/**kwargs; help() and
    # inspect.signature(Spool) should show the real options, those of __init__.
    sig = inspect.signature(Spool.__init__)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


Spool.__signature__ = _init_signature()  # type: ignore[attr-defined]


if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI

    def _is_a_store(spool: Spool) -> SpoolAPI:
        return spool  # mypy checks Spool keeps the whole surface of a store
