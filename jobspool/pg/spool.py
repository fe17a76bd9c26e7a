"""`PgSpool`: the `Spool` API on a PostgreSQL database (`Spool("postgresql://...")`).

Every public method of the file spool is here with the same signature and
the same meaning (DESIGN §3–§6); what differs is how it is kept: one row per
job, fencing tokens from a sequence, lease expiry by the database's clock,
claims and settles one statement per batch (`leasing.py`), wakeups by
LISTEN/NOTIFY (`notify.py`). Things that only exist on a local disk (the lock
file, quarantine, temp files) have no counterpart; per-process artifacts the
worker keeps beside a spool (metrics snapshots, progress, schedule marks, the
default projection) live in a local directory, `root` (see `local_dir`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobspool.errors import (
    InvalidTransition,
    JobNotFound,
    JobspoolError,
    LeaseLost,
    SpoolError,
    WaitTimeout,
)
from jobspool.pg import leasing, produce
from jobspool.pg.db import Database
from jobspool.pg.rows import COLUMNS, to_job
from jobspool.pg.schema import check, load_settings, migrate
from jobspool.queue import machine
from jobspool.queue.arguments import (
    check_on_conflict,
    check_run_at,
    check_timeout,
    check_unique_states,
    job_states,
    validate_wait,
)
from jobspool.queue.bulk import Match, match
from jobspool.queue.job import (
    MAX_JOB_BYTES,
    EnqueueResult,
    Job,
    Lease,
    Reservation,
    check_json,
    encode_admitted,
    new_job_id,
    new_token_id,
    validate_int,
    validate_job_id,
    validate_kind,
    validate_owner,
    validate_seconds,
)
from jobspool.queue.layout import SpoolSettings
from jobspool.queue.states import JobState, check_source

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.notify import NotifyWatcher

log = logging.getLogger("jobspool.pg")

_DEFAULTS: dict[str, Any] = {
    "lease_seconds": 60.0, "max_attempts": 5, "retry_base_seconds": 1.0,
    "retry_max_seconds": 300.0, "keep_terminal": 1000, "keep_terminal_seconds": None,
    "max_rescues": 10, "prepare_grace_seconds": 300.0, "max_job_bytes": MAX_JOB_BYTES,
}


def default_local_dir(display: str) -> Path:
    """Where per-process artifacts of a database spool live on this machine."""
    base = os.environ.get("JOBSPOOL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "jobspool")
    return Path(base) / hashlib.sha256(display.encode()).hexdigest()[:16]


def _page(conn: psycopg.Connection[Any], params: tuple[Any, ...]) -> list[Any]:
    return conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE state = %s AND id > %s "
                        "AND (%s::text IS NULL OR kind = %s) ORDER BY id LIMIT 500",
                        params).fetchall()


class _LocalLock:
    """A process-local stand-in for the file spool's lock (schedule marks use it)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            yield


class PgSpool:
    """A durable job queue in a PostgreSQL database, shared by processes on many machines."""

    durable = True
    access = "private"

    def __init__(self, root: str, *, create: bool = True, clock: Callable[[], float] | None = None,
                 read_only: bool = False, pool_size: int = 16, reconnect_seconds: float = 30.0,
                 local_dir: str | os.PathLike[str] | None = None, seed: int | None = None,
                 max_due: int | None = None, max_lag_seconds: float | None = None,
                 **options: Any) -> None:
        # File-spool options that mean nothing here are accepted and ignored, so one
        # configuration serves both stores.
        for name in ("durable", "sync_mode", "access"):
            options.pop(name, None)
        unknown = set(options) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"Spool() got unexpected keyword argument(s): {sorted(unknown)}")
        self.url = root
        self.read_only = read_only
        self.db = Database(root, pool_size=pool_size, reconnect_seconds=reconnect_seconds)
        self.display = self.db.display
        self.max_due, self.max_lag_seconds = max_due, max_lag_seconds
        given = {k: v for k, v in options.items() if v is not None or k == "keep_terminal_seconds"}
        conn = self.db.connect()
        try:
            self.created = self._open_schema(conn, create, {**_DEFAULTS, **given})
            stored = load_settings(conn)
            schema = conn.execute("SELECT current_schema()").fetchone()
            self.channel = f"jobspool_{(schema[0] if schema else 'public')}"[:63]
            t0 = time.time()
            row = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
            t1 = time.time()
        except Exception as exc:
            import psycopg as _pg

            if isinstance(exc, _pg.Error):
                raise SpoolError(f"database {self.display}: {str(exc).strip().splitlines()[0]}"
                                 ) from None
            raise
        finally:
            conn.close()
        # This process's clock, corrected to the database's: the worker compares due
        # times the database hands out with it.
        self._offset = (float(row[0]) - (t0 + t1) / 2) if row else 0.0
        self._settle_settings({**_DEFAULTS, **stored, **given})
        self.clock = clock
        self.rng = random.Random(seed)
        self.root = Path(local_dir) if local_dir is not None else default_local_dir(self.display)
        self.lock = _LocalLock()
        self.next_sweep = 0.0
        self.sweep_enabled = not read_only
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._terminal_writes = 0

    def _open_schema(self, conn: psycopg.Connection[Any], create: bool,
                     settings: dict[str, Any]) -> bool:
        version = check(conn, self.display)
        if version is None and not create:
            raise SpoolError(f"{self.display} holds no jobspool schema; run `jobspool init "
                             f"--root {self.display}` (or pass --create) first")
        if self.read_only:
            return False
        return migrate(conn, self.display, settings)

    def _settle_settings(self, s: dict[str, Any]) -> None:
        self.lease_seconds = validate_seconds("lease_seconds", s["lease_seconds"], positive=True)
        self.max_attempts = validate_int("max_attempts", s["max_attempts"], minimum=1)
        self.retry_base_seconds = validate_seconds("retry_base_seconds", s["retry_base_seconds"])
        self.retry_max_seconds = validate_seconds("retry_max_seconds", s["retry_max_seconds"])
        self.keep_terminal = validate_int("keep_terminal", s["keep_terminal"], minimum=0)
        kts = s["keep_terminal_seconds"]
        self.keep_terminal_seconds = (None if kts is None
                                      else validate_seconds("keep_terminal_seconds", kts))
        r = s["max_rescues"]
        self.max_rescues = None if r is None else validate_int("max_rescues", r, minimum=1)
        self.prepare_grace_seconds = validate_seconds("prepare_grace_seconds",
                                                      s["prepare_grace_seconds"])
        self.max_job_bytes = validate_int("max_job_bytes", s["max_job_bytes"], minimum=1024)
        self.policy = machine.RetryPolicy(self.retry_base_seconds, self.retry_max_seconds)
        self.settings = SpoolSettings(
            lease_seconds=self.lease_seconds, max_attempts=self.max_attempts,
            retry_base_seconds=self.retry_base_seconds, retry_max_seconds=self.retry_max_seconds,
            keep_terminal=self.keep_terminal, max_rescues=self.max_rescues,
            prepare_grace_seconds=self.prepare_grace_seconds,
            keep_terminal_seconds=self.keep_terminal_seconds, max_job_bytes=self.max_job_bytes)

    # ------------------------------------------------------------ plumbing

    def __repr__(self) -> str:
        return f"Spool({self.display!r})"

    def __enter__(self) -> PgSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def now(self) -> float:
        """Seconds since the epoch on the database's clock (or the clock given)."""
        return self.clock() if self.clock is not None else time.time() + self._offset

    def now_param(self) -> float | None:
        """What statements get as `%(now)s`: None means the database's own clock."""
        return self.clock() if self.clock is not None else None

    def _check_writable(self, action: str) -> None:
        if self.read_only:
            raise SpoolError(f"cannot {action}: spool {self.display} is open read-only")

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
            from jobspool.pg.admin import prune

            prune(self, count=False)
        except SpoolError as exc:
            log.warning("automatic pruning failed (will retry later): %s", exc)

    def admit(self, n: int) -> None:
        """Writer backpressure (off unless `max_due`/`max_lag_seconds` are set): the same
        rule and hysteresis as the file spool's (`queue/backpressure.py`), measured here as
        a count of ready rows and the oldest one's `run_at`."""
        if n == 0 or (self.max_due is None and self.max_lag_seconds is None):
            return
        from jobspool.queue.backpressure import Backlog, admit

        def measure() -> Backlog:
            row = self.db.run(lambda c: c.execute(
                "SELECT count(*), min(run_at) FROM jobspool_jobs WHERE state = 'ready'"
            ).fetchone(), what="measuring the backlog")
            due, oldest = (int(row[0]), row[1]) if row else (0, None)
            return Backlog(due=due, oldest_run_at=oldest, measured_at=self.now())

        admit(self, n, measure)

    def _ids_for(self, n: int, job_ids: Sequence[str | None] | None) -> list[str]:
        if job_ids is None:
            return [new_job_id() for _ in range(n)]
        if len(job_ids) != n:
            from jobspool.errors import InvalidJob

            raise InvalidJob(f"job_ids has {len(job_ids)} items for {n} payloads",
                             field="job_ids")
        return [new_job_id() if i is None else validate_job_id(i) for i in job_ids]

    # ------------------------------------------------------------ producing

    def enqueue(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, on_conflict: str = "keep",
                unique_states: Iterable[JobState | str] | None = None,
                timeout: float | None = None) -> Job:
        """Add a job (see the file spool's `Spool.enqueue`: same rules)."""
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
        return [r.job for r in self.enqueue_many_results(
            kind, payloads, job_ids=job_ids, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, on_conflict=on_conflict, unique_states=unique_states,
            timeout=timeout)]

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        """Add many jobs of one kind: one statement (generated ids) or one transaction."""
        self._check_writable("enqueue")
        validate_kind(kind)
        payload_list = list(payloads)
        ids = self._ids_for(len(payload_list), job_ids)
        for p in payload_list:
            check_json(p, "payload")
        policy = check_on_conflict(on_conflict)
        unique = check_unique_states(unique_states)
        delay = validate_seconds("delay", delay)
        validate_int("priority", priority)
        attempts = self.max_attempts if max_attempts is None else validate_int(
            "max_attempts", max_attempts, minimum=1)
        limit = check_timeout(timeout)
        now = self.now()
        at = check_run_at(run_at, delay, now)
        fresh = [machine.new_job(job_id=i, kind=kind, payload=p, now=now, delay=delay,
                                 run_at=at, priority=priority, max_attempts=attempts,
                                 timeout=limit)
                 for i, p in zip(ids, payload_list, strict=True)]
        for job in fresh:
            encode_admitted(job, max_bytes=self.max_job_bytes)
        if not fresh:
            return []
        if job_ids is None or all(i is None for i in job_ids):
            self.admit(len(fresh))
            inserted = produce.insert_fresh(self, fresh)
            missing = [j for j in fresh if j.id not in inserted]
            if not missing:
                return [EnqueueResult(j, "created") for j in fresh]
            # A reply lost to a dropped connection, the insert sent again: ours already.
            return [EnqueueResult(j, "created") if j.id in inserted
                    else EnqueueResult(self.get(j.id), "existing") for j in fresh]
        return produce.insert_given(self, fresh, on_conflict=policy, unique_states=unique)

    # ------------------------------------------------------------ two-phase

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        self._check_writable("prepare")
        validate_kind(kind)
        jid = new_job_id() if job_id is None else validate_job_id(job_id)
        delay = validate_seconds("delay", delay)
        validate_int("priority", priority)
        attempts = self.max_attempts if max_attempts is None else validate_int(
            "max_attempts", max_attempts, minimum=1)
        check_json(payload, "payload")
        rid = new_token_id()
        now = self.now()
        at = check_run_at(run_at, delay, now)
        job = machine.new_job(job_id=jid, kind=kind, payload=payload, now=now, delay=delay,
                              run_at=at, priority=priority, max_attempts=attempts,
                              state=JobState.PREPARED, reservations=(rid,),
                              timeout=check_timeout(timeout))
        encode_admitted(job, max_bytes=self.max_job_bytes)
        (stored,) = produce.insert_given(self, [job], on_conflict="keep", unique_states=None,
                                         reservation=rid)
        return Reservation(job_id=jid, reservation_id=rid, job=stored.job)

    def _mutate(self, job_id: str, decide: Callable[[Job, float], Job | None], *,
                missing: Callable[[], Any] | None = None, what: str = "update") -> Any:
        """Lock one job's row, let `decide` compute its next snapshot, write it."""
        def go(conn: psycopg.Connection[Any]) -> Any:
            with conn.transaction():
                row = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = %s "
                                   "FOR UPDATE", (job_id,)).fetchone()
                if row is None:
                    if missing is not None:
                        return missing()
                    raise JobNotFound(job_id)
                job = to_job(row)
                new = decide(job, self.now())
                if new is not None and new is not job:
                    produce.write(conn, job, new)
                    if new.state in (JobState.READY, JobState.RETRYABLE):
                        conn.execute("SELECT pg_notify(%s, '')", (self.channel,))
                return new

        self._check_writable(what)
        return self.db.run(go, what=what)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        def decide(job: Job, now: float) -> Job:
            if job.state is not JobState.PREPARED:
                if job.state is JobState.CANCELED:
                    raise InvalidTransition(job.id, job.state.value, "commit")
                return job
            if reservation.reservation_id not in job.reservations:
                raise InvalidTransition(job.id, "prepared (reservation released)", "commit")
            return machine.commit(job, now=now)

        result: Job = self._mutate(reservation.job_id, decide, what="commit")
        return result

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        changed: list[Job] = []

        def decide(job: Job, now: float) -> Job:
            if job.state is not JobState.PREPARED or \
                    reservation.reservation_id not in job.reservations:
                return job
            new = machine.abort(job, reservation.reservation_id, now=now)
            changed.append(new)
            return new

        self._mutate(reservation.job_id, decide, missing=lambda: None, what="abort")
        return changed[-1] if changed and changed[-1].state is JobState.CANCELED else None

    # ------------------------------------------------------------ administration

    def _admin_move(self, job_id: str, action: str, decide: Callable[..., Job]) -> Job:
        validate_job_id(job_id)

        def step(job: Job, now: float) -> Job:
            check_source(job_id, action, job.state)
            return decide(job, now=now)

        result: Job = self._mutate(job_id, step, what=action)
        return result

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not finished (a leased one too: its holder is fenced out)."""
        return self._admin_move(job_id, "cancel", machine.cancel)

    def requeue(self, job_id: str) -> Job:
        """Run a dead-lettered or canceled job again from scratch (attempts reset)."""
        return self._admin_move(job_id, "requeue", machine.requeue)

    def requeue_all(self, state: JobState | str = JobState.DEAD_LETTER) -> list[Job]:
        src = JobState(state)
        check_source("*", "requeue", src)
        return self._apply_matching("requeue", Match((src,)), machine.requeue)

    def cancel_matching(self, *, kind: str | None = None,
                        states: Iterable[JobState | str] | str | None = None,
                        older_than: float | None = None) -> list[Job]:
        """Cancel every unfinished job of `kind`, in `states`, older than `older_than` s."""
        which = match("cancel", kind=kind, states=states, older_than=older_than)
        return self._apply_matching("cancel", which, machine.cancel)

    def requeue_matching(self, *, kind: str | None = None,
                         states: Iterable[JobState | str] | str | None = None,
                         older_than: float | None = None) -> list[Job]:
        """Requeue every job of `kind` in `states` (dead letters by default)."""
        which = match("requeue", kind=kind, states=states, older_than=older_than)
        return self._apply_matching("requeue", which, machine.requeue)

    def _apply_matching(self, action: str, which: Match, decide: Callable[..., Job]
                        ) -> list[Job]:
        """Each job re-read under its row lock before it moves (one finished meanwhile
        is left alone); one transaction per job, so a bulk action never blocks workers."""
        moved: list[Job] = []
        for job in list(self._iter_jobs(which.states, which.kind)):
            def step(cur: Job, now: float, was: JobState = job.state) -> Job:
                if cur.state is not was or not which(cur, now):
                    return cur
                return decide(cur, now=now)

            new: Job | None = self._mutate(job.id, step, missing=lambda: None, what=action)
            if new is not None and new.revision != job.revision and new.state is not job.state:
                moved.append(new)
        return moved

    def remove_terminal(self, ids: Sequence[str], state: JobState) -> list[str]:
        """Delete these jobs for good where they are still in terminal `state` (a job
        requeued meanwhile is left alone); returns the ids removed."""
        if state not in (JobState.COMPLETED, JobState.DEAD_LETTER, JobState.CANCELED):
            raise ValueError(f"{state.value} is not a terminal state")
        self._check_writable("remove jobs")
        rows = self.db.run(lambda c: c.execute(
            "DELETE FROM jobspool_jobs WHERE id = ANY(%s) AND state = %s RETURNING id",
            (list(ids), state.value)).fetchall(), what="removing jobs")
        return sorted(r[0] for r in rows)

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
        """Jobs in id (creation) order per state, states in the file spool's order."""
        states = job_states(state)
        if kind is not None:
            validate_kind(kind)
        return self._iter_jobs(states, kind)

    def _iter_jobs(self, states: Sequence[JobState], kind: str | None) -> Iterator[Job]:
        for s in states:
            after = ""
            while True:
                params = (s.value, after, kind, kind)
                rows = self.db.run(functools.partial(_page, params=params), what="listing jobs")
                for r in rows:
                    yield to_job(r)
                if len(rows) < 500:
                    break
                after = rows[-1][0]

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job:
        """Block until the job reaches a terminal state; `WaitTimeout` after `timeout` seconds."""
        timeout, poll_seconds = validate_wait(timeout, poll_seconds)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while True:
            job = self.get(job_id)
            if job.terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job_id, float(timeout or 0))
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            time.sleep(delay if left is None else min(delay, left))
            delay = min(poll_seconds * 4, delay * 2)

    # ------------------------------------------------------------ leasing

    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None,
              exclude: Collection[str] = ()) -> list[Lease]:
        """Lease up to `limit` due jobs in order (one statement); see `Spool.claim`.
        `exclude` names jobs the caller already runs (never claimed again by it)."""
        self._check_writable("claim")
        limit = validate_int("limit", limit, minimum=1)
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        who = self._owner if owner is None else validate_owner(owner)
        if kinds is not None:
            for k in ([kinds] if isinstance(kinds, str) else kinds):
                validate_kind(k)
        return leasing.claim(self, kinds=kinds, limit=limit, owner=who, lease_seconds=seconds,
                             exclude=exclude)

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        (out,) = self.heartbeat_many([lease], lease_seconds=lease_seconds)
        if isinstance(out, LeaseLost):
            raise out
        return out

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]:
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        return leasing.heartbeat_many(self, leases, seconds)

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]:
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        return leasing.check_leases(self, leases, margin, seconds)

    def complete(self, lease: Lease, result: Any = None) -> Job:
        out = self.complete_many([(lease, result)])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def complete_many(self, items: Sequence[tuple[Lease, Any]]) -> list[Job | JobspoolError]:
        return leasing.settle(self, [x for x, _ in items], [("complete", r) for _, r in items])

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job:
        if delay is not None:
            delay = validate_seconds("delay", delay)
        out = self.fail_many([(lease, error, retryable, delay)])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]:
        return leasing.settle(self, [x[0] for x in items],
                              [("fail", (e, r, d)) for _, e, r, d in items])

    def release(self, lease: Lease, *, delay: float = 0.0) -> Job:
        """Give a leased job back without counting the attempt (fenced)."""
        delay = validate_seconds("delay", delay)
        out = leasing.settle(self, [lease], [("release", delay)])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[Lease]:
        """Run a block while `lease` is current, holding its row lock (no sweep or cancel
        can move the job meanwhile); the lease is extended before the lock is released."""
        with self.db.connection() as conn, conn.transaction():
            row = conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = %s FOR UPDATE",
                               (lease.job_id,)).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, lease.token, "job is gone")
            db_now = conn.execute("SELECT extract(epoch from now())::float8").fetchone()
            now = self.now() if self.clock is not None else float(db_now[0]) if db_now else 0.0
            machine.check_lease(to_job(row), lease, now)
            yield lease
            conn.execute("UPDATE jobspool_jobs SET expires_at = greatest(expires_at, %s), "
                         "revision = revision + 1 WHERE id = %s",
                         (now + self.lease_seconds, lease.job_id))

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None:
        return leasing.next_due_at(self, kinds)

    def note_running(self, tokens: Iterable[int], *, started: bool) -> None:
        """Nothing to record: a database lease outlives its process only until it expires."""

    def preload(self) -> None:
        """Nothing to preload: the claim index is the database's."""

    def fence_value(self) -> int:
        row = self.db.run(lambda c: c.execute(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM jobspool_fence"
        ).fetchone(), what="reading the fence")
        return int(row[0]) if row else 0

    def live_tokens(self) -> list[int]:
        rows = self.db.run(lambda c: c.execute(
            "SELECT token FROM jobspool_jobs WHERE state = 'leased' AND expires_at > %s",
            (self.now(),)).fetchall(), what="reading leases")
        return [int(r[0]) for r in rows]

    def min_live_token(self) -> int:
        return min(self.live_tokens(), default=self.fence_value() + 1)

    def arrival_watcher(self) -> NotifyWatcher:
        """Wakes an idle worker when a producer commits a job (LISTEN/NOTIFY, a hint)."""
        from jobspool.pg.notify import NotifyWatcher

        return NotifyWatcher(self.db, self.channel)

    # ------------------------------------------------------------ administration

    def stats(self, *, by_kind: bool = False) -> Any:
        from jobspool.pg.admin import stats

        return stats(self, by_kind=by_kind)

    def recover(self, replay: Any = None) -> Any:
        """Reclaim expired leases, replay prepared jobs past the grace period, prune."""
        from jobspool.pg.admin import recover

        self._check_writable("recover")
        return recover(self, replay)

    def prune(self, keep: int | None = None, older_than: float | None = None, *,
              keep_dead: int | None = None) -> Any:
        from jobspool.pg.admin import prune

        self._check_writable("prune")
        return prune(self, keep=keep, older_than=older_than, keep_dead=keep_dead)

    def health(self, **options: Any) -> Any:
        from jobspool.pg.admin import health

        return health(self, **options)

    def fsck(self) -> Any:
        from jobspool.pg.admin import fsck

        return fsck(self)



if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI

    def _is_a_store(spool: PgSpool) -> SpoolAPI:
        return spool  # mypy checks PgSpool keeps the whole surface of a store
