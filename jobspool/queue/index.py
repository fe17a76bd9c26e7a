"""The claim index: a per-process cache of which jobs a claim could take, in claim order.

Why it exists: a claim must take due jobs in (priority, run_at, id) order,
and the priority of a job is inside its file. Reading every file of
`ready/` for every claim would make a claim cost O(jobs queued). Instead
each process keeps, per state directory it claims from, the sort key of
every job it has seen there, and relists a directory only when that
directory's generation counter (bumped by every writer, see `lock.py`)
moved. A listing reads only the files it has not seen before. So a claim
costs O(batch) file reads plus at most one listing of each changed
directory, whatever the depth of the queue.

What it guarantees: it is only ever consulted under the spool lock, and the
spool re-reads every candidate file before acting on it, so a stale entry
can cost a wasted read or a slightly different order among equals, never a
wrong claim. A job that left a directory and came back between two of our
listings keeps its old sort key in `ready/` (order only); in `retryable/`
the inode number is part of the key, so a rewritten file is read again.

Changes made behind the spool's back (a job file copied into `ready/` by
hand, restored from a backup or from quarantine) bump no generation. So at
most once per `check_seconds` (stretched to keep relisting under ~2 % of
the time on a huge directory) a refresh also stats each directory and
relists it when its mtime/ctime/size moved since the stamp taken before the
last listing, when that stamp was *racy* (taken within a filesystem
timestamp tick of the directory's last change, so a later change in the
same tick would look identical), or when the last listing met a file it
could not read (a copy still being written). Any change through the spool
also moves the directory's mtime, so a busy directory is relisted at that
rate: that, not correctness, is what the stretching bounds.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson

from jobspool.queue.backlog import Waiting, tally
from jobspool.queue.changelog import ADD, ChangeRing
from jobspool.queue.job import KIND_RE, CorruptJob, Job, decode_job
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.store import JOB_SUFFIX, Store
from jobspool.queue.unreadable import report_unreadable

log = logging.getLogger(__name__)

SLOT = {state: i for i, state in enumerate(ALL_STATES)}


@dataclass(frozen=True, slots=True)
class Candidate:
    """A job a claim may take: where it is and its sort key."""

    priority: int
    run_at: float
    job_id: str
    state: JobState
    kind: str

    @property
    def order(self) -> tuple[int, float, str]:
        return (self.priority, self.run_at, self.job_id)


_Key = tuple[int, float, str]  # (priority, run_at, kind)
_Stamp = tuple[int, int, int, bool]  # directory (mtime_ns, ctime_ns, size, racy)

# How often a refresh looks for changes made behind the spool's back, at least.
CHECK_SECONDS = 1.0
# Filesystem timestamps come from a coarse clock (one tick: 1-10 ms on Linux); a change
# this close to a stamp may share its timestamp with a later one.
_RACY_NS = 50_000_000
# Relisting because of a moved stamp may take at most 1/_RELIST_SHARE of the time.
_RELIST_SHARE = 50
# Heap entries are dropped lazily, by the claims of their own kind: a kind this process
# never claims (a producer's, another service's) left one per job for ever (a soak probe:
# ~0.3-0.9 MB per 1,000 jobs). Heaps are rebuilt from the live entries once the pushes
# since the last rebuild pass twice those, plus this slack: amortized O(1) per push.
_COMPACT_SLACK = 1024


class ClaimIndex:
    """Cached claim candidates of `ready/`, `retryable/` and `leased/` for one process."""

    def __init__(self, store: Store, generation: Callable[[int], int],
                 ring: ChangeRing | None = None) -> None:
        self._store = store
        self._generation = generation
        self._ring = ring
        # Called (under the lock) when a job file appeared behind the spool's back: it may
        # be a stale copy of a job that moved on, so claims should check for newer copies.
        self.on_foreign: Callable[[], None] | None = None
        self._gen: dict[JobState, int | None] = {
            JobState.READY: None, JobState.RETRYABLE: None, JobState.LEASED: None}
        # ready: id -> (priority, run_at, kind); heaps per kind of (priority, run_at, id)
        self._ready: dict[str, _Key] = {}
        self._ready_heaps: dict[str, list[tuple[int, float, str]]] = {}
        # retryable: id -> ((priority, run_at, kind), inode); waiting heap by run_at per kind,
        # and a due heap by claim order per kind once run_at has passed
        self._retry: dict[str, tuple[_Key, int]] = {}
        self._retry_wait: dict[str, list[tuple[float, int, str]]] = {}
        self._retry_due: dict[str, list[tuple[int, float, str]]] = {}
        self._ready_pushes = 0  # heap pushes since the last rebuild (`_compact_ready`)
        self._retry_pushes = 0
        # leased: id -> (expires_at, kind, priority); expiries only grow, so a cached value
        # is a lower bound and "not expired" from the cache is always true
        self._leased: dict[str, tuple[float, str, int, float]] = {}
        self._bad: set[tuple[str, str]] = set()
        # Ids first met in a directory listing, not through a writer of this spool (its
        # ring entry, or our own write): such a file may have been put there by a hand, an
        # old backup of a job that has moved on since, so a claim checks it (`listed`).
        self._listed: set[str] = set()
        # Directory stamps for changes made behind the spool's back (see the module docstring).
        self.check_seconds = CHECK_SECONDS
        self._next_check = time.monotonic() + self.check_seconds
        self._stamp: dict[JobState, _Stamp | None] = dict.fromkeys(self._gen)
        self._dirty: dict[JobState, bool] = dict.fromkeys(self._gen, False)

    # ------------------------------------------------------------ freshness

    def tracked(self, state: JobState) -> bool:
        return state in self._gen

    def is_current(self, state: JobState) -> bool:
        g = self._gen.get(state)
        return g is not None and g == self._generation(SLOT[state])

    def mark_current(self, state: JobState, generation: int) -> None:
        if state in self._gen:
            self._gen[state] = generation

    def invalidate(self) -> None:
        for state in self._gen:
            self._gen[state] = None

    def refresh(self, *, look: bool = False) -> None:
        """Relist every directory whose generation moved, and (at most once per
        `check_seconds`, or now with `look`) every directory changed behind the spool's
        back (under the lock)."""
        started = time.monotonic()
        check = look or started >= self._next_check
        relisted = False
        for state in (JobState.READY, JobState.RETRYABLE, JobState.LEASED):
            g = self._generation(SLOT[state])
            seen = self._gen[state]
            fresh = False
            if seen != g and not (state is JobState.READY and seen is not None
                                  and self._replay(seen, g)):
                self._relist(state)
                fresh = relisted = True
            if check and not fresh and self._moved(state):
                before = self._known(state)
                self._relist(state)
                relisted = True
                if self._known(state) - before and self.on_foreign is not None:
                    self.on_foreign()
            self._gen[state] = g
        if check:
            spent = time.monotonic() - started if relisted else 0.0
            self._next_check = time.monotonic() + max(self.check_seconds, spent * _RELIST_SHARE)

    def _known(self, state: JobState) -> set[str]:
        if state is JobState.READY:
            return set(self._ready)
        if state is JobState.RETRYABLE:
            return set(self._retry)
        return set(self._leased)

    def _dir_stamp(self, state: JobState) -> _Stamp | None:
        try:
            st = os.stat(self._store.root / state.value)
        except OSError:
            return None
        racy = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, racy)

    def _moved(self, state: JobState) -> bool:
        """Whether `state`'s directory may hold changes the last listing did not see."""
        stamp = self._stamp.get(state)
        if stamp is None or stamp[3] or self._dirty.get(state, False):
            return True
        now = self._dir_stamp(state)
        return now is None or now[:3] != stamp[:3]

    def _replay(self, seen: int, now: int) -> bool:
        """Apply other processes' logged changes to `ready/` instead of relisting it."""
        changes = None if self._ring is None else self._ring.since(seen, now)
        if changes is None:
            return False
        for op, job_id in changes:
            self._listed.discard(job_id)  # a writer of this spool put it there (or took it)
            if op == ADD:
                key = self._peek_key(JobState.READY, job_id)
                if key is not None:
                    self._ready[job_id] = key
                    self._push_ready(key[2], (key[0], key[1], job_id))
            else:
                self._ready.pop(job_id, None)
        return True

    def _read(self, state: JobState, job_id: str) -> Job | None:
        try:
            data = self._store.read(state.value, job_id + JOB_SUFFIX)
            return decode_job(data, expect_id=job_id, expect_state=state)
        except FileNotFoundError:
            return None
        except (CorruptJob, OSError) as exc:
            if (state.value, job_id) not in self._bad:
                self._bad.add((state.value, job_id))
                reason = exc.reason if isinstance(exc, CorruptJob) else (exc.strerror or str(exc))
                report_unreadable(state.value, job_id, reason)
            return None

    def note_unreadable(self, state: JobState, job_id: str) -> None:
        """A claim found this file unreadable: it is no job waiting (`waiting`)."""
        self._bad.add((state.value, job_id))

    def _peek_key(self, state: JobState, job_id: str) -> tuple[int, float, str] | None:
        """(priority, run_at, kind) of a job file without the full decode (the listing's hot
        path: a fresh process meets the whole backlog here once). Anything unusual falls back
        to `decode_job`, which reports it; the candidate is fully decoded before a claim."""
        try:
            data = self._store.read(state.value, job_id + JOB_SUFFIX)
            d = orjson.loads(data)
            priority, run_at, kind = d["priority"], d["run_at"], d["kind"]
            if (type(priority) is int and type(run_at) in (int, float) and type(kind) is str
                    and d["state"] == state.value and d["id"] == job_id
                    and KIND_RE.fullmatch(kind) is not None):
                return (priority, float(run_at), kind)
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            pass
        job = self._read(state, job_id)
        return None if job is None else (job.priority, job.run_at, job.kind)

    def _relist(self, state: JobState) -> None:
        # Stamp before listing: a change landing in between is listed now and, having
        # moved the directory past the stamp, relisted once more later (harmless).
        self._stamp[state] = self._dir_stamp(state)
        missed = False
        if state is JobState.READY:
            names = set(self._store.names(state.value))
            for gone in self._ready.keys() - names:
                del self._ready[gone]
                self._listed.discard(gone)
            heaps = self._ready_heaps
            for job_id in names - self._ready.keys():
                key = self._peek_key(state, job_id)
                if key is not None:
                    self._ready[job_id] = key
                    self._listed.add(job_id)
                    heaps.setdefault(key[2], []).append((key[0], key[1], job_id))
                    self._ready_pushes += 1
                else:
                    missed = True
            for heap in heaps.values():
                heapq.heapify(heap)
            self._compact_ready()
        elif state is JobState.RETRYABLE:
            listing = dict(self._store.scan(state.value))
            for gone in [k for k, (_, ino) in self._retry.items() if listing.get(k) != ino]:
                del self._retry[gone]
                self._listed.discard(gone)
            for job_id in listing.keys() - self._retry.keys():
                job = self._read(state, job_id)
                if job is not None:
                    self._learn(job, inode=listing[job_id])
                    self._listed.add(job_id)
                else:
                    missed = True
        else:
            names = set(self._store.names(state.value))
            for gone in self._leased.keys() - names:
                del self._leased[gone]
                self._listed.discard(gone)
            for job_id in names - self._leased.keys():
                job = self._read(state, job_id)
                if job is not None:
                    self._learn(job)
                    self._listed.add(job_id)
                else:
                    missed = True
        # A file that could not be read may be a copy still being written: its completion
        # will not move the directory, so look again at the next check.
        self._dirty[state] = missed

    # ------------------------------------------------------------ updates

    def learn(self, job: Job, *, inode: int = -1) -> None:
        """Record a job now sitting in one of the claimable directories (written there by
        this spool: no longer `listed`). Only while the index is current for its directory:
        behind (other writers moved it since our last look) or never listed, its next
        refresh reads the job anyway (the ring's entry, or a listing), and a process that
        never claims (a producer) kept every job it wrote, for ever (a soak probe)."""
        self._listed.discard(job.id)
        if self.is_current(job.state):
            self._learn(job, inode)

    def _learn(self, job: Job, inode: int = -1) -> None:
        if job.state is JobState.READY:
            self._ready[job.id] = (job.priority, job.run_at, job.kind)
            self._push_ready(job.kind, (job.priority, job.run_at, job.id))
        elif job.state is JobState.RETRYABLE:
            if inode == -1:
                inode = self._inode(JobState.RETRYABLE, job.id)
            self._retry[job.id] = ((job.priority, job.run_at, job.kind), inode)
            heapq.heappush(self._retry_wait.setdefault(job.kind, []),
                           (job.run_at, job.priority, job.id))
            self._retry_pushes += 1
            if self._retry_pushes > 2 * len(self._retry) + _COMPACT_SLACK:
                self._compact_retry()
        elif job.state is JobState.LEASED and job.lease is not None:
            self._leased[job.id] = (job.lease.expires_at, job.kind, job.priority, job.run_at)

    def _push_ready(self, kind: str, item: tuple[int, float, str]) -> None:
        heapq.heappush(self._ready_heaps.setdefault(kind, []), item)
        self._ready_pushes += 1
        self._compact_ready()

    def _compact_ready(self) -> None:
        """Rebuild the ready heaps from the live entries once due (see `_COMPACT_SLACK`)."""
        if self._ready_pushes <= 2 * len(self._ready) + _COMPACT_SLACK:
            return
        heaps: dict[str, list[tuple[int, float, str]]] = {}
        for job_id, (priority, run_at, kind) in self._ready.items():
            heaps.setdefault(kind, []).append((priority, run_at, job_id))
        for heap in heaps.values():
            heapq.heapify(heap)
        self._ready_heaps, self._ready_pushes = heaps, len(self._ready)

    def _compact_retry(self) -> None:
        """Rebuild the retryable heaps from the live entries: all waiting again, moved to
        due by the next `candidates` as their times have passed."""
        wait: dict[str, list[tuple[float, int, str]]] = {}
        for job_id, ((priority, run_at, kind), _) in self._retry.items():
            wait.setdefault(kind, []).append((run_at, priority, job_id))
        for heap in wait.values():
            heapq.heapify(heap)
        self._retry_wait, self._retry_due, self._retry_pushes = wait, {}, len(self._retry)

    def entries(self) -> int:
        """How many entries the index holds, heaps included (its memory, for tests)."""
        return (len(self._ready) + len(self._retry) + len(self._leased) + len(self._listed)
                + sum(map(len, self._ready_heaps.values()))
                + sum(map(len, self._retry_wait.values()))
                + sum(map(len, self._retry_due.values())))

    def listed(self, job_id: str) -> bool:
        """Whether the index met this job only in a directory listing (see `_listed`)."""
        return job_id in self._listed

    def forget(self, state: JobState, job_id: str) -> None:
        self._listed.discard(job_id)
        if state is JobState.READY:
            self._ready.pop(job_id, None)
        elif state is JobState.RETRYABLE:
            self._retry.pop(job_id, None)
        elif state is JobState.LEASED:
            self._leased.pop(job_id, None)

    def _inode(self, state: JobState, job_id: str) -> int:
        try:
            return self._store.path(state.value, job_id + JOB_SUFFIX).stat().st_ino
        except FileNotFoundError:
            return -1

    # ------------------------------------------------------------ queries

    def candidates(self, now: float, kinds: frozenset[str] | None, limit: int) -> list[Candidate]:
        """Up to `limit` due candidates in claim order (entries stay in the index)."""
        pool: list[Candidate] = []
        for kind, heap in self._ready_heaps.items():
            if kinds is None or kind in kinds:
                pool.extend(self._peek(heap, limit, JobState.READY, kind))
        for kind, wait in self._retry_wait.items():
            if kinds is not None and kind not in kinds:
                continue
            due = self._retry_due.setdefault(kind, [])
            while wait and wait[0][0] <= now:
                run_at, priority, job_id = heapq.heappop(wait)
                entry = self._retry.get(job_id)
                if entry is not None and entry[0][:2] == (priority, run_at):
                    heapq.heappush(due, (priority, run_at, job_id))
            pool.extend(self._peek(due, limit, JobState.RETRYABLE, kind, now=now, wait=wait))
        for job_id, (expires_at, kind, priority, run_at) in self._leased.items():
            if expires_at <= now and (kinds is None or kind in kinds):
                # Claim order is (priority, run_at, id) whatever the state (DESIGN §3).
                pool.append(Candidate(priority, run_at, job_id, JobState.LEASED, kind))
        pool.sort(key=lambda c: c.order)
        return pool[:limit]

    def _peek(self, heap: list[tuple[int, float, str]], limit: int, state: JobState,
              kind: str, *, now: float = math.inf,
              wait: list[tuple[float, int, str]] | None = None) -> Iterable[Candidate]:
        out: list[tuple[int, float, str]] = []
        seen: set[str] = set()
        while heap and len(out) < limit:
            item = heapq.heappop(heap)
            priority, run_at, job_id = item
            if job_id in seen:
                continue  # the same job learned twice with an equal key: one entry is enough
            if wait is not None and run_at > now:
                # Due once, not now: the clock stepped back (NTP, a resumed VM). Handed out
                # anyway, the claim found it not due, learned it again, and got it back from
                # here, for ever, holding the spool lock.
                heapq.heappush(wait, (run_at, priority, job_id))
                continue
            if state is JobState.READY:
                key = self._ready.get(job_id)
            else:
                entry = self._retry.get(job_id)
                key = entry[0] if entry is not None else None
            if key is not None and key[:2] == (priority, run_at) and key[2] == kind:
                seen.add(job_id)
                out.append(item)
        for item in out:
            heapq.heappush(heap, item)
        return [Candidate(p, r, j, state, kind) for p, r, j in out]

    def waiting(self, now: float) -> dict[str, Waiting]:
        """Cached ready and retryable jobs per kind: due now or later (`backlog.py`). A
        ready job counts as due, as a claim takes it."""
        # Not the files a claim found unreadable (`_bad`): `recover` quarantines them, and
        # a run reported each as a job "left behind, run again".
        ready, retry = JobState.READY.value, JobState.RETRYABLE.value
        entries = [(key[2], True, key[1]) for job_id, key in self._ready.items()
                   if (ready, job_id) not in self._bad]
        entries += [(key[2], key[1] <= now, key[1]) for job_id, (key, _) in self._retry.items()
                    if (retry, job_id) not in self._bad]
        return tally(entries)

    def next_due_at(self, now: float, kinds: frozenset[str] | None) -> float | None:
        """The earliest future time a cached retryable job or lease becomes claimable."""
        times = [key[1] for key, _ in self._retry.values()
                 if key[1] > now and (kinds is None or key[2] in kinds)]
        times += [exp for exp, kind, _, _ in self._leased.values()
                  if exp > now and (kinds is None or kind in kinds)]
        return min(times, default=None)
