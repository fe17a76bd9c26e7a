"""`PgSpool`: the `Spool` API on a PostgreSQL database (`Spool("postgresql://...")`).

The file spool's public methods with the same meaning (DESIGN §3–§6), kept as one row
per job: tokens from a sequence, expiry by the database's clock, claims and settles one
statement per batch (`leasing.py`), wakeups by LISTEN/NOTIFY (`notify.py`). What a
worker keeps beside a spool per process (metrics, progress, the default projection)
lives in a local directory, `root`; schedule marks live in the database (`marks.py`).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from jobspool.errors import (
    JobNotFound,
    JobspoolError,
    LeaseLost,
    SpoolClosed,
    SpoolError,
)
from jobspool.pg import admin, beats, leasing, marks, produce, recovering, twophase
from jobspool.pg.clock import steady
from jobspool.pg.db import Database
from jobspool.pg.opening import (
    DEFAULTS,
    LocalLock,
    check_process_options,
    database_identity,
    default_local_dir,
    local_dirs_of,
    note_identity,
    open_database,
    private_local_dir,
    validated,
)
from jobspool.pg.rows import COLUMNS, to_job
from jobspool.pg.workerside import PgWorkerSide
from jobspool.queue import machine
from jobspool.queue.arguments import (
    check_exclude,
    check_fail_items,
    check_flag,
    check_lease,
    check_leases,
    each_whole,
    job_states,
    listed,
    naming_item,
    new_batch,
    new_reservation,
    wait_until_terminal,
    whole_lease,
)
from jobspool.queue.backlog import Waiting
from jobspool.queue.bulk import Match, match, requeue_source
from jobspool.queue.job import (
    EnqueueResult,
    Job,
    Lease,
    Reservation,
    validate_delay,
    validate_int,
    validate_job_id,
    validate_kind,
    validate_owner,
    validate_seconds,
)
from jobspool.queue.jobsize import encode_admitted
from jobspool.queue.layout import effective_keep_dead
from jobspool.queue.options import checked_clock, given_options
from jobspool.queue.perms import validate_access
from jobspool.queue.producing import EnqueueForms
from jobspool.queue.runs import Runs
from jobspool.queue.states import JobState, check_source

if TYPE_CHECKING:
    import psycopg

    from jobspool.health import Health
    from jobspool.pg.notify import NotifyWatcher
    from jobspool.queue.stats import Stats
    from jobspool.recovery.fsck import FsckReport
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport
    from jobspool.recovery.replay import ReplayHooks

log = logging.getLogger("jobspool.pg")
CLOSING_PRUNE_PATIENCE = 2.0  # seconds `close` waits out an outage for its last prune

T = TypeVar("T", Job, Lease)


def _one(out: T | JobspoolError) -> T:
    """A batch form's single result: the job or lease, or its refusal raised."""
    if isinstance(out, BaseException):
        raise out
    return out


class PgSpool(PgWorkerSide, EnqueueForms):
    """A durable job queue in a PostgreSQL database, shared by processes on many machines."""

    durable = True
    # A claim and a settle are each a round trip to the server, on their own connections:
    # a worker settles one group while it claims the next (queue/pipeline.py).
    overlap_settles = True
    # The Worker claims with `starts_noted=True` (see `claim`); a file spool needs no such
    # promise: its liveness files say which handlers a dead process had started.
    notes_starts = True
    # A claim may leave expired leases out (`take_over=False`, see `claim`).
    lazy_take_over = True
    access = "private"

    def __init__(self, root: str, *, create: bool = True, clock: Callable[[], float] | None = None,
                 read_only: bool = False, pool_size: int = 16, reconnect_seconds: float = 30.0,
                 local_dir: str | os.PathLike[str] | None = None, seed: int | None = None,
                 max_due: int | None = None, max_lag_seconds: float | None = None,
                 **options: Any) -> None:
        self.runs = Runs()  # the workers serving on it: `close` stops them first
        # File-spool options that mean nothing here are accepted (checked) and ignored, so
        # one configuration serves both stores.
        durable, sync_mode = options.pop("durable", True), options.pop("sync_mode", "auto")
        access = options.pop("access", None)
        check_flag("create", create)
        if access is not None:
            validate_access(access)
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"Spool() got unexpected keyword argument(s): {sorted(unknown)}")
        given = given_options(options)
        # Every option checked before the database is touched: a refused one must not be
        # stored as the schema's settings by the first open.
        validated({**DEFAULTS, **given})
        check_process_options(pool_size=pool_size, reconnect_seconds=reconnect_seconds,
                              max_due=max_due, max_lag_seconds=max_lag_seconds, clock=clock,
                              durable=durable, sync_mode=sync_mode, read_only=read_only)
        self.url, self.read_only = root, read_only
        self.clock = None if clock is None else checked_clock(clock)
        self.db = Database(root, pool_size=pool_size, reconnect_seconds=reconnect_seconds)
        self.display, self.max_due, self.max_lag_seconds = self.db.display, max_due, max_lag_seconds
        opened = open_database(self.db, create=create, read_only=read_only, given=given)
        self.created, self.channel = opened.created, opened.channel
        self.upgraded_from = opened.upgraded_from  # for `jobspool init` to say so
        if opened.upgraded_from is not None:
            # Any writing open migrates (as `init` does), but a producer or a worker doing
            # it said nothing, and processes of older releases started afterwards were
            # refused ("newer than this release's") with nothing saying which host did it.
            from jobspool.pg.schema import SCHEMA_VERSION

            log.warning("%s: jobspool schema upgraded from version %d to %d by this process "
                        "(pid %d); processes of older releases are refused from now on",
                        self.display, opened.upgraded_from, SCHEMA_VERSION, os.getpid())
        # This process's clock, corrected to the database's: the worker compares due
        # times the database hands out with it. Carried forward on the boot-time clock,
        # which a step of the host's wall clock (NTP, an operator's `date -s`) leaves alone:
        # an offset added to `time.time()` was measured once, and after a +2 h step the
        # worker fired schedules 2 h early and let leases run out before handlers started.
        self._anchor = time.time() + opened.clock_offset - steady()
        st = self.settings = opened.settings
        self.lease_seconds, self.max_attempts = st.lease_seconds, st.max_attempts
        self.retry_base_seconds, self.retry_max_seconds = (st.retry_base_seconds,
                                                           st.retry_max_seconds)
        self.keep_terminal, self.keep_terminal_seconds = st.keep_terminal, st.keep_terminal_seconds
        self.keep_dead = effective_keep_dead(st)
        self.max_rescues, self.max_job_bytes = st.max_rescues, st.max_job_bytes
        self.prepare_grace_seconds = st.prepare_grace_seconds
        self.policy = machine.RetryPolicy(st.retry_base_seconds, st.retry_max_seconds)
        self.rng, self.lock = random.Random(seed), LocalLock()
        self.root = Path(local_dir) if local_dir is not None else default_local_dir(self.display)
        self._default_local_dir = local_dir is None
        self._identity: str | None = None
        self._local_dir_error: SpoolError | None = None
        if not read_only and local_dir is None:
            try:
                private_local_dir(self.root)
            except SpoolError as exc:
                # Only workers write there (metrics, progress, the default projection): a
                # producer in a container with a read-only $HOME was refused an enqueue
                # that writes nothing locally. A worker is refused at its start instead.
                self._local_dir_error = exc
        self.next_sweep, self.sweep_enabled = 0.0, not read_only
        # A process's first terminal write prunes: a short-lived one (a `run-until-idle`
        # settling a few jobs per cron run) would otherwise never reach the interval.
        # One bounded DELETE per state, cheap; the file spool shares its count instead.
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self.unnoted_starts: set[int] = set()  # leases of rescued jobs whose start to record
        self._terminal_writes = max(64, st.keep_terminal // 4)

    # ------------------------------------------------------------ plumbing

    def ensure_local_dir(self) -> None:
        """Make this machine's directory for the spool, or raise why it cannot be made (a
        worker needs it; see `__init__`); it records which database it serves."""
        if self._local_dir_error is not None:
            private_local_dir(self.root)
            self._local_dir_error = None
        if self._default_local_dir and (identity := self.identity()):
            note_identity(self.root, identity)

    def identity(self) -> str:
        """Which database this is, whatever URL named it ("" when the server will not say)."""
        if self._identity is None:
            try:
                self._identity = self.db.run(database_identity, what="identifying the database")
            except JobspoolError as exc:  # asked again next time (best effort)
                log.debug("cannot identify the database: %s", exc)
                return ""
        return self._identity

    def sibling_local_dirs(self) -> list[Path]:
        """This machine's other directories for this database: those of processes that
        named it by another URL (another role, host spelling or option), where their
        worker snapshots are."""
        if not self._default_local_dir or not (identity := self.identity()):
            return []
        return local_dirs_of(self.root, identity)

    def __repr__(self) -> str:
        return f"Spool({self.display!r})"

    def __reduce__(self) -> Any:
        # As the file spool's: "cannot pickle '_thread.lock' object" said nothing of what
        # to do instead. The URL is shown without its password.
        raise TypeError(f"a Spool cannot be pickled (it holds connections and locks): pass "
                        f"its URL ({self.display!r}) to the other process and open a Spool "
                        "there")

    def __enter__(self) -> PgSpool:
        if self.db.closed:  # as the file spool: a closed spool said nothing here
            raise SpoolClosed(self.display)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers running on this spool (see `Spool.close`), prune what this
        opener finished since its last automatic prune, then disconnect."""
        self.runs.close_after(self._prune_then_disconnect)

    def _prune_then_disconnect(self) -> None:
        # The file spool counts terminal writes in its lock's shared memory, for every
        # process; here each opener counts its own (`note_terminal`), so openers that
        # finish fewer jobs than the interval (four threads completing 50 each, cron runs)
        # left up to an interval each beyond `keep_terminal`: 199 completed kept for 3.
        # Bounded by a short patience: a server gone at close must not hold it.
        since = self._terminal_writes
        if 0 < since < max(64, self.keep_terminal // 4) and not self.read_only:
            self._terminal_writes = 0
            try:
                with self.db.patience(time.monotonic() + CLOSING_PRUNE_PATIENCE):
                    admin.prune(self, count=False)
            except JobspoolError as exc:
                log.info("pruning at close skipped: %s", exc)
        self.db.close()

    def now(self) -> float:
        """Seconds since the epoch on the database's clock (or the clock given)."""
        return self.clock() if self.clock is not None else self._anchor + steady()

    def follow_clock(self, database_now: float) -> None:
        """Estimate the database's clock from `database_now`, read just now (a claim)."""
        self._anchor = database_now - steady()

    def now_param(self) -> float | None:
        """What statements get as `%(now)s`: None means the database's own clock."""
        return self.clock() if self.clock is not None else None

    def check_writable(self, action: str) -> None:
        if self.read_only:
            raise SpoolError(f"cannot {action}: spool {self.display} is open read-only "
                             "(open it with read_only=False, as a role that may write it)")

    def log_swept(self, swept: list[tuple[str, str]]) -> None:
        log.warning("reclaimed %d expired lease(s): %s", len(swept),
                    ", ".join(f"{i} -> {s}" for i, s in swept[:10]))

    def note_terminal(self, n: int) -> None:
        """Amortized retention, as the file spool does it: prune every so many terminal writes."""
        self._terminal_writes += n
        if self._terminal_writes < max(64, self.keep_terminal // 4):
            return
        self._terminal_writes = 0
        try:
            admin.prune(self, count=False)
        except SpoolError as exc:
            log.warning("automatic pruning failed (will retry later): %s", exc)

    def admit(self, n: int, conn: psycopg.Connection[Any] | None = None) -> None:
        """Writer backpressure (off unless `max_due`/`max_lag_seconds` are set): the same
        rule and hysteresis as the file spool's (`queue/backpressure.py`); measured on
        `conn`, the caller's connection, when it holds one."""
        produce.admit(self, n, conn)

    def landed(self, n: int, written: bool) -> None:
        """The `n` jobs `admit` let in were written (or not): see `backpressure.landed`."""
        produce.landed(self, n, written)

    # ------------------------------------------------------------ producing

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        """Add many jobs of one kind: one statement (generated ids) or one transaction."""
        self.check_writable("enqueue")
        batch = new_batch(kind, payloads, job_ids=job_ids, delay=delay, run_at=run_at,
                          priority=priority, max_attempts=max_attempts,
                          on_conflict=on_conflict, unique_states=unique_states,
                          timeout=timeout, now=self.now(), default_attempts=self.max_attempts)
        fresh = batch.fresh
        for i, job in enumerate(fresh):
            with naming_item(i, len(fresh)):
                encode_admitted(job, max_bytes=self.max_job_bytes)
        if not fresh:
            return []
        if not batch.given_ids:
            self.admit(len(fresh))
            written = False
            try:
                results = produce.insert_generated(self, fresh)
                written = True
            finally:
                self.landed(len(fresh), written)
            return results
        return produce.insert_given(self, fresh, on_conflict=batch.on_conflict,
                                    unique_states=batch.unique_states)

    # ------------------------------------------------------------ two-phase

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        self.check_writable("prepare")
        job = new_reservation(kind, payload, job_id=job_id, delay=delay, run_at=run_at,
                              priority=priority, max_attempts=max_attempts, timeout=timeout,
                              now=self.now(), default_attempts=self.max_attempts)
        encode_admitted(job, max_bytes=self.max_job_bytes)
        rid = job.reservations[0]
        (stored,) = produce.insert_given(self, [job], on_conflict="keep", unique_states=None,
                                         reservation=rid)
        return Reservation(job_id=job.id, reservation_id=rid, job=stored.job)

    def mutate_job(self, job_id: str, decide: Callable[[Job, float], Job | None], *,
                   missing: Callable[[], Any] | None = None, what: str = "update") -> Any:
        """Lock one job's row, let `decide` compute its next snapshot, write it."""
        self.check_writable(what)
        return produce.mutate(self, job_id, decide, missing=missing, what=what)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        return twophase.commit(self, reservation)

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        return twophase.abort(self, reservation)

    # ------------------------------------------------------------ administration

    def _admin_move(self, job_id: str, action: str, decide: Callable[..., Job]) -> Job:
        validate_job_id(job_id)

        def step(job: Job, now: float) -> Job:
            check_source(job_id, action, job.state)
            return decide(job, now=now)

        result: Job = self.mutate_job(job_id, step, what=action)
        return result

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not finished (a leased one too: its holder is fenced out)."""
        canceled = self._admin_move(job_id, "cancel", machine.cancel)
        self.note_terminal(1)
        return canceled

    def requeue(self, job_id: str) -> Job:
        """Run a dead-lettered or canceled job again from scratch (attempts reset)."""
        return self._admin_move(job_id, "requeue", machine.requeue)

    def requeue_all(self, state: JobState | str = JobState.DEAD_LETTER) -> list[Job]:
        return admin.apply_matching(self, "requeue", Match((requeue_source(state),)),
                                    machine.requeue)

    def cancel_matching(self, *, kind: str | None = None,
                        states: Iterable[JobState | str] | str | None = None,
                        older_than: float | None = None) -> list[Job]:
        """Cancel every unfinished job of `kind`, in `states`, older than `older_than` s."""
        which = match("cancel", kind=kind, states=states, older_than=older_than)
        moved = admin.apply_matching(self, "cancel", which, machine.cancel)
        self.note_terminal(len(moved))
        return moved

    def requeue_matching(self, *, kind: str | None = None,
                         states: Iterable[JobState | str] | str | None = None,
                         older_than: float | None = None,
                         changed_until: float | None = None) -> list[Job]:
        """Requeue every job of `kind` in `states` (dead letters by default)."""
        which = match("requeue", kind=kind, states=states, older_than=older_than,
                      changed_until=changed_until)
        return admin.apply_matching(self, "requeue", which, machine.requeue)

    def remove_terminal(self, jobs: Sequence[Job], state: JobState) -> list[str]:
        """Delete these jobs for good where they are still the versions given, in terminal
        `state` (a job requeued meanwhile, even one ended again, is left alone); returns
        the ids removed."""
        self.check_writable("remove jobs")
        return admin.remove_terminal(self, jobs, state)

    # ------------------------------------------------------------ reading

    def get(self, job_id: str) -> Job:
        """The current snapshot of a job; `JobNotFound` if there is none."""
        validate_job_id(job_id)
        row = self.db.run(lambda c: c.execute(f"SELECT {COLUMNS} FROM jobspool_jobs "
                                              "WHERE id = %s", (job_id,)).fetchone(), what="get")
        if row is None:
            raise JobNotFound(job_id)
        return to_job(row)

    def jobs(self, state: JobState | str | None = None, kind: str | None = None) -> Iterator[Job]:
        """Jobs in id (creation) order per state, states in the file spool's order. Read
        in pages per state, as the file spool reads a directory each: a job that changes
        state meanwhile may be skipped or seen in both states."""
        states = job_states(state)
        if kind is not None:
            validate_kind(kind)
        return admin.iter_jobs(self, states, kind)

    def state_ids(self, state: JobState) -> list[str]:
        """The ids of one state in id order (the dashboard's list pages)."""
        return admin.state_ids(self, state)

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job:
        """Block until the job reaches a terminal state; `WaitTimeout` after `timeout` seconds."""
        return wait_until_terminal(self.get, job_id, timeout, poll_seconds,
                                   bound=self.db.patience)

    # ------------------------------------------------------------ leasing

    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None,
              exclude: Collection[str] = (), starts_noted: bool = False,
              take_over: bool = True) -> list[Lease]:
        """Lease up to `limit` due jobs in order (one statement); see `Spool.claim`.
        `exclude` names jobs the caller already runs (never claimed again by it).
        `starts_noted`: the caller (a Worker) runs rescued jobs alone and calls
        `note_running(started=True)` before each handler, so an expired lease of one
        whose start was never noted is given back uncounted (sql.py). `take_over=False`:
        due jobs only, no read of every leased row (`queue/takeover.py`)."""
        self.check_writable("claim")
        limit = validate_int("limit", limit, minimum=1)
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        who = self._owner if owner is None else validate_owner(owner)
        if kinds is not None:
            # Listed once: a generator or map() checked here was spent, and the claim then
            # saw no kind at all and claimed nothing, for ever (the file spool takes them).
            kinds = [kinds] if isinstance(kinds, str) else listed("kinds", kinds, "job kinds")
            for k in kinds:
                validate_kind(k)
        return leasing.claim(self, kinds=kinds, limit=limit, owner=who, lease_seconds=seconds,
                             exclude=check_exclude(exclude), starts_noted=starts_noted,
                             take_over=bool(take_over))

    def _seconds(self, lease_seconds: float | None) -> float:
        return self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        check_lease(lease)
        return _one(self.heartbeat_many([lease], lease_seconds=lease_seconds)[0])

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]:
        check_leases(leases, pairs=False)
        given = None if lease_seconds is None else self._seconds(lease_seconds)
        return each_whole(leases, self.get,
                          lambda batch: beats.heartbeat_many(self, batch, given), pairs=False)

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]:
        check_leases(leases, pairs=False)
        margin = validate_seconds("margin", margin)
        given = None if lease_seconds is None else self._seconds(lease_seconds)
        return each_whole(leases, self.get, lambda batch: beats.check_leases(
            self, batch, margin, given), pairs=False)

    def complete(self, lease: Lease, result: Any = None) -> Job:
        check_lease(lease)
        return _one(self.complete_many([(lease, result)])[0])

    def complete_many(self, items: Sequence[tuple[Lease, Any]]) -> list[Job | JobspoolError]:
        check_leases(items, pairs=True)
        return each_whole(items, self.get, lambda batch: leasing.settle(
            self, [x for x, _ in batch], [("complete", r) for _, r in batch]), pairs=True)

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job:
        check_lease(lease)
        check_flag("retryable", retryable)
        if delay is not None:
            delay = validate_delay(delay)
        return _one(self.fail_many([(lease, error, retryable, delay)])[0])

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]:
        check_fail_items(items)
        return each_whole(items, self.get, lambda batch: leasing.settle(
            self, [x[0] for x in batch], [("fail", (e, r, d)) for _, e, r, d in batch]),
            pairs=True)

    def release(self, lease: Lease, *, delay: float = 0.0, reason: str | None = None) -> Job:
        """Give a leased job back without counting the attempt (fenced); `reason`, when
        given, is kept as its `last_error`."""
        check_lease(lease)
        delay = validate_delay(delay)
        return _one(leasing.settle(self, [whole_lease(lease, self.get)],
                                   [("release", (delay, reason))])[0])

    def fenced(self, lease: Lease) -> AbstractContextManager[Lease]:
        """Run a block while `lease` is current, holding its row lock (no sweep or cancel
        can move the job meanwhile); the lease is extended before the lock is released."""
        check_lease(lease)
        return beats.fenced(self, whole_lease(lease, self.get))

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None:
        return leasing.next_due_at(self, kinds)

    def waiting(self) -> dict[str, Waiting]:
        """Jobs waiting to be claimed (ready, retryable), per kind: due now or later."""
        return leasing.waiting(self)

    def schedule_marks(self, *, rules: bool = False) -> dict[str, int]:
        """The last fired tick of each schedule, shared by every machine (a table); with
        `rules`, the fingerprint of the rule that fired it too (as the file store)."""
        return marks.read(self, rules=rules)

    def hold_schedule_marks(self) -> AbstractContextManager[dict[str, int]]:
        return marks.held(self)

    def stop_retrying(self, stop: bool = True) -> None:
        """While shutting down, a statement the server cannot take fails at once (`True`)
        instead of being retried for `reconnect_seconds`; `False` retries again."""
        (self.db.stop_retrying.set if stop else self.db.stop_retrying.clear)()

    def arrival_watcher(self) -> NotifyWatcher:
        """Wakes an idle worker when a producer commits a job (LISTEN/NOTIFY, a hint)."""
        from jobspool.pg.notify import NotifyWatcher

        return NotifyWatcher(self.db, self.channel)

    # ------------------------------------------------------------ administration

    def stats(self, *, by_kind: bool = False) -> Stats:
        return admin.stats(self, by_kind=check_flag("by_kind", by_kind))

    def recover(self, replay: ReplayHooks | None = None) -> RecoveryReport:
        """Reclaim expired leases, replay prepared jobs past the grace period, prune."""
        from jobspool.recovery.replay import check_hooks

        check_hooks(replay)
        self.check_writable("recover")
        return recovering.recover(self, replay)

    def prune(self, keep: int | None = None, older_than: float | None = None, *,
              keep_dead: int | None = None) -> PruneReport:
        self.check_writable("prune")
        return admin.prune(self, keep=keep, older_than=older_than, keep_dead=keep_dead)

    def health(self, **options: Any) -> Health:
        return admin.health(self, **options)

    def fsck(self) -> FsckReport:
        return admin.fsck(self)


if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI

    def _is_a_store(spool: PgSpool) -> SpoolAPI:
        return spool  # mypy checks PgSpool keeps the whole surface of a store
