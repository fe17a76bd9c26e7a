"""`Journal`: the core of a spool directory, and the one path every change takes.

`commit_changes` is that path: encode the new snapshots (refusing bad ones
before any file is touched), hand them to the store as one batch, then bump
the generation of every directory touched and log what the batch did to
`ready/`, so every process's claim index can follow (`index.py`,
`changelog.py`). The operations built on it live above: `leasing.py`
(claims and lease holders), `producer.py` (enqueue, two-phase),
`bulk.py` and `recovery/` (administration); `spool.py` is the facade that
composes them. The reads and the settings a journal offers are its bases, in
`journalread.py`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Sequence

from jobspool.errors import (
    FULL_DISK,
    JobspoolError,
    SpoolError,
    WriteFailed,
)
from jobspool.queue import interrupts, liveness, machine
from jobspool.queue.diskerrors import (
    published_anyway,
    write_failed,
)
from jobspool.queue.fence import (
    FENCE_FILE,
    FenceCounter,
    encode_fence,
)
from jobspool.queue.fencefile import FenceFile
from jobspool.queue.groupflush import GroupFlush
from jobspool.queue.index import SLOT, ClaimIndex
from jobspool.queue.job import CorruptJob, Job, decode_job
from jobspool.queue.jobsize import admission_limit, fitted_anyway
from jobspool.queue.journalread import JournalReads, JournalSettings
from jobspool.queue.layout import Layout, SpoolSettings
from jobspool.queue.lock import SpoolLock
from jobspool.queue.options import ProcessOptions
from jobspool.queue.perms import dir_mode, file_mode
from jobspool.queue.procid import current_pid
from jobspool.queue.states import CLAIMABLE, TERMINAL, JobState
from jobspool.queue.store import (
    JOB_SUFFIX,
    Change,
    Store,
    Unflushed,
    fsync_dir,
    write_atomic,
)

log = logging.getLogger("jobspool.queue.spool")


# Where new jobs land: the directories whose flush producers may share (groupflush.py).
_GROUP_DIRS = frozenset({JobState.READY.value, JobState.RETRYABLE.value,
                         JobState.PREPARED.value})
_GROUP_SLOTS = {SLOT[JobState(d)]: d for d in _GROUP_DIRS}


def journal_of(spool: object) -> Journal | None:
    """The journal of a file spool given its `Spool` facade (or the journal itself); None
    for another store. Administration (quarantine, scans) works on the journal."""
    if isinstance(spool, Journal):
        return spool
    journal = getattr(spool, "journal", None)
    return journal if isinstance(journal, Journal) else None


class Journal(JournalReads, JournalSettings):
    """The core of one spool directory that every layer above reads and writes through.

    It owns the lock, the store, the claim index, the fence counter and the
    group flush, and offers the few operations everything above is built
    from: read a job (`read_job`), find every copy of one (`locate`), commit
    a batch of (old, new) snapshots (`commit_changes`), read the fence
    (`fence_value`). What a change should be is decided above it (the state
    machine, through the operations in leasing/producing/administration).
    """

    def __init__(self, layout: Layout, settings: SpoolSettings, options: ProcessOptions) -> None:
        # Absolute from here on: a handler calling os.chdir must not move the spool.
        self.root = layout.root.absolute()
        self._live_key: liveness.LiveKey | None = None  # counted open in liveness (writers), see close
        self._live_pid = 0
        self.settings = settings
        self.options = options
        self.read_only = options.read_only
        self.access = settings.access
        self.durable = options.durable
        self.clock = options.clock
        self.policy = machine.RetryPolicy(settings.retry_base_seconds,
                                          settings.retry_max_seconds)
        self.rng = random.Random(options.seed)
        # Called after enough terminal writes (`maybe_autoprune`): retention lives in
        # administration, above this layer, which plugs it in; the core never imports up.
        self.autoprune: Callable[[], None] | None = None
        self.lock = SpoolLock(self.root / ".lock", read_only=options.read_only,
                              mode=file_mode(self.access))
        self.store = Store(self.root, durable=options.durable, sync_mode=options.sync_mode,
                           file_mode=file_mode(self.access), dir_mode=dir_mode(self.access))
        self.index = ClaimIndex(self.store, self.lock.generation, self.lock.ring)
        self.lock.on_reopen = self.index.invalidate
        if not options.read_only:
            # A file placed by hand may be a stale copy: claims check for newer copies of
            # what they take until `recover` has settled the spool (`SpoolLock.suspect`).
            self.index.on_foreign = self._suspect_copies
            self.store.on_unretired = self._suspect_copies
        self.fence_file = FenceFile(self.root, self.store, durable=self.durable,
                                    mode=file_mode(self.access), read_only=options.read_only)
        self.fence_rebuilt = False
        self.fence = FenceCounter(self.lock, self.fence_file.read, self.fence_file.write,
                                  self.fence_file.ident, self._leased_top)
        self._group = GroupFlush(self.root, self.lock, fsync_dir)
        self._tls = threading.local()
        if options.read_only:
            return
        try:  # an OSError here is one line naming the spool and what to do, like any write
            self._ensure_fence(layout)
            if layout.created:
                # Last: an opener that finds spool.json skips the creation lock
                # (`open_layout`), so it must find the fence there too.
                layout.save_settings(settings)
        except OSError as exc:
            raise write_failed(exc, self.root) from None
        self._live_key = liveness.retain(self.root)
        self._live_pid = current_pid()

    def _ensure_fence(self, layout: Layout) -> None:
        """Write the fence file when it is missing (a new spool, or deleted by hand)."""
        if not (self.root / FENCE_FILE).exists():
            with self.lock.hold():  # re-check under the lock: never reset a live counter
                if not (self.root / FENCE_FILE).exists():
                    # Deleted by hand? This boot's shared counter still knows the
                    # ceiling (0 for a new spool): never write the floor back as 0.
                    known = max(self.lock.generation(self.lock.FENCE_CEILING_SLOT),
                                self.lock.generation(self.lock.FENCE_NEXT_SLOT))
                    if not layout.created:
                        known = max(known, self.fence_file.lost())
                    write_atomic(self.root / FENCE_FILE, encode_fence(known),
                                 durable=self.durable, mode=file_mode(self.access))
                    # For `recover`'s report: the opening it runs in rebuilt the file
                    # first, and a report of nothing done hid a fencing restart.
                    self.fence_rebuilt = not layout.created

    # ------------------------------------------------------------ plumbing

    def check_writable(self, action: str) -> None:
        """Raise `SpoolError` naming the cause when this spool was opened `read_only`."""
        if self.read_only:
            raise SpoolError(f"cannot {action}: spool {self.root} is open read-only "
                             "(open it with read_only=False, as a user who may write it)",
                             path=str(self.root))

    def close(self) -> None:
        self._group.close(holding_spool_lock=self.lock.held)
        self.lock.close()
        key, self._live_key = self._live_key, None
        if key is not None and self._live_pid == current_pid():
            # A forked child closing its parent's spool: that count is the parent's.
            liveness.release(key)

    def __repr__(self) -> str:
        return f"Journal({str(self.root)!r})"

    def now(self) -> float:
        return float(self.clock())

    def commit_changes(self, pairs: Sequence[tuple[Job | None, Job | None]],
                extra: Sequence[Change] = (), *, staged: dict[str, str] | None = None,
                encoded: dict[str, bytes] | None = None, group: bool = False) -> None:
        """Persist a batch of (old, new) snapshots as one store batch (call under the lock).

        Encoding happens first, so a job that is too large or not serializable
        raises before any file is touched. A Ctrl-C or SIGTERM arrives after the
        batch, not inside it (`interrupts.py`).
        """
        with interrupts.deferred():
            self._commit_changes(pairs, extra, staged=staged, encoded=encoded, group=group)

    def commit_in_parts(self, pairs: list[tuple[Job | None, Job | None]],
                         encoded: dict[str, bytes]) -> tuple[set[str], WriteFailed | None]:
        """Commit `pairs`; on a full disk, in smaller parts (a batch writes every new file
        before it retires an old one: a disk with room for a few refused all of a batch
        of 50, for ever). What settled, and the error the rest got."""
        try:
            self.commit_changes(pairs, encoded=encoded)
            return {new.id for _, new in pairs if new is not None}, None
        except WriteFailed as exc:
            if not (exc.errno in FULL_DISK and len(pairs) > 1 and not exc.landed):
                return set(exc.landed), exc
        settled: set[str] = set()
        step = max(1, len(pairs) // 4)
        for start in range(0, len(pairs), step):
            done, failed = self.commit_in_parts(pairs[start:start + step], encoded)
            settled |= done
            if failed is not None:
                return settled, failed
        return settled, None

    def _commit_changes(self, pairs: Sequence[tuple[Job | None, Job | None]],
                        extra: Sequence[Change], *, staged: dict[str, str] | None,
                        encoded: dict[str, bytes] | None, group: bool) -> None:
        self.check_writable("write")
        # Root files (the fence) go first: see `claim`.
        changes: list[Change] = [ch for ch in extra if ch.dst == ""]
        touched: set[JobState] = set()
        for old, new in pairs:
            name = (new or old).id + JOB_SUFFIX  # type: ignore[union-attr]
            path = staged.get(new.id) if staged and new is not None and old is None else None
            if path is not None and new is not None:
                # Written (and size-checked) by `prestage`; the bytes, when the caller has
                # them, only rewrite a staging file that vanished (`Store.apply`).
                data: bytes | None = encoded.get(new.id, b"") if encoded else b""
            elif new is None:
                data = None
            elif encoded is not None and new.id in encoded:
                data = encoded[new.id]  # the caller encoded (and size-checked) it already
            else:
                data = self.encode_internal(new)
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
        current = {s for s in touched if self.index.tracked(s) and self.index.is_current(s)}
        # Pure inserts may share their directory flush with concurrent producers, unless
        # this thread keeps the spool lock past this write (an enqueue in a fenced block or
        # a schedule's tick): the shared flush is awaited under the flush lock, whose
        # leader takes the spool lock, so waiting for it while holding the spool lock
        # deadlocked every process of the spool (soak probe). Those flush here instead.
        deferred = group and self.durable and not self.lock.nested \
            and all(ch.src is None for ch in changes) \
            and all(ch.dst in _GROUP_DIRS for ch in changes)
        self.lock.begin_write()
        try:
            self.store.apply(changes, flush_dirs=not deferred)
        except BaseException as exc:
            self.lock.end_write(clean=False)
            for s in touched:
                self.lock.bump(SLOT[s])
            self.index.invalidate()
            if isinstance(exc, OSError):
                # The outcome is unknown per job: say which new versions are on disk, so
                # the caller adopts those (a claim keeps their leases, a settle counts
                # them done) instead of believing nothing happened.
                landed = self._landed(pairs)
                if not isinstance(exc, Unflushed):
                    # Only once the new versions' directories are flushed may an old copy go
                    # (store.py, step 3); else both stay, for recovery to settle by revision.
                    self._retire_superseded(pairs, landed)
                raise write_failed(exc, self.root, landed) from None
            raise
        self.lock.end_write(clean=True)
        for s in touched:
            g = self.lock.bump(SLOT[s])
            if s is JobState.READY:
                self._log_ready(g, pairs, extra)
            if s in current:
                self.index.mark_current(s, g)
        if deferred and changes:
            self._tls.pending = max(getattr(self._tls, "pending", 0),
                                    self._group.publish(SLOT[s] for s in touched))
            # Visible already: if the shared flush fails, these are what landed.
            self._tls.published = getattr(self._tls, "published", frozenset()) | {
                new.id for _old, new in pairs if new is not None}
        terminal = 0
        for old, new in pairs:
            if old is not None:
                self.index.forget(old.state, old.id)
            if new is not None and new.state in CLAIMABLE:
                self.index.learn(new)
            if new is not None and new.state in TERMINAL:
                terminal += 1
        if terminal:
            slot = self.lock.TERMINAL_SLOT
            self.lock.put(slot, self.lock.generation(slot) + terminal)

    def _suspect_copies(self) -> None:
        self.lock.bump(self.lock.SUSPECT_SLOT)

    def await_group_flush(self) -> None:
        """Wait (without the lock) for the group flush covering this thread's deferred
        publications, if any (groupflush.py)."""
        number = getattr(self._tls, "pending", 0)
        if not number:
            return
        published: frozenset[str] = getattr(self._tls, "published", frozenset())
        self._tls.pending, self._tls.published = 0, frozenset()
        try:
            self._group.wait(number, _GROUP_SLOTS)
        except OSError as exc:
            # Renamed into place before the flush: readers (and workers) see these jobs
            # already, and a power loss is all that could take them back. Saying nothing
            # landed made callers retry, and a generated id retried is a second job.
            raise write_failed(exc, self.root, published) from None
        except SpoolError as exc:  # the spool lock the leader reads under, refused
            raise published_anyway(exc, published) from None

    def _landed(self, pairs: Sequence[tuple[Job | None, Job | None]]) -> frozenset[str]:
        """Ids whose new version is on disk, re-read after a failed write."""
        out = set()
        for old, new in pairs:
            if new is None:
                continue
            name = new.id + JOB_SUFFIX
            try:
                data = self.store.read(new.state.value, name)
            except FileNotFoundError:
                continue
            except OSError:
                # Could not look (out of file descriptors, as the write may have been): a
                # file seen in a state it moved into is its new version. Said "not landed",
                # the caller settled the old copy again: two copies of one revision. Seen,
                # not merely "could not look": a directory the worker may not search
                # (EACCES, as the failed rename was) counted as there, the old copy was
                # removed, and the job was gone from every directory.
                if (old is None or old.state is not new.state) and \
                        self.store.surely_present(new.state.value, name):
                    out.add(new.id)
                continue
            try:
                found = decode_job(data, expect_id=new.id, expect_state=new.state)
            except CorruptJob:
                continue
            if found.revision == new.revision:
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

    def encode_internal(self, job: Job) -> bytes:
        """Encode the result of a transition the spool itself makes (claim, heartbeat, fail,
        release, cancel, requeue, reclaim, replay): never refused for its size.

        Admission (`encode_admitted`) kept room for what these add and `fitted_anyway`
        cuts errors and tracebacks to the room left, so the file fits `max_job_bytes`.
        Only a job admitted under an older, looser rule can still be over: it is written
        anyway (logged), because refusing would wedge it — and every batch it is in.
        """
        return self.fit_internal(job)[1]

    def fit_internal(self, job: Job) -> tuple[Job, bytes]:
        """`encode_internal`, and the job as written (its texts cut to fit): a caller that
        returns the job returns that one, not the uncut one `get` would not show."""
        return fitted_anyway(job, max_bytes=self.max_job_bytes)

    @property
    def admission_bytes(self) -> int:
        """The largest serialized size a new job may have (see `job.admission_limit`)."""
        return admission_limit(self.max_job_bytes)

    def _log_ready(self, generation: int, pairs: Sequence[tuple[Job | None, Job | None]],
                   extra: Sequence[Change]) -> None:
        """Tell other processes' claim indexes what this batch did to `ready/` (changelog.py)."""
        ready = JobState.READY
        # A rewrite in place that changes the claim key (a replace: kind, priority, time)
        # counts as added: the other processes' indexes re-read its key.
        added = [new.id for old, new in pairs
                 if new is not None and new.state is ready
                 and (old is None or old.state is not ready
                      or (old.priority, old.run_at, old.kind) != (new.priority, new.run_at,
                                                                  new.kind))]
        removed = [old.id for old, new in pairs
                   if old is not None and old.state is ready and (new is None or new.state is not ready)]
        removed += [ch.name[: -len(JOB_SUFFIX)] for ch in extra
                    if ch.src == ready.value and ch.dst is None]
        self.lock.ring.record(generation, added, removed)

    def touch(self, states: Iterable[JobState]) -> None:
        """Tell every process's claim index that these directories changed outside `_commit`
        (recovery's quarantine moves, pruning); call under the lock."""
        self.check_writable("write")
        for s in states:
            self.lock.bump(SLOT[s])
        self.index.invalidate()

    def stale_removals(self, job_id: str, stale: Iterable[JobState]) -> list[Change]:
        return [Change(name=job_id + JOB_SUFFIX, dst=None, data=None, src=s.value) for s in stale]

    def _leased_top(self) -> int:
        """The largest lease token in `leased/` (0 if none can be read): read once per
        process (`FenceCounter`)."""
        try:
            return max((j.lease.token for j in self.leased_jobs() if j.lease is not None),
                       default=0)
        except (OSError, JobspoolError):
            return 0  # not even listed (out of descriptors): the shared counter stands

    def fence_value(self) -> int:
        """The last token handed out (under the lock; a reader without write access gets
        the ceiling on disk, which is at or above it)."""
        with self.lock.hold():
            return self.fence.last()

    def fence_above(self, token: int, ceiling: int) -> bool:
        """Keep every later token above `token`, one that reached the disk from outside the
        counter (a file put back by hand, another spool's): the ceiling on disk (read as
        `ceiling`) is raised to it when below, and the shared counter when behind it.
        Returns whether the ceiling was rewritten. Call under the lock."""
        wrote = ceiling < token
        if wrote:
            self.commit_changes([], [Change(name=FENCE_FILE, dst="", data=encode_fence(token))])
        if token > self.fence_value():
            self.fence.raised(token)
        return wrote

    def keep_tokens_above(self, token: int) -> bool:
        """Hand out no token at or below `token` from now on (one seen outside the counter:
        a projection row written before an older backup was restored). Whether the fence
        moved."""
        with self.lock.hold():
            if token <= self.fence_value():
                return False
            try:
                ceiling = self.fence_file.read()
            except SpoolError:  # unreadable: rewritten with the token
                ceiling = 0
            self.fence_above(token, ceiling)
            return True

    def maybe_autoprune(self) -> None:
        """Amortized retention: prune once per `max(64, keep_terminal // 4)` terminal writes.

        The count is the spool's, kept in the lock's shared memory by every process, not
        this process's: short-lived processes (a `run-until-idle` in a cron job settling
        a few jobs each time) would otherwise never reach it, and a restarted worker
        would let the terminal directories grow by a whole interval more before its
        first prune (on the file pool, those files are new inodes). It is a hint: lost
        with a deleted `.lock`, it only delays one prune.
        """
        slot = self.lock.TERMINAL_SLOT
        if self.lock.generation(slot) < max(64, self.keep_terminal // 4) \
                or self.autoprune is None:
            return
        with self.lock.hold():
            if self.lock.generation(slot) < max(64, self.keep_terminal // 4):
                return  # another process is pruning or just did
            self.lock.put(slot, 0)
        try:
            self.autoprune()
        except (OSError, JobspoolError) as exc:
            log.warning("automatic pruning failed (will retry later): %s", exc)
