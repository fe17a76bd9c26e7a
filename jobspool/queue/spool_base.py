"""`SpoolBase`: opening a spool directory and the one path every change takes.

`_commit` is that path: encode the new snapshots (refusing bad ones before
any file is touched), hand them to the store as one batch, then bump the
generation of every directory touched and log what the batch did to
`ready/`, so every process's claim index can follow (`index.py`,
`changelog.py`). The public operations live in `leasing.py` (claims and
lease holders) and `spool.py` (producers, administration, reading).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Self

from jobspool.errors import JobspoolError, JobTooLarge, SpoolError
from jobspool.queue import machine
from jobspool.queue.fence import FENCE_FILE, FenceCounter, decode_fence, encode_fence
from jobspool.queue.groupflush import GroupFlush
from jobspool.queue.index import SLOT, ClaimIndex
from jobspool.queue.job import (
    MAX_JOB_BYTES,
    CorruptJob,
    Job,
    admission_limit,
    decode_job,
    encode_fitting,
    encode_job,
    report_unreadable,
    validate_int,
    validate_seconds,
)
from jobspool.queue.layout import SpoolSettings, open_layout
from jobspool.queue.lock import SpoolLock
from jobspool.queue.perms import file_mode
from jobspool.queue.states import ALL_STATES, CLAIMABLE, JobState
from jobspool.queue.store import (
    JOB_SUFFIX,
    Change,
    Store,
    fsync_dir,
    write_atomic,
    write_failed,
)

log = logging.getLogger("jobspool.queue.spool")

_UNSET: Any = object()

# Where new jobs land: the directories whose flush producers may share (groupflush.py).
_GROUP_DIRS = frozenset({JobState.READY.value, JobState.RETRYABLE.value,
                         JobState.PREPARED.value})
_GROUP_SLOTS = {SLOT[JobState(d)]: d for d in _GROUP_DIRS}


# What a read-only spool refuses up front (`_commit` and `_touch` refuse the rest): every
# public operation that writes, before it stages a file or takes the lock.
_WRITERS = ("enqueue", "enqueue_many", "prepare", "commit", "abort", "claim", "heartbeat",
            "heartbeat_many", "check_leases", "complete", "complete_many", "fail", "fail_many",
            "release", "fenced", "cancel", "requeue", "requeue_all", "recover", "prune",
            "cancel_matching", "requeue_matching", "enqueue_result", "enqueue_many_results")


class _DefaultFloat(float):
    """A default that reads as its value (in `help(Spool)`, DESIGN §5's signature) but means
    "not given": the value saved in `spool.json` then wins."""


class _DefaultInt(int):
    """The integer form of `_DefaultFloat`."""


def _given(value: Any) -> bool:
    return (value is not _UNSET and value is not None
            and not isinstance(value, _DefaultFloat | _DefaultInt))


def _pick(value: Any, stored: dict[str, Any], name: str, default: Any) -> Any:
    if _given(value):
        return value
    return stored.get(name, default)


def _check_given(lease_seconds: Any, max_attempts: Any, retry_base_seconds: Any,
                 retry_max_seconds: Any, keep_terminal: Any, max_job_bytes: Any) -> None:
    """Refuse a bad option before anything is created on disk."""
    for name, value in (("lease_seconds", lease_seconds), ("retry_base_seconds",
                        retry_base_seconds), ("retry_max_seconds", retry_max_seconds)):
        if _given(value):
            validate_seconds(name, value, positive=name == "lease_seconds")
    for name, value, low in (("max_attempts", max_attempts, 1), ("keep_terminal", keep_terminal, 0),
                             ("max_job_bytes", max_job_bytes, 1024)):
        if _given(value):
            validate_int(name, value, minimum=low)


class SpoolBase:
    """Settings, lock, store and claim index of one spool directory; the commit path."""


    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        lease_seconds: float = _DefaultFloat(60.0),
        max_attempts: int = _DefaultInt(5),
        retry_base_seconds: float = _DefaultFloat(1.0),
        retry_max_seconds: float = _DefaultFloat(300.0),
        keep_terminal: int = _DefaultInt(1000),
        keep_terminal_seconds: float | None = _UNSET,
        durable: bool = True,
        clock: Callable[[], float] = time.time,
        max_job_bytes: int = _DefaultInt(MAX_JOB_BYTES),
        max_rescues: int | None = _UNSET,
        prepare_grace_seconds: float = _DefaultFloat(300.0),
        max_due: int | None = None,
        max_lag_seconds: float | None = None,
        sync_mode: str = "auto",
        seed: int | None = None,
        read_only: bool = False,
        access: str | None = None,
    ) -> None:
        _check_given(lease_seconds, max_attempts, retry_base_seconds, retry_max_seconds,
                     keep_terminal, max_job_bytes)
        self.root = Path(root)
        self.read_only = read_only
        layout = open_layout(self.root, create=create, durable=durable, read_only=read_only,
                             access=access)
        # Absolute from here on: a handler calling os.chdir must not move the spool.
        self.root = self.root.absolute()
        self.access = layout.access
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
        # Retention by age (issue 12): a terminal job younger than this is kept even beyond
        # the newest `keep_terminal`, so a result stays readable for a known time.
        kts = (stored.get("keep_terminal_seconds") if keep_terminal_seconds is _UNSET
               else keep_terminal_seconds)
        self.keep_terminal_seconds = (None if kts is None else
                                      validate_seconds("keep_terminal_seconds", kts))
        rescues = stored.get("max_rescues", 10) if max_rescues is _UNSET else max_rescues
        self.max_rescues = None if rescues is None else validate_int("max_rescues", rescues,
                                                                     minimum=1)
        self.prepare_grace_seconds = validate_seconds(
            "prepare_grace_seconds",
            _pick(prepare_grace_seconds, stored, "prepare_grace_seconds", 300.0))
        self.max_job_bytes = validate_int(
            "max_job_bytes", _pick(max_job_bytes, stored, "max_job_bytes", MAX_JOB_BYTES),
            minimum=1024)
        self.max_due = None if max_due is None else validate_int("max_due", max_due, minimum=1)
        self.max_lag_seconds = (None if max_lag_seconds is None else
                                validate_seconds("max_lag_seconds", max_lag_seconds,
                                                 positive=True))
        self.durable = durable
        self.clock = clock
        self.policy = machine.RetryPolicy(self.retry_base_seconds, self.retry_max_seconds)
        self.rng = random.Random(seed)
        self._lock = SpoolLock(self.root / ".lock", read_only=read_only,
                               mode=file_mode(self.access))
        self._store = Store(self.root, durable=durable, sync_mode=sync_mode,
                            file_mode=file_mode(self.access))
        self._index = ClaimIndex(self._store, self._lock.generation, self._lock.ring)
        self._lock.on_reopen = self._index.invalidate
        if not read_only:
            # A file placed by hand may be a stale copy: claims check for newer copies of
            # what they take until `recover` has settled the spool (`SpoolLock.suspect`).
            self._index.on_foreign = self._suspect_copies
        self.fence = FenceCounter(self._lock, self._read_fence, self._write_fence)
        self._group = GroupFlush(self.root, self._lock, fsync_dir)
        self._tls = threading.local()
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._terminal_writes = 0
        self.settings = SpoolSettings(
            lease_seconds=self.lease_seconds, max_attempts=self.max_attempts,
            retry_base_seconds=self.retry_base_seconds, retry_max_seconds=self.retry_max_seconds,
            keep_terminal=self.keep_terminal, max_rescues=self.max_rescues,
            prepare_grace_seconds=self.prepare_grace_seconds,
            keep_terminal_seconds=self.keep_terminal_seconds,
            max_job_bytes=self.max_job_bytes, access=self.access)
        if read_only:
            for name in _WRITERS:
                if hasattr(self, name):
                    setattr(self, name, self._refuser(name))
            return
        if layout.created:
            layout.save_settings(self.settings)
        if not (self.root / FENCE_FILE).exists():
            with self._lock.hold():  # re-check under the lock: never reset a live counter
                if not (self.root / FENCE_FILE).exists():
                    write_atomic(self.root / FENCE_FILE, encode_fence(0), durable=durable,
                                 mode=file_mode(self.access))

    # ------------------------------------------------------------ plumbing

    def check_writable(self, action: str) -> None:
        """Raise `SpoolError` naming the cause when this spool was opened `read_only`."""
        if self.read_only:
            raise SpoolError(f"cannot {action}: spool {self.root} is open read-only "
                             "(open it with read_only=False, as a user who may write it)",
                             path=str(self.root))

    def _refuser(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            self.check_writable(name.replace("_", " "))

        refuse.__name__ = name
        return refuse

    def close(self) -> None:
        self._group.close()
        self._lock.close()

    def __enter__(self) -> Self:
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

    def read_job(self, state: JobState, job_id: str) -> Job | None:
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

    def locate(self, job_id: str) -> tuple[Job | None, list[JobState]]:
        """The newest copy of a job and the states holding stale copies (crash leftovers)."""
        copies = [j for j in (self.read_job(s, job_id) for s in ALL_STATES) if j is not None]
        if not copies:
            return None, []
        best = max(copies, key=lambda j: j.revision)
        return best, [j.state for j in copies if j is not best]

    def commit_changes(self, pairs: Sequence[tuple[Job | None, Job | None]],
                extra: Sequence[Change] = (), *, staged: dict[str, str] | None = None,
                encoded: dict[str, bytes] | None = None, group: bool = False) -> None:
        """Persist a batch of (old, new) snapshots as one store batch (call under the lock).

        Encoding happens first, so a job that is too large or not serializable
        raises before any file is touched.
        """
        self.check_writable("write")
        # Root files (the fence) go first: see `claim`.
        changes: list[Change] = [ch for ch in extra if ch.dst == ""]
        touched: set[JobState] = set()
        for old, new in pairs:
            name = (new or old).id + JOB_SUFFIX  # type: ignore[union-attr]
            path = staged.get(new.id) if staged and new is not None and old is None else None
            if path is not None:
                data: bytes | None = b""  # written (and size-checked) by `prestage`
            elif new is None:
                data = None
            elif encoded is not None and new.id in encoded:
                data = encoded[new.id]  # the caller encoded (and size-checked) it already
            else:
                data = self._encode_internal(new)
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
        # Pure inserts may share their directory flush with concurrent producers.
        deferred = group and self.durable and all(ch.src is None for ch in changes) \
            and all(ch.dst in _GROUP_DIRS for ch in changes)
        self._lock.begin_write()
        try:
            self._store.apply(changes, flush_dirs=not deferred)
        except BaseException as exc:
            self._lock.end_write(clean=False)
            for s in touched:
                self._lock.bump(SLOT[s])
            self._index.invalidate()
            if isinstance(exc, OSError):
                # The outcome is unknown per job: say which new versions are on disk, so
                # the caller adopts those (a claim keeps their leases, a settle counts
                # them done) instead of believing nothing happened.
                landed = self._landed(pairs)
                self._retire_superseded(pairs, landed)
                raise write_failed(exc, self.root, landed) from None
            raise
        self._lock.end_write(clean=True)
        for s in touched:
            g = self._lock.bump(SLOT[s])
            if s is JobState.READY:
                self._log_ready(g, pairs, extra)
            if s in current:
                self._index.mark_current(s, g)
        if deferred and changes:
            self._tls.pending = max(getattr(self._tls, "pending", 0),
                                    self._group.publish(SLOT[s] for s in touched))
        for old, new in pairs:
            if old is not None:
                self._index.forget(old.state, old.id)
            if new is not None and new.state in CLAIMABLE:
                self._index.learn(new)
            if new is not None and new.state in (JobState.COMPLETED, JobState.DEAD_LETTER,
                                                 JobState.CANCELED):
                self._terminal_writes += 1

    def _suspect_copies(self) -> None:
        self._lock.bump(self._lock.SUSPECT_SLOT)

    def _await_group_flush(self) -> None:
        """Wait (without the lock) for the group flush covering this thread's deferred
        publications, if any (groupflush.py)."""
        number = getattr(self._tls, "pending", 0)
        if not number:
            return
        self._tls.pending = 0
        try:
            self._group.wait(number, _GROUP_SLOTS)
        except OSError as exc:
            raise write_failed(exc, self.root) from None

    def _landed(self, pairs: Sequence[tuple[Job | None, Job | None]]) -> frozenset[str]:
        """Ids whose new version is on disk, re-read after a failed write."""
        out = set()
        for _old, new in pairs:
            if new is not None:
                found = self.read_job(new.state, new.id)
                if found is not None and found.revision == new.revision:
                    out.add(new.id)
        return frozenset(out)

    def _retire_superseded(self, pairs: Sequence[tuple[Job | None, Job | None]],
                           landed: frozenset[str]) -> None:
        """Best effort after a failed write: remove the old copies of jobs whose new version
        landed, so readers see one copy (recovery settles any left, by revision)."""
        for old, new in pairs:
            if old is not None and new is not None and new.id in landed \
                    and old.state is not new.state:
                with contextlib.suppress(OSError):
                    os.unlink(self.root / old.state.value / (old.id + JOB_SUFFIX))

    def _encode_internal(self, job: Job) -> bytes:
        """Encode the result of a transition the spool itself makes (claim, heartbeat, fail,
        release, cancel, requeue, reclaim, replay): never refused for its size.

        Admission (`encode_admitted`) kept room for what these add and `encode_fitting`
        cuts errors and tracebacks to the room left, so the file fits `max_job_bytes`.
        Only a job admitted under an older, looser rule can still be over: it is written
        anyway (logged), because refusing would wedge it — and every batch it is in.
        """
        try:
            return encode_fitting(job, max_bytes=self.max_job_bytes)
        except JobTooLarge as exc:
            log.warning("job %s is %d bytes serialized, over max_job_bytes=%d; written anyway "
                        "so that it can move on", job.id, exc.size, self.max_job_bytes,
                        extra={"job_id": job.id})
            return encode_job(job, max_bytes=sys.maxsize)

    @property
    def admission_bytes(self) -> int:
        """The largest serialized size a new job may have (see `job.admission_limit`)."""
        return admission_limit(self.max_job_bytes)

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

    def touch(self, states: Iterable[JobState]) -> None:
        """Tell every process's claim index that these directories changed outside `_commit`
        (recovery's quarantine moves, pruning); call under the lock."""
        self.check_writable("write")
        for s in states:
            self._lock.bump(SLOT[s])
        self._index.invalidate()

    def stale_removals(self, job_id: str, stale: Iterable[JobState]) -> list[Change]:
        return [Change(name=job_id + JOB_SUFFIX, dst=None, data=None, src=s.value) for s in stale]

    def _read_fence(self) -> int:
        try:
            return decode_fence(self._store.read("", FENCE_FILE))
        except FileNotFoundError:
            return 0
        except ValueError as exc:
            raise SpoolError(f"{self.root / FENCE_FILE}: {exc}; run `jobspool recover` to "
                             "rebuild it from the tokens on disk",
                             path=str(self.root / FENCE_FILE)) from None

    def _write_fence(self, value: int) -> None:
        """Flush a new token ceiling (under the lock; see `FenceCounter`)."""
        try:
            write_atomic(self.root / FENCE_FILE, encode_fence(value), durable=self.durable,
                         mode=file_mode(self.access))
        except OSError as exc:
            raise write_failed(exc, self.root) from None

    def fence_value(self) -> int:
        """The last token handed out (under the lock; a reader without write access gets
        the ceiling on disk, which is at or above it)."""
        with self._lock.hold():
            return self.fence.last()

    def _maybe_autoprune(self) -> None:
        """Amortized retention: prune once per `keep_terminal // 4 + 64` terminal writes here."""
        if self._terminal_writes < max(64, self.keep_terminal // 4):
            return
        self._terminal_writes = 0
        try:
            self._autoprune()
        except (OSError, JobspoolError) as exc:
            log.warning("automatic pruning failed (will retry later): %s", exc)

    def _autoprune(self) -> None:
        """Retention itself: administration's, which the `Spool` facade (above it) plugs in;
        the core never imports up."""
