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
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

from jobspool.errors import InvalidJob, InvalidRoot, JobspoolError, LeaseLost, SpoolError
from jobspool.queue import bulk, machine
from jobspool.queue.arguments import (
    check_fail_items,
    check_flag,
    check_lease,
    check_leases,
    check_reservation,
    each_whole,
    job_states,
    wait_until_terminal,
    whole_lease,
)
from jobspool.queue.backlog import Waiting
from jobspool.queue.diskerrors import listing_failed, write_failed
from jobspool.queue.job import (
    MAX_JOB_BYTES,
    EnqueueResult,
    Job,
    Lease,
    Reservation,
    validate_job_id,
    validate_kind,
)
from jobspool.queue.journal import Journal
from jobspool.queue.layout import SPOOL_FILE, effective_keep_dead, open_layout
from jobspool.queue.leasing import Leasing
from jobspool.queue.marks import read_marks, write_marks
from jobspool.queue.options import (
    UNSET,
    UNSET_RESCUES,
    DefaultFloat,
    DefaultInt,
    ProcessOptions,
    check_given,
    given,
    resolve_settings,
)
from jobspool.queue.payload import validate_seconds
from jobspool.queue.perms import file_mode
from jobspool.queue.producer import Producer
from jobspool.queue.producing import EnqueueForms
from jobspool.queue.rootspec import refuse_unexpanded, refuse_url
from jobspool.queue.runs import Runs
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.stats import Stats, collect_stats
from jobspool.queue.wakeup import DirWatcher
from jobspool.queue.workerside import WorkerSide

if TYPE_CHECKING:
    from jobspool.health import Health
    from jobspool.recovery.fsck import FsckReport
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport, ReplayHook


# What a read-only spool refuses up front (the journal refuses the rest): every public
# operation that writes, before it stages a file or takes the lock.
_WRITERS = ("enqueue", "enqueue_many", "prepare", "commit", "abort", "claim", "heartbeat",
            "heartbeat_many", "check_leases", "complete", "complete_many", "fail", "fail_many",
            "release", "fenced", "cancel", "requeue", "requeue_all", "recover", "prune",
            "cancel_matching", "requeue_matching", "enqueue_result", "enqueue_many_results")


log = logging.getLogger(__name__)

class Spool(WorkerSide, EnqueueForms):
    """A durable job queue in one directory, shared safely by threads and processes.

    Given a `postgresql://` URL instead of a directory, `Spool(url, ...)` returns a
    `jobspool.pg.spool.PgSpool`: the same API on the PostgreSQL store (DESIGN §9).

    A facade that composes, rather than inherits, the layers below it: the
    `Journal` (the directory, its lock, store, index and fence; the commit
    path), `Leasing` (claims and lease holders) and `Producer` (enqueue and
    two-phase); administration (`bulk.py`, `recovery/`) works on the journal.
    """

    # A claim and a settle take the same lock and the same core: overlapping them in a
    # worker only adds switching (bench/worker_overhead: -10% on this store).
    overlap_settles = False

    def __new__(cls, root: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Spool:
        from jobspool.pg import is_url

        if not isinstance(root, str | os.PathLike):
            raise TypeError(f"Spool root must be a directory path or a postgresql:// URL, "
                            f"got {root!r:.80}")
        text = os.fspath(root)
        if isinstance(text, str) and (not text.strip() or text != text.strip()):
            # "" became Path("."), the working directory, and " " a spool named " " in it.
            from jobspool.urls import redact_url

            shown = redact_url(text)
            what = "is empty" if not text else ("is only whitespace" if not text.strip()
                                               else "has leading or trailing whitespace")
            raise InvalidRoot(f"spool root {shown!r} {what}: give a spool directory or a "
                             "postgresql:// URL", path=shown)
        if not is_url(root):
            refuse_url(text)
            if isinstance(root, str):
                refuse_unexpanded(root)
        if is_url(root):
            from jobspool.pg.spool import PgSpool

            # Not a subclass: __init__ is not run again on it. Same public API (duck-typed).
            return cast("Spool", PgSpool(str(root), *args, **kwargs))
        return super().__new__(cls)

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        lease_seconds: float = DefaultFloat(60.0),
        max_attempts: int = DefaultInt(5),
        retry_base_seconds: float = DefaultFloat(1.0),
        retry_max_seconds: float = DefaultFloat(300.0),
        keep_terminal: int = DefaultInt(1000),
        keep_terminal_seconds: float | None = UNSET,
        keep_dead: int | None = UNSET,
        durable: bool = True,
        clock: Callable[[], float] = time.time,
        max_job_bytes: int = DefaultInt(MAX_JOB_BYTES),
        max_rescues: int | None = UNSET_RESCUES,
        prepare_grace_seconds: float = DefaultFloat(300.0),
        max_due: int | None = None,
        max_lag_seconds: float | None = None,
        sync_mode: str = "auto",
        seed: int | None = None,
        read_only: bool = False,
        access: str | None = None,
    ) -> None:
        """Open (with `create`, make) the spool at `root`. Options saved in `spool.json`
        when it is created (`SpoolSettings`) default every later opener; the rest
        (`ProcessOptions`) are this process's alone (see `options.py`)."""
        self.runs = Runs()  # the workers serving on it: `close` stops them first
        self._prune_due: dict[JobState, float] = {}  # `prune_if_over`'s: its next worth
        persisted = {"lease_seconds": lease_seconds, "max_attempts": max_attempts,
                     "retry_base_seconds": retry_base_seconds,
                     "retry_max_seconds": retry_max_seconds, "keep_terminal": keep_terminal,
                     "keep_terminal_seconds": keep_terminal_seconds, "keep_dead": keep_dead,
                     "max_job_bytes": max_job_bytes, "max_rescues": max_rescues,
                     "prepare_grace_seconds": prepare_grace_seconds}
        check_given(persisted)
        check_flag("create", create)  # (durable and read_only: `ProcessOptions`)
        options = ProcessOptions(durable=durable, clock=clock, sync_mode=sync_mode, seed=seed,
                                 read_only=read_only, max_due=max_due,
                                 max_lag_seconds=max_lag_seconds)
        layout = open_layout(Path(root), create=create, durable=durable, read_only=read_only,
                             access=access)
        try:
            try:
                settings = resolve_settings(persisted, layout.settings, layout.access)
            except InvalidJob as exc:
                if exc.field is not None and given(persisted.get(exc.field, UNSET)):
                    raise  # the caller's own option
                # A hand-edited spool.json: name the file, not an option nobody passed.
                raise SpoolError(f"{layout.root / SPOOL_FILE}: {exc}; fix the setting in "
                                 "that file", path=str(layout.root / SPOOL_FILE)) from None
            self.journal = Journal(layout, settings, options)  # writes spool.json, fence
        finally:
            layout.end_creation()
        self.leasing = Leasing(self.journal)
        self.producer = Producer(self.journal)
        self.journal.autoprune = self._autoprune
        if not read_only:
            self.journal.store.on_occupied = self._occupied
        j = self.journal
        # Shared with the journal (the same objects), read by the layers above the facade.
        self.root, self.settings, self.options = j.root, settings, options
        self.lock, self.store, self.fence = j.lock, j.store, j.fence
        self.clock, self.policy, self.rng = j.clock, j.policy, j.rng
        self.read_only, self.access = read_only, settings.access
        self.lease_seconds, self.max_attempts = settings.lease_seconds, settings.max_attempts
        self.retry_base_seconds = settings.retry_base_seconds
        self.retry_max_seconds = settings.retry_max_seconds
        self.keep_terminal = settings.keep_terminal
        self.keep_terminal_seconds = settings.keep_terminal_seconds
        self.keep_dead = effective_keep_dead(settings)
        self.max_rescues, self.max_job_bytes = settings.max_rescues, settings.max_job_bytes
        self.prepare_grace_seconds = settings.prepare_grace_seconds
        self.max_due, self.max_lag_seconds = max_due, max_lag_seconds
        if read_only:
            for name in _WRITERS:
                setattr(self, name, self._refuser(name))

    def _refuser(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            self.check_writable(name.replace("_", " "))

        refuse.__name__ = name
        return refuse

    # ------------------------------------------------------------ the journal

    @property
    def durable(self) -> bool:
        return self.journal.durable

    @property
    def admission_bytes(self) -> int:
        """The largest serialized size a new job may have (see `job.admission_limit`)."""
        return self.journal.admission_bytes

    def check_writable(self, action: str) -> None:
        """Raise `SpoolError` naming the cause when this spool was opened `read_only`."""
        self.journal.check_writable(action)

    def now(self) -> float:
        """The spool's clock (the wall clock unless `clock=` injected another)."""
        return self.journal.now()

    def fence_value(self) -> int:
        """The last token handed out (a reader without write access gets the ceiling on
        disk, which is at or above it)."""
        return self.journal.fence_value()

    def keep_tokens_above(self, token: int) -> bool:
        """Hand out no token at or below `token` from now on (see `Journal`); whether the
        fence moved."""
        return self.journal.keep_tokens_above(token)

    def close(self) -> None:
        """Stop the workers running on this spool (as `Worker.stop()`: handlers finish within
        their grace, jobs not begun go back), then release its files and locks.

        Called from inside a run (a handler, a worker's callback), it cannot wait for that
        run: it asks the runs to stop and returns, and the last to end closes the spool."""
        self.runs.close_after(self.journal.close)

    def __enter__(self) -> Self:
        self.lock.check_open()  # a closed spool said nothing here, then failed inside
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Spool({str(self.root)!r})"

    def __reduce__(self) -> Any:
        # multiprocessing's spawn pickles what it is handed: "cannot pickle 'mmap.mmap'"
        # said nothing of what to do instead.
        raise TypeError(f"a Spool cannot be pickled (it holds open files and locks): pass "
                        f"its root ({str(self.root)!r}) to the other process and open a "
                        "Spool there")

    def _occupied(self, directory: str, name: str) -> None:
        """A file is where a job is about to be renamed (under the lock): unreadable, it
        goes to quarantine/ first. Renamed over, a damaged or hand-edited file that
        `claim`, `stats` and `jobs` had skipped, saying `recover` would quarantine it,
        was destroyed without a word. A readable one is an older copy of the same job
        (a power loss kept it): the newer revision replaces it, as recovery would."""
        from jobspool.recovery.quarantine import quarantine
        from jobspool.recovery.scan import Bad

        try:
            JobState(directory)
        except ValueError:
            return  # not a state directory
        try:
            # A suspect: `quarantine` reads it (under the lock) and moves it only if bad.
            quarantine(self.journal, [Bad(directory, name, "in the way of a move")])
        except OSError as exc:
            log.warning("could not quarantine %s/%s before writing over it (%s)",
                        directory, name, exc.strerror or exc)

    def _autoprune(self) -> None:
        from jobspool.recovery.prune import prune_if_over

        prune_if_over(self.journal, self._prune_due)

    def schedule_marks(self, *, rules: bool = False) -> dict[str, int]:
        """The last fired tick of each schedule (`<root>/schedules.json`); with `rules`,
        the fingerprint of the rule that fired it too, under its name plus `RULE_MARK`."""
        return read_marks(self.root, rules=rules)

    @contextmanager
    def hold_schedule_marks(self) -> Iterator[dict[str, int]]:
        """The marks under the spool lock; what the block leaves in the dict is saved."""
        with self.lock.hold():
            marks = read_marks(self.root, rules=True)
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

    # ------------------------------------------------------------ consuming (leasing.py)

    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None,
              exclude: Collection[str] = ()) -> list[Lease]:
        """Lease up to `limit` due jobs in (priority, run_at, id) order (`Leasing.claim`)."""
        return self.leasing.claim(kinds=kinds, limit=limit, owner=owner,
                                  lease_seconds=lease_seconds, exclude=exclude)

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """Extend a lease; `LeaseLost` (and no change) unless it is current and unexpired."""
        check_lease(lease)
        return self.leasing.heartbeat(whole_lease(lease, self.get), lease_seconds=lease_seconds)

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]:
        """Extend many leases under one lock hold and one shared flush (the worker's beat)."""
        check_leases(leases, pairs=False)
        return each_whole(leases, self.get, lambda batch: self.leasing.heartbeat_many(
            batch, lease_seconds=lease_seconds), pairs=False)

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]:
        """Which leases are still current, extending those with less than `margin` left."""
        check_leases(leases, pairs=False)
        margin = validate_seconds("margin", margin)
        return each_whole(leases, self.get, lambda batch: self.leasing.check_leases(
            batch, margin=margin, lease_seconds=lease_seconds), pairs=False)

    def complete(self, lease: Lease, result: Any = None) -> Job:
        """Mark a leased job completed (fenced: `LeaseLost` if the lease is not current)."""
        check_lease(lease)
        return self.leasing.complete(whole_lease(lease, self.get), result)

    def complete_many(self, items: Sequence[tuple[Lease, Any]]) -> list[Job | JobspoolError]:
        """Complete many leases in one batch; per item the job or the error refusing it."""
        check_leases(items, pairs=True)
        return each_whole(items, self.get, self.leasing.complete_many, pairs=True)

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job:
        """Record a failed attempt: `retryable` with backoff, or `dead_letter` (fenced)."""
        check_lease(lease)
        check_flag("retryable", retryable)
        return self.leasing.fail(whole_lease(lease, self.get), error, retryable=retryable,
                                 delay=delay)

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]:
        """Fail many leases in one batch (see `complete_many`)."""
        check_fail_items(items)
        return each_whole(items, self.get, self.leasing.fail_many, pairs=True)

    def release(self, lease: Lease, *, delay: float = 0.0, reason: str | None = None) -> Job:
        """Give a leased job back without counting the attempt (fenced); `reason`, when
        given, is kept as its `last_error` (why it waits)."""
        check_lease(lease)
        return self.leasing.release(whole_lease(lease, self.get), delay=delay, reason=reason)

    def fenced(self, lease: Lease) -> AbstractContextManager[Lease]:
        """Run a block under the spool lock, only while `lease` is current (`Leasing.fenced`)."""
        check_lease(lease)
        return self.leasing.fenced(whole_lease(lease, self.get))

    def preload(self) -> None:
        """Read the claimable backlog into this process's claim index now (`Leasing.preload`)."""
        self.leasing.preload()

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None:
        """When the next not-yet-due job (retryable, or an expiring lease) becomes claimable."""
        return self.leasing.next_due_at(kinds)

    def waiting(self) -> dict[str, Waiting]:
        """Jobs waiting to be claimed (ready, retryable), per kind: due now or later."""
        return self.leasing.waiting()

    # ------------------------------------------------------------ producing (producer.py)

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        """`enqueue_many`, returning an `EnqueueResult` per payload."""
        return self.producer.enqueue_many_results(
            kind, payloads, job_ids=job_ids, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, on_conflict=on_conflict, unique_states=unique_states,
            timeout=timeout)

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        return self.producer.prepare(kind, payload, job_id=job_id, delay=delay, run_at=run_at,
                                     priority=priority, max_attempts=max_attempts,
                                     timeout=timeout)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        check_reservation(reservation)
        return self.producer.commit(reservation)

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        check_reservation(reservation)
        canceled = self.producer.abort(reservation)
        if canceled is not None:  # a terminal write: producers that mostly abort prune too
            self.journal.maybe_autoprune()
        return canceled

    # ------------------------------------------------------------ administration (bulk.py)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not finished (a leased one too: its holder is fenced out)."""
        new = bulk.move_one(self.journal, job_id, "cancel", machine.cancel)
        self.journal.maybe_autoprune()
        return new

    def requeue(self, job_id: str) -> Job:
        """Run a dead-lettered or canceled job again from scratch (attempts reset)."""
        return bulk.move_one(self.journal, job_id, "requeue", machine.requeue)

    def requeue_all(self, state: JobState | str = JobState.DEAD_LETTER) -> list[Job]:
        """Requeue every job in `state` (dead letters by default), committed in chunks."""
        # Bulk moves take the lock only for what matched: a closed spool with nothing
        # to move answered [] (or, from cancel's autoprune, "mmap closed or invalid").
        self.lock.check_open()
        return bulk.requeue_all(self.journal, state)

    def cancel_matching(self, *, kind: str | None = None,
                        states: Iterable[JobState | str] | str | None = None,
                        older_than: float | None = None) -> list[Job]:
        """Cancel every unfinished job of `kind`, in `states` (all cancelable ones by
        default), last changed more than `older_than` seconds ago; returns them."""
        self.lock.check_open()
        moved = bulk.cancel_matching(self.journal, kind=kind, states=states,
                                     older_than=older_than)
        self.journal.maybe_autoprune()
        return moved

    def requeue_matching(self, *, kind: str | None = None,
                         states: Iterable[JobState | str] | str | None = None,
                         older_than: float | None = None,
                         changed_until: float | None = None) -> list[Job]:
        """Requeue every job of `kind`, in `states` (dead letters by default; canceled on
        request), last changed more than `older_than` seconds ago and not after the epoch
        time `changed_until` (what a confirmed listing showed); returns them."""
        self.lock.check_open()
        return bulk.requeue_matching(self.journal, kind=kind, states=states,
                                     older_than=older_than, changed_until=changed_until)

    def get(self, job_id: str) -> Job:
        """The current snapshot of a job; `JobNotFound` if no state directory holds it."""
        validate_job_id(job_id)
        self.lock.check_open()
        job, _ = self.journal.locate(job_id)
        if job is not None:
            return job
        # Lock-free probing can miss a job moving between two directories we probe in the
        # wrong order, or one published since; under the lock the second look is exact.
        # (A file that is there but unreadable is not read again: it only said so twice.)
        with self.lock.hold():
            if self.journal.unreadable_file(job_id) is None:
                raise self.journal.not_found(job_id)
            if self.journal.readable_now(job_id):
                job, _ = self.journal.locate(job_id)
            if job is None:
                # Decided under the lock: an enqueue publishing the id meanwhile made this
                # "its file cannot be read; run recover" for a file that read fine.
                raise self.journal.missing(job_id)
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
        self.lock.check_open()
        return self._iter_jobs(states, kind)

    def _iter_jobs(self, states: Sequence[JobState], kind: str | None) -> Iterator[Job]:
        # Every directory is listed, even for one state: a stale copy left by a crash is
        # told from the job's current one only by the other directories.
        names = self.journal.without_stale({s: self.store.names(s.value) for s in ALL_STATES})
        for s in states:
            for job_id in sorted(names[s]):
                job = self.journal.read_job(s, job_id)
                if job is not None and (kind is None or job.kind == kind):
                    yield job

    def stats(self, *, by_kind: bool = False) -> Stats:
        """Counts per state, the age of the oldest due job, the fence, quarantine size."""
        return collect_stats(self.journal, by_kind=check_flag("by_kind", by_kind))

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job:
        """Block until the job reaches a terminal state; `WaitTimeout` after `timeout` seconds."""
        return wait_until_terminal(self.get, job_id, timeout, poll_seconds)

    # ------------------------------------------------------------ recovery (jobspool.recovery)

    def recover(self, replay: ReplayHook | Mapping[str, ReplayHook] | None = None) -> RecoveryReport:
        """Repair what a crash left, reclaim expired leases, replay prepared jobs, prune."""
        from jobspool.recovery.recover import recover
        from jobspool.recovery.replay import check_hooks

        check_hooks(replay)
        with self.lock.hold():
            suspect = self.lock.suspect()
        try:
            report = recover(self.journal, replay)
        except OSError as exc:  # the library's callers catch JobspoolError, as the CLI does
            raise write_failed(exc, self.root) from None
        with self.lock.hold():
            self.lock.clear_suspect(suspect)
        return report

    def prune(self, keep: int | None = None, older_than: float | None = None, *,
              keep_dead: int | None = None) -> PruneReport:
        """Remove terminal jobs beyond the newest `keep` of their state (dead letters: beyond
        `keep_dead`, by default the spool's own `keep_dead`, not `keep`) AND older than
        `older_than` seconds; either bound alone is the whole rule; neither: the spool's
        `keep_terminal` and `keep_terminal_seconds`."""
        from jobspool.recovery.prune import prune

        self.lock.check_open()
        try:
            return prune(self.journal, keep=keep, older_than=older_than, keep_dead=keep_dead)
        except OSError as exc:  # listings raise their own error; this is a write's
            raise write_failed(exc, self.root) from None

    def health(self, **options: Any) -> Health:
        """An `ok` / `degraded` verdict with reasons (see `jobspool.health.check_health`)."""
        from jobspool.health import check_health

        return check_health(self, **options)

    def fsck(self) -> FsckReport:
        """Check every invariant of the spool without changing anything."""
        from jobspool.recovery.fsck import fsck

        self.lock.check_open()
        try:
            return fsck(self.journal)
        except OSError as exc:  # it only reads
            raise listing_failed(exc, self.root) from None


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
