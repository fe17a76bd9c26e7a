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

import logging
import math
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobspool.errors import (
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    JobspoolError,
    LeaseLost,
    SpoolError,
    WaitTimeout,
)
from jobspool.queue import machine
from jobspool.queue.fence import FENCE_FILE, decode_fence, encode_fence
from jobspool.queue.index import SLOT, ClaimIndex
from jobspool.queue.job import (
    MAX_JOB_BYTES,
    CorruptJob,
    Job,
    Lease,
    Reservation,
    check_json,
    decode_job,
    encode_job,
    evolve,
    new_job_id,
    new_token_id,
    report_unreadable,
    validate_int,
    validate_job_id,
    validate_kind,
    validate_seconds,
)
from jobspool.queue.layout import SpoolSettings, open_layout
from jobspool.queue.lock import SpoolLock
from jobspool.queue.states import ALL_STATES, CLAIMABLE, JobState, check_source
from jobspool.queue.stats import Stats, collect_stats
from jobspool.queue.store import JOB_SUFFIX, Change, Store, write_atomic

if TYPE_CHECKING:
    from jobspool.health import Health
    from jobspool.recovery.fsck import FsckReport
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport, ReplayHook

log = logging.getLogger(__name__)

_UNSET: Any = object()


def _pick(value: Any, stored: dict[str, Any], name: str, default: Any) -> Any:
    if value is not _UNSET and value is not None:
        return value
    return stored.get(name, default)


class Spool:
    """A durable job queue in one directory, shared safely by threads and processes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        lease_seconds: float = _UNSET,
        max_attempts: int = _UNSET,
        retry_base_seconds: float = _UNSET,
        retry_max_seconds: float = _UNSET,
        keep_terminal: int = _UNSET,
        durable: bool = True,
        clock: Callable[[], float] = time.time,
        max_job_bytes: int = MAX_JOB_BYTES,
        max_rescues: int | None = _UNSET,
        prepare_grace_seconds: float = _UNSET,
        max_due: int | None = None,
        max_lag_seconds: float | None = None,
        sync_mode: str = "auto",
        seed: int | None = None,
    ) -> None:
        self.root = Path(root)
        layout = open_layout(self.root, create=create, durable=durable)
        stored = layout.settings
        self.lease_seconds = validate_seconds(
            "lease_seconds", _pick(lease_seconds, stored, "lease_seconds", 60.0), positive=True)
        self.max_attempts = validate_int(
            "max_attempts", _pick(max_attempts, stored, "max_attempts", 5), minimum=1)
        self.retry_base_seconds = validate_seconds(
            "retry_base_seconds", _pick(retry_base_seconds, stored, "retry_base_seconds", 1.0))
        self.retry_max_seconds = validate_seconds(
            "retry_max_seconds", _pick(retry_max_seconds, stored, "retry_max_seconds", 300.0))
        self.keep_terminal = validate_int(
            "keep_terminal", _pick(keep_terminal, stored, "keep_terminal", 1000), minimum=0)
        rescues = stored.get("max_rescues", 10) if max_rescues is _UNSET else max_rescues
        self.max_rescues = None if rescues is None else validate_int("max_rescues", rescues,
                                                                     minimum=1)
        self.prepare_grace_seconds = validate_seconds(
            "prepare_grace_seconds",
            _pick(prepare_grace_seconds, stored, "prepare_grace_seconds", 300.0))
        self.max_job_bytes = validate_int("max_job_bytes", max_job_bytes, minimum=256)
        self.max_due = None if max_due is None else validate_int("max_due", max_due, minimum=1)
        self.max_lag_seconds = (None if max_lag_seconds is None else
                                validate_seconds("max_lag_seconds", max_lag_seconds,
                                                 positive=True))
        self.durable = durable
        self.clock = clock
        self.policy = machine.RetryPolicy(self.retry_base_seconds, self.retry_max_seconds)
        self._rng = random.Random(seed)
        self._lock = SpoolLock(self.root / ".lock")
        self._store = Store(self.root, durable=durable, sync_mode=sync_mode)
        self._index = ClaimIndex(self._store, self._lock.generation, self._lock.ring)
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._terminal_writes = 0
        self.settings = SpoolSettings(
            lease_seconds=self.lease_seconds, max_attempts=self.max_attempts,
            retry_base_seconds=self.retry_base_seconds, retry_max_seconds=self.retry_max_seconds,
            keep_terminal=self.keep_terminal, max_rescues=self.max_rescues,
            prepare_grace_seconds=self.prepare_grace_seconds)
        if layout.created:
            layout.save_settings(self.settings)
        if not (self.root / FENCE_FILE).exists():
            with self._lock.hold():  # re-check under the lock: never reset a live counter
                if not (self.root / FENCE_FILE).exists():
                    write_atomic(self.root / FENCE_FILE, encode_fence(0), durable=durable)

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._lock.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Spool({str(self.root)!r})"

    @property
    def lock(self) -> SpoolLock:
        return self._lock

    @property
    def store(self) -> Store:
        return self._store

    def now(self) -> float:
        return float(self.clock())

    def _read(self, state: JobState, job_id: str) -> Job | None:
        """One job file, or None when absent; a corrupt file is logged and treated as absent."""
        try:
            data = self._store.read(state.value, job_id + JOB_SUFFIX)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a directory in its place, no permission, EIO: unreadable
            report_unreadable(state.value, job_id, exc.strerror or str(exc))
            return None
        try:
            return decode_job(data, expect_id=job_id, expect_state=state)
        except CorruptJob as exc:
            report_unreadable(state.value, job_id, exc.reason)
            return None

    def _locate(self, job_id: str) -> tuple[Job | None, list[JobState]]:
        """The newest copy of a job and the states holding stale copies (crash leftovers)."""
        copies = [j for j in (self._read(s, job_id) for s in ALL_STATES) if j is not None]
        if not copies:
            return None, []
        best = max(copies, key=lambda j: j.revision)
        return best, [j.state for j in copies if j is not best]

    def _commit(self, pairs: Sequence[tuple[Job | None, Job | None]],
                extra: Sequence[Change] = (), *, staged: dict[str, str] | None = None) -> None:
        """Persist a batch of (old, new) snapshots as one store batch (call under the lock).

        Encoding happens first, so a job that is too large or not serializable
        raises before any file is touched.
        """
        # Root files (the fence) go first: see `claim`.
        changes: list[Change] = [ch for ch in extra if ch.dst == ""]
        touched: set[JobState] = set()
        for old, new in pairs:
            name = (new or old).id + JOB_SUFFIX  # type: ignore[union-attr]
            path = staged.get(new.id) if staged and new is not None and old is None else None
            if path is not None:
                data: bytes | None = b""  # written (and size-checked) by `prestage`
            else:
                data = encode_job(new, max_bytes=self.max_job_bytes) if new is not None else None
            changes.append(Change(name=name, dst=new.state.value if new else None, data=data,
                                  src=old.state.value if old else None, staged=path))
            if old is not None:
                touched.add(old.state)
            if new is not None:
                touched.add(new.state)
        changes.extend(ch for ch in extra if ch.dst != "")
        for ch in extra:
            for d in (ch.src, ch.dst):
                if d and d in JobState._value2member_map_:
                    touched.add(JobState(d))
        current = {s for s in touched if self._index.tracked(s) and self._index.is_current(s)}
        self._lock.begin_write()
        try:
            self._store.apply(changes)
        except BaseException:
            self._lock.end_write(clean=False)
            for s in touched:
                self._lock.bump(SLOT[s])
            self._index.invalidate()
            raise
        self._lock.end_write(clean=True)
        for s in touched:
            g = self._lock.bump(SLOT[s])
            if s is JobState.READY:
                self._log_ready(g, pairs, extra)
            if s in current:
                self._index.mark_current(s, g)
        for old, new in pairs:
            if old is not None:
                self._index.forget(old.state, old.id)
            if new is not None and new.state in CLAIMABLE:
                self._index.learn(new)
            if new is not None and new.state in (JobState.COMPLETED, JobState.DEAD_LETTER,
                                                 JobState.CANCELED):
                self._terminal_writes += 1

    def _log_ready(self, generation: int, pairs: Sequence[tuple[Job | None, Job | None]],
                   extra: Sequence[Change]) -> None:
        """Tell other processes' claim indexes what this batch did to `ready/` (changelog.py)."""
        ready = JobState.READY
        added = [new.id for old, new in pairs
                 if new is not None and new.state is ready and (old is None or old.state is not ready)]
        removed = [old.id for old, new in pairs
                   if old is not None and old.state is ready and (new is None or new.state is not ready)]
        removed += [ch.name[: -len(JOB_SUFFIX)] for ch in extra
                    if ch.src == ready.value and ch.dst is None]
        self._lock.ring.record(generation, added, removed)

    def _touch(self, states: Iterable[JobState]) -> None:
        """Tell every process's claim index that these directories changed outside `_commit`
        (recovery's quarantine moves, pruning); call under the lock."""
        for s in states:
            self._lock.bump(SLOT[s])
        self._index.invalidate()

    def _stale_removals(self, job_id: str, stale: Iterable[JobState]) -> list[Change]:
        return [Change(name=job_id + JOB_SUFFIX, dst=None, data=None, src=s.value) for s in stale]

    # ------------------------------------------------------------ producing

    def enqueue(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, priority: int = 0, max_attempts: int | None = None) -> Job:
        """Add a job (idempotent on `job_id`); `delay` > 0 parks it in `retryable` until due."""
        ids = None if job_id is None else [job_id]
        return self.enqueue_many(kind, [payload], job_ids=ids, delay=delay, priority=priority,
                                 max_attempts=max_attempts)[0]

    def enqueue_many(self, kind: str, payloads: Iterable[Any], *,
                     job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                     priority: int = 0, max_attempts: int | None = None) -> list[Job]:
        """Add many jobs of one kind under one lock hold and one shared flush.

        All input is validated before anything is written: one bad item and
        nothing of the batch lands.
        """
        validate_kind(kind)
        payload_list = list(payloads)
        ids = self._ids_for(payload_list, job_ids)
        delay = validate_seconds("delay", delay)
        validate_int("priority", priority)
        attempts = self.max_attempts if max_attempts is None else validate_int(
            "max_attempts", max_attempts, minimum=1)
        now = self.now()
        fresh = [machine.new_job(job_id=i, kind=kind, payload=p, now=now, delay=delay,
                                 priority=priority, max_attempts=attempts)
                 for i, p in zip(ids, payload_list, strict=True)]
        # Encode (refusing bad input) and write the new files before taking the lock:
        # creating inodes is the costly part of an enqueue, and other processes need not
        # wait for it. Only the renames that publish them happen under the lock.
        datas = [encode_job(job, max_bytes=self.max_job_bytes) for job in fresh]
        paths = self._store.prestage(datas)
        staged = {job.id: path for job, path in zip(fresh, paths, strict=True)}
        try:
            with self._lock.hold():
                return self._insert(fresh, given=job_ids is not None, now=self.now(),
                                    delay=delay, priority=priority, max_attempts=attempts,
                                    staged=staged)
        finally:
            self._store.discard(list(staged.values()))  # whatever was not published

    def _ids_for(self, payloads: list[Any], job_ids: Sequence[str | None] | None) -> list[str]:
        if job_ids is None:
            return [new_job_id() for _ in payloads]
        if len(job_ids) != len(payloads):
            raise InvalidJob(f"job_ids has {len(job_ids)} items for {len(payloads)} payloads",
                             field="job_ids")
        return [new_job_id() if i is None else validate_job_id(i) for i in job_ids]

    def _insert(self, fresh: list[Job], *, given: bool, now: float, delay: float, priority: int,
                max_attempts: int, reservation: str | None = None,
                staged: dict[str, str] | None = None) -> list[Job]:
        """Publish new jobs; `staged` maps ids to files already written for them (those
        that get published are removed from it, the caller discards the rest)."""
        staged = {} if staged is None else staged
        publish: dict[str, str] = {}
        out: list[Job] = []
        pairs: list[tuple[Job | None, Job | None]] = []
        stale: list[Change] = []
        seen: dict[str, Job] = {}
        for job in fresh:
            if job.id in seen:
                out.append(seen[job.id])
                continue
            existing, copies = self._locate(job.id) if given else (None, [])
            stale.extend(self._stale_removals(job.id, copies))
            new: Job | None
            if existing is None:
                if job.id in staged:
                    new = job  # exactly what was written outside the lock
                    publish[job.id] = staged.pop(job.id)
                else:
                    new = evolve(job, created_at=now, updated_at=now, run_at=now + delay)
                pairs.append((None, new))
            elif existing.state is JobState.CANCELED:
                new = machine.reopen(existing, kind=job.kind, payload=job.payload, now=now,
                                     delay=delay,
                                     priority=priority, max_attempts=max_attempts,
                                     state=job.state if reservation else None,
                                     reservations=job.reservations)
                pairs.append((existing, new))
            elif reservation is not None and existing.state is JobState.PREPARED:
                new = machine.add_reservation(existing, reservation, now=now)
                pairs.append((existing, new))
            else:
                new = existing  # idempotent: the job exists, return it unchanged
            seen[job.id] = new
            out.append(new)
        # Backpressure counts only what this call adds: an idempotent re-enqueue of an
        # existing job adds nothing and is never refused.
        try:
            self._admit(sum(1 for old, new in pairs
                            if old is None or old.state is JobState.CANCELED))
            self._commit(pairs, stale, staged=publish)
        except BaseException:
            staged.update(publish)  # not published: the caller discards them
            raise
        return out

    def _admit(self, n: int) -> None:
        """Writer backpressure (off unless `max_due`/`max_lag_seconds` are set)."""
        if n == 0 or (self.max_due is None and self.max_lag_seconds is None):
            return
        from jobspool.queue.backpressure import admit

        admit(self, n, False)

    # ------------------------------------------------------------ two-phase

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, priority: int = 0,
                max_attempts: int | None = None) -> Reservation:
        """Reserve a job in `prepared` (outbox step 1); several producers may share one id."""
        validate_kind(kind)
        jid = new_job_id() if job_id is None else validate_job_id(job_id)
        delay = validate_seconds("delay", delay)
        validate_int("priority", priority)
        attempts = self.max_attempts if max_attempts is None else validate_int(
            "max_attempts", max_attempts, minimum=1)
        rid = new_token_id()
        now = self.now()
        job = machine.new_job(job_id=jid, kind=kind, payload=payload, now=now, delay=delay,
                              priority=priority, max_attempts=attempts,
                              state=JobState.PREPARED, reservations=(rid,))
        encode_job(job, max_bytes=self.max_job_bytes)
        with self._lock.hold():
            (stored,) = self._insert([job], given=job_id is not None, now=self.now(),
                                     delay=delay, priority=priority, max_attempts=attempts,
                                     reservation=rid)
        return Reservation(job_id=jid, reservation_id=rid, job=stored)

    def commit(self, reservation: Reservation) -> Job:
        """Publish a prepared job (outbox step 3). Idempotent once the job left `prepared`."""
        with self._lock.hold():
            job, stale = self._locate(reservation.job_id)
            if job is None:
                raise JobNotFound(reservation.job_id)
            if job.state is not JobState.PREPARED:
                if job.state is JobState.CANCELED:
                    raise InvalidTransition(job.id, job.state.value, "commit")
                return job
            if reservation.reservation_id not in job.reservations:
                raise InvalidTransition(job.id, "prepared (reservation released)", "commit")
            new = machine.commit(job, now=self.now())
            self._commit([(job, new)], self._stale_removals(job.id, stale))
            return new

    def abort(self, reservation: Reservation) -> Job | None:
        """Release one reservation; returns the canceled job when it was the last, else None."""
        with self._lock.hold():
            job, stale = self._locate(reservation.job_id)
            if job is None or job.state is not JobState.PREPARED:
                return None
            if reservation.reservation_id not in job.reservations:
                return None
            new = machine.abort(job, reservation.reservation_id, now=self.now())
            self._commit([(job, new)], self._stale_removals(job.id, stale))
            return new if new.state is JobState.CANCELED else None

    # ------------------------------------------------------------ consuming

    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None) -> list[Lease]:
        """Lease up to `limit` due jobs in (priority, run_at, id) order, one fsync'd batch.

        Takes jobs from `ready`, from `retryable` once `run_at <= now`, and from
        `leased` when the lease expired (the crashed-worker case: the attempt
        is counted, and a job out of attempts or rescues is dead-lettered
        instead). Each lease gets a fresh token from the spool-wide counter.
        """
        validate_int("limit", limit, minimum=1)
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        kind_set: frozenset[str] | None
        if kinds is None:
            kind_set = None
        else:
            kind_set = frozenset([kinds] if isinstance(kinds, str) else kinds)
            for k in kind_set:
                validate_kind(k)
        who = owner or self._owner
        with self._lock.hold():
            try:
                return self._claim_locked(kind_set, limit, who, seconds)
            except BaseException:
                # The index already forgot the candidates it handed out; a failure before
                # the write must not hide those jobs from this process's later claims.
                self._index.invalidate()
                raise

    def _claim_locked(self, kind_set: frozenset[str] | None, limit: int, who: str,
                      seconds: float) -> list[Lease]:
        now = self.now()
        fence = self._read_fence()  # before touching the index: a bad fence changes nothing
        self._index.refresh()
        picked: list[Job] = []
        dead: list[tuple[Job | None, Job | None]] = []
        stale: list[Change] = []
        while len(picked) < limit:
            cands = self._index.candidates(now, kind_set, limit - len(picked))
            if not cands:
                break
            for c in cands:
                if any(p.id == c.job_id for p in picked):
                    continue
                job = self._read(c.state, c.job_id)
                self._index.forget(c.state, c.job_id)
                if job is None:
                    continue
                if not machine.is_due(job, now):
                    self._index.learn(job)  # the cache was behind; keep the true key
                    continue
                # Only after a writer died mid-batch (and until recovery ran) can a job have
                # a stale copy here; checking always would cost six opens per claimed job.
                newer = self._newer_copy(job) if self._lock.suspect() else None
                if newer is not None:
                    # A crash between publishing a job's new file and retiring the old one
                    # left this stale copy; running it would redo or undo finished work.
                    log.warning("job %s: dropping stale %s copy (revision %d) behind %s "
                                "(revision %d)", job.id, job.state.value, job.revision,
                                newer.state.value, newer.revision, extra={"job_id": job.id})
                    stale.extend(self._stale_removals(job.id, [job.state]))
                    continue
                if machine.lease_expired(job, now) and self._exhausted(job):
                    gone = machine.reclaim(job, now=now, policy=self.policy,
                                           max_rescues=self.max_rescues, rng=self._rng)
                    log.warning("job %s (%s) dead-lettered on reclaim: %s", job.id, job.kind,
                                gone.last_error, extra={"job_id": job.id, "kind": job.kind,
                                                        "state": gone.state.value})
                    dead.append((job, gone))
                    continue
                picked.append(job)
        pairs: list[tuple[Job | None, Job | None]] = list(dead)
        leases: list[Lease] = []
        extra: list[Change] = []
        if picked:
            # The counter goes first in the batch: a crash mid-batch may leave it ahead
            # of the tokens on disk (harmless), never behind them.
            extra.append(Change(name=FENCE_FILE, dst="",
                                data=encode_fence(fence + len(picked))))
        for token, job in enumerate(picked, start=fence + 1):
            new = machine.claim(job, token=token, owner=who, now=now, lease_seconds=seconds)
            pairs.append((job, new))
            assert new.lease is not None
            leases.append(Lease(job_id=new.id, token=token, owner=who,
                                expires_at=new.lease.expires_at, job=new))
        if pairs or stale:
            self._commit(pairs, extra + stale)
        return leases

    def _newer_copy(self, job: Job) -> Job | None:
        """A copy of `job` with a higher revision in another state directory, if any.

        Six failed opens (a few microseconds each) per claimed job buy the
        guarantee that a crash leftover is never claimed before recovery ran.
        """
        best: Job | None = None
        for state in ALL_STATES:
            if state is not job.state:
                other = self._read(state, job.id)
                if other is not None and other.revision > job.revision and (
                        best is None or other.revision > best.revision):
                    best = other
        return best

    def _exhausted(self, job: Job) -> bool:
        if job.attempts >= job.max_attempts:
            return True
        return self.max_rescues is not None and job.rescues + 1 > self.max_rescues

    def _read_fence(self) -> int:
        try:
            return decode_fence(self._store.read("", FENCE_FILE))
        except FileNotFoundError:
            return 0
        except ValueError as exc:
            raise SpoolError(f"{self.root / FENCE_FILE}: {exc}; run `jobspool recover` to "
                             "rebuild it from the tokens on disk",
                             path=str(self.root / FENCE_FILE)) from None

    def fence_value(self) -> int:
        """The last token handed out (read under the lock)."""
        with self._lock.hold():
            return self._read_fence()

    def _leased_job(self, lease: Lease) -> Job:
        job = self._read(JobState.LEASED, lease.job_id)
        if job is None:
            found, _ = self._locate(lease.job_id)
            state = found.state.value if found is not None else "gone"
            raise LeaseLost(lease.job_id, lease.token, f"job is {state}")
        return job

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """Extend a lease; `LeaseLost` (and no change) unless it is current and unexpired."""
        (out,) = self.heartbeat_many([lease], lease_seconds=lease_seconds)
        if isinstance(out, LeaseLost):
            raise out
        return out

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]:
        """Extend many leases under one lock hold and one shared flush (the worker's beat).

        Returns per lease the extended lease, or the `LeaseLost` that refused it.
        """
        return self.check_leases(leases, margin=math.inf, lease_seconds=lease_seconds)

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]:
        """Which leases are still current: per lease, itself or the `LeaseLost` refusing it.

        Reads only; a lease with less than `margin` seconds left is extended
        (written) in the same lock hold, so a caller about to do a side effect
        keeps it for at least that long.
        """
        seconds = self.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        out: list[Lease | LeaseLost] = []
        with self._lock.hold():
            now = self.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for lease in leases:
                try:
                    job = self._leased_job(lease)
                    machine.check_lease(job, lease, now)
                except LeaseLost as exc:
                    out.append(exc)
                    continue
                assert job.lease is not None
                if job.lease.expires_at - now >= margin:
                    out.append(lease)
                    continue
                new = machine.heartbeat(job, lease, now=now, lease_seconds=seconds)
                pairs.append((job, new))
                assert new.lease is not None
                out.append(Lease(job_id=lease.job_id, token=lease.token, owner=lease.owner,
                                 expires_at=new.lease.expires_at, job=new))
            self._commit(pairs)
        return out

    def preload(self) -> None:
        """Read the claimable backlog into this process's claim index now.

        A process's first claim reads the sort key of every job waiting in
        `ready/`, `retryable/` and `leased/` (about 10 µs a job: a second for
        100,000); later claims read only what changed. Call this at start-up
        to pay that cost before serving rather than inside the first claim.
        """
        with self._lock.hold():
            self._index.refresh()

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None:
        """When the next not-yet-due job (retryable, or an expiring lease) becomes claimable."""
        kind_set = None if kinds is None else frozenset(kinds)
        with self._lock.hold():
            self._index.refresh()
            return self._index.next_due_at(self.now(), kind_set)

    def live_tokens(self) -> list[int]:
        """Tokens of every unexpired lease (maintenance keeps tombstones newer than the least)."""
        now = self.now()
        out = []
        for job_id in self._store.names(JobState.LEASED.value):
            job = self._read(JobState.LEASED, job_id)
            if job is not None and job.lease is not None and job.lease.expires_at > now:
                out.append(job.lease.token)
        return out

    def min_live_token(self) -> int:
        """The smallest token any live lease holds, or the next token when none is live:
        no run that could still write carries a smaller one."""
        return min(self.live_tokens(), default=self.fence_value() + 1)

    def complete(self, lease: Lease, result: Any = None) -> Job:
        """Mark a leased job completed (fenced: `LeaseLost` if the lease is not current)."""
        outcome = self.complete_many([(lease, result)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def complete_many(self, items: Sequence[tuple[Lease, Any]]) -> list[Job | JobspoolError]:
        """Complete many leases under one lock hold and one shared flush.

        Returns, per item, the completed job or the error that refused it
        (`LeaseLost`, `JobTooLarge` / `InvalidJob` for a result that cannot be
        stored); refused items change nothing.
        """
        return self._settle([lease for lease, _ in items],
                            [("complete", result) for _, result in items])

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job:
        """Record a failed attempt: `retryable` with backoff, or `dead_letter` when permanent
        or out of attempts (fenced like `complete`)."""
        if delay is not None:
            delay = validate_seconds("delay", delay)
        outcome = self.fail_many([(lease, error, retryable, delay)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]:
        """Fail many leases under one lock hold and one shared flush (see `complete_many`)."""
        return self._settle([item[0] for item in items],
                            [("fail", (err, retry, delay)) for _, err, retry, delay in items])

    def _settle(self, leases: Sequence[Lease],
                actions: Sequence[tuple[str, Any]]) -> list[Job | JobspoolError]:
        out: list[Job | JobspoolError] = []
        with self._lock.hold():
            now = self.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for lease, (action, arg) in zip(leases, actions, strict=True):
                try:
                    job = self._leased_job(lease)
                    if action == "complete":
                        check_json("result", arg)
                        new = machine.complete(job, lease, now=now, result=arg)
                    else:
                        err, retryable, delay = arg
                        if delay is not None:
                            delay = validate_seconds("delay", delay)
                        new = machine.fail(job, lease, now=now, error=err, retryable=retryable,
                                           delay=delay, policy=self.policy, rng=self._rng)
                    encode_job(new, max_bytes=self.max_job_bytes)
                except JobspoolError as exc:
                    out.append(exc)
                    continue
                out.append(new)
                pairs.append((job, new))
            self._commit(pairs)
        self._maybe_autoprune()
        return out

    def release(self, lease: Lease, *, delay: float = 0.0) -> Job:
        """Give a leased job back without counting the attempt (fenced)."""
        delay = validate_seconds("delay", delay)
        with self._lock.hold():
            job = self._leased_job(lease)
            new = machine.release(job, lease, now=self.now(), delay=delay)
            self._commit([(job, new)])
            return new

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[Lease]:
        """Run a block under the spool lock, only while `lease` is current.

        Checks the lease before the block (`LeaseLost` otherwise) and extends
        it before releasing the lock, so no claim can take the job while the
        block runs. Protects side effects that must not happen after the job
        moved on; it does not make them atomic with the job's completion.
        """
        with self._lock.hold():
            job = self._leased_job(lease)
            machine.check_lease(job, lease, self.now())
            yield lease
            self.heartbeat(lease)

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
            job, stale = self._locate(job_id)
            if job is None:
                raise JobNotFound(job_id)
            check_source(job_id, action, job.state)
            new = decide(job, now=self.now())
            self._commit([(job, new)], self._stale_removals(job_id, stale))
            return new

    def requeue_all(self, state: JobState | str = JobState.DEAD_LETTER) -> list[Job]:
        """Requeue every job in `state` (dead letters by default) in one batch."""
        src = JobState(state)
        check_source("*", "requeue", src)
        with self._lock.hold():
            now = self.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for job_id in sorted(self._store.names(src.value)):
                job = self._read(src, job_id)
                if job is not None:
                    pairs.append((job, machine.requeue(job, now=now)))
            self._commit(pairs)
        return [new for _, new in pairs if new is not None]

    def get(self, job_id: str) -> Job:
        """The current snapshot of a job; `JobNotFound` if no state directory holds it."""
        validate_job_id(job_id)
        job, _ = self._locate(job_id)
        if job is None:
            # Lock-free probing can miss a job moving between two directories we probe
            # in the wrong order; the lock makes the second look exact.
            with self._lock.hold():
                job, _ = self._locate(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def jobs(self, state: JobState | str | None = None, kind: str | None = None) -> Iterator[Job]:
        """Jobs in id (creation) order per state directory; unreadable files are skipped.

        Each directory is listed once; a job that moves while the listing is
        read may be skipped or seen in both directories.
        """
        states = ALL_STATES if state is None else (JobState(state),)
        if kind is not None:
            validate_kind(kind)
        for s in states:
            for job_id in sorted(self._store.names(s.value)):
                job = self._read(s, job_id)
                if job is not None and (kind is None or job.kind == kind):
                    yield job

    def stats(self, *, by_kind: bool = False) -> Stats:
        """Counts per state, the age of the oldest due job, the fence, quarantine size."""
        return collect_stats(self, by_kind=by_kind)

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job:
        """Block until the job reaches a terminal state; `WaitTimeout` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while True:
            job = self.get(job_id)
            if job.terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job_id, float(timeout or 0))
            sleep = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(sleep)
            delay = min(poll_seconds * 4, delay * 2)

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
        """Remove old terminal jobs: beyond the newest `keep` of each terminal state
        (`keep_dead` for dead letters, default `keep`), and/or older than `older_than` s."""
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

    def _maybe_autoprune(self) -> None:
        """Amortized retention: prune once per `keep_terminal // 4 + 64` terminal writes here."""
        if self._terminal_writes < max(64, self.keep_terminal // 4):
            return
        self._terminal_writes = 0
        try:
            from jobspool.recovery.prune import prune_if_over

            prune_if_over(self)
        except ImportError:
            pass
        except (OSError, JobspoolError) as exc:
            log.warning("automatic pruning failed (will retry later): %s", exc)

