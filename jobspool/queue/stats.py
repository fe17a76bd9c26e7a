"""`Spool.stats()`: counts per state and the few figures an operator watches."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import SpoolError
from jobspool.queue.backpressure import waiting_since
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.store import STAGE_SUFFIX

if TYPE_CHECKING:
    from jobspool.queue.job import Job
    from jobspool.queue.journal import Journal

# Reading every retryable file to find the due ones is O(retryable): past this many, an
# even sample of this many is read and its counts scaled (`Stats.retryable_sampled`).
_MAX_RETRYABLE_SCAN = 20_000
_READY_SAMPLE = 16
_READY_SPREAD = 256  # past _EXACT_COUNT, ready files read for the oldest wait, evenly spread
_EXACT_COUNT = 1_000  # states up to this many files are counted by reading them


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of a spool's counts (one listing per directory, taken under the lock)."""

    counts: dict[str, int]
    total: int
    due: int
    oldest_due_age: float | None
    fence: int
    quarantined: int
    temp_files: int
    now: float
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    # Of `retryable`, the delayed jobs never run yet (enqueued with delay/run_at): shown as
    # "scheduled", not as failed retries.
    scheduled: int = 0
    # How many retryable jobs were read when fewer than all (a file spool past 20,000):
    # `due` and `scheduled` then count the retryable ones by that even sample, scaled, and
    # `oldest_due_age` is the oldest among those read. None: every one was read.
    retryable_sampled: int | None = None

    def __getitem__(self, state: str) -> int:
        """`stats["ready"]`: the count of one state."""
        return self.counts[str(state)]

    @property
    def oldest_ready_age(self) -> float | None:
        """Seconds the oldest due job has waited (ready, or retryable past its run_at)."""
        return self.oldest_due_age

    @property
    def prepared(self) -> int:
        return self.counts["prepared"]

    @property
    def ready(self) -> int:
        return self.counts["ready"]

    @property
    def leased(self) -> int:
        return self.counts["leased"]

    @property
    def retryable(self) -> int:
        return self.counts["retryable"]

    @property
    def completed(self) -> int:
        return self.counts["completed"]

    @property
    def dead_letter(self) -> int:
        return self.counts["dead_letter"]

    @property
    def canceled(self) -> int:
        return self.counts["canceled"]

    def to_dict(self) -> dict[str, Any]:
        # Each state's count also at the top level, so `jq .ready` works as well as
        # `jq .counts.ready`.
        return {
            **self.counts,
            "counts": dict(self.counts), "total": self.total, "due": self.due,
            "oldest_due_age": self.oldest_due_age, "oldest_ready_age": self.oldest_due_age,
            "fence": self.fence, "scheduled": self.scheduled,
            "retryable_sampled": self.retryable_sampled,
            "quarantined": self.quarantined, "temp_files": self.temp_files, "now": self.now,
            "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
        }


def collect_stats(spool: Journal, *, by_kind: bool = False) -> Stats:
    store = spool.store
    with spool.lock.hold():
        now = spool.now()
        names = {s: store.names(s.value) for s in ALL_STATES}
        try:
            fence = spool.fence_value()
        except SpoolError:
            # A garbled fence file: stats still answers (health names the file, recover
            # rebuilds it), with the last token this boot's shared counter knows (0: none).
            # Refused whole, `health` and `stats --prometheus` said nothing else at all.
            fence = spool.fence.cached_last()
    names = spool.without_stale(names)
    read: dict[tuple[JobState, str], Job | None] = {}  # each file read once, at most
    for s, n in names.items():
        if len(n) <= _EXACT_COUNT:
            # DESIGN §2: an unreadable file is skipped (with a warning), not counted as a
            # job. Reading is the only way to know; past this size a state is counted by
            # its names (one listing, whatever the depth) and `fsck` finds such files.
            kept = []
            for i in n:
                job, unreadable = spool.examine(s, i)
                if not unreadable:
                    kept.append(i)
                    read[s, i] = job
            names[s] = kept

    def job_of(s: JobState, job_id: str) -> Job | None:
        return read[s, job_id] if (s, job_id) in read else spool.read_job(s, job_id)

    counts = {s.value: len(n) for s, n in names.items()}
    oldest: float | None = None
    due = counts[JobState.READY.value]
    for job_id in _oldest_candidates(names[JobState.READY]):
        job = job_of(JobState.READY, job_id)
        if job is not None:
            # Since it came due or arrived, whichever is later: a backfill with an old
            # `run_at` has waited no time (health called the queue not draining).
            age = max(0.0, now - waiting_since(job.run_at, job.updated_at))
            oldest = age if oldest is None else max(oldest, age)
    scheduled = due_retries = 0
    retryable = names[JobState.RETRYABLE]
    # Past the cap, an even sample (names are ids, ordered by creation): the figures were
    # left at 0 there, and `stats` and `health` said nothing was due among 50,000.
    sampled = retryable if len(retryable) <= _MAX_RETRYABLE_SCAN else \
        sorted(retryable)[::-(-len(retryable) // _MAX_RETRYABLE_SCAN)]
    for job_id in sampled:
        job = job_of(JobState.RETRYABLE, job_id)
        if job is not None and job.scheduled:
            scheduled += 1
        if job is not None and job.run_at <= now:
            due_retries += 1
            age = max(0.0, now - waiting_since(job.run_at, job.updated_at))
            oldest = age if oldest is None else max(oldest, age)
    if len(sampled) < len(retryable):
        scale = len(retryable) / len(sampled)
        scheduled, due_retries = round(scheduled * scale), round(due_retries * scale)
    due += due_retries
    kinds: dict[str, dict[str, int]] = {}
    if by_kind:
        for s in ALL_STATES:
            for job_id in names[s]:
                job = job_of(s, job_id)
                if job is not None:
                    per = kinds.setdefault(job.kind, {})
                    per[s.value] = per.get(s.value, 0) + 1
    return Stats(
        counts=counts, total=sum(counts.values()), due=due, oldest_due_age=oldest,
        fence=fence, quarantined=_count(spool.root / "quarantine", suffix=".json"),
        # Both kinds of staging file: a producer's (`.stage`) left by a crash counted none.
        temp_files=_count(spool.root / "tmp", suffix=(".tmp", STAGE_SUFFIX)), now=now,
        by_kind=kinds,
        scheduled=scheduled,
        retryable_sampled=len(sampled) if len(sampled) < len(retryable) else None)


def _oldest_candidates(ready: list[str]) -> list[str]:
    """The ready jobs read for the oldest wait: every one when they were all read for the
    count; past that, the oldest ids and an even spread. The oldest ids alone missed the
    real oldest wait once requeued jobs (old ids, a fresh wait) filled them: `health`
    missed a queue not draining after `requeue --all-dead`."""
    ordered = sorted(ready)
    if len(ordered) <= _EXACT_COUNT:
        return ordered
    return ordered[:_READY_SAMPLE] + ordered[::-(-len(ordered) // _READY_SPREAD)]


def _count(path: os.PathLike[str] | str, *, suffix: str | tuple[str, ...]) -> int:
    try:
        return sum(1 for n in os.listdir(path) if not n.endswith(".reason") and
                   not n.startswith(".") and (suffix == ".json" or n.endswith(suffix)))
    except FileNotFoundError:
        return 0
