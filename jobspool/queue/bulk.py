"""Operator actions on many jobs at once: cancel or requeue by kind, state and age.

What they guarantee: every job is re-read under the spool lock before it
moves (a job a worker finished meanwhile is left alone), and the moves are
committed in chunks of `CHUNK` jobs, one lock hold each, so a bulk action
on a large spool never stops workers for long. A chunk is atomic the way a
batch of `_commit` is; the action as a whole is not: a crash midway leaves
the jobs of the chunks already committed moved, the rest untouched, and
running the same command again finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobspool.errors import InvalidJob, InvalidTransition
from jobspool.queue import interrupts, machine
from jobspool.queue.arguments import job_states, listed
from jobspool.queue.job import Job, validate_job_id, validate_kind, validate_seconds
from jobspool.queue.states import CANCELABLE, REQUEUEABLE, JobState, check_source

if TYPE_CHECKING:
    from jobspool.queue.journal import Journal

CHUNK = 500


@dataclass(frozen=True, slots=True)
class Match:
    """Which jobs a bulk action takes: any of `states`, of `kind` (any when None), last
    changed more than `older_than` seconds ago (any age when None) and at or before the
    epoch time `changed_until` (a listing an operator confirmed: none since, when set)."""

    states: tuple[JobState, ...]
    kind: str | None = None
    older_than: float | None = None
    changed_until: float | None = None

    def __call__(self, job: Job, now: float) -> bool:
        if self.kind is not None and job.kind != self.kind:
            return False
        if self.changed_until is not None and job.updated_at > self.changed_until:
            return False
        return self.older_than is None or now - job.updated_at > self.older_than


def _states(action: str, given: Iterable[JobState | str] | JobState | str | None,
            allowed: frozenset[JobState], default: tuple[JobState, ...]) -> tuple[JobState, ...]:
    if given is None:
        return default
    items = [given] if isinstance(given, str) else listed("states", given, "job states")
    out: list[JobState] = []
    for item in items:
        try:
            state = JobState(item)
        except ValueError:
            raise InvalidJob(f"{item!r} is not a job state", field="states") from None
        if state not in allowed:
            names = ", ".join(sorted(s.value for s in allowed))
            raise InvalidJob(f"cannot {action} jobs in state {state.value!r} (only {names})",
                             field="states")
        out.append(state)
    return tuple(dict.fromkeys(out))


def match(action: str, *, kind: str | None, states: Iterable[JobState | str] | str | None,
          older_than: float | None, changed_until: float | None = None) -> Match:
    """Validate a bulk action's filters (`InvalidJob` naming the bad one)."""
    if kind is not None:
        validate_kind(kind)
    if older_than is not None:
        older_than = validate_seconds("older_than", older_than)
    if changed_until is not None:
        changed_until = validate_seconds("changed_until", changed_until)
    if action == "cancel":
        chosen = _states(action, states, CANCELABLE,
                         tuple(s for s in JobState if s in CANCELABLE))
    else:
        chosen = _states(action, states, REQUEUEABLE, (JobState.DEAD_LETTER,))
    return Match(chosen, kind, older_than, changed_until)


def apply_matching(spool: Journal, action: str, which: Match,
                   decide: Callable[..., Job]) -> list[Job]:
    """Move every job `which` selects with `decide` (machine.cancel / machine.requeue).

    Each listed id is re-read under the lock where it is *now*: a job that moved between
    the listing and its chunk (a retry cycling ready -> leased -> retryable) was skipped,
    and went on running after a "cancel every job of this kind". A second listing takes
    the ones that moved into an already-listed state meanwhile. A crash's stale copy is
    never the one moved (it was, and a requeue counted a completed job as requeued).
    """
    moved: list[Job] = []
    try:
        _apply_chunks(spool, which, decide, moved)
    except KeyboardInterrupt as exc:
        # What stands is said: an interrupted `cancel --kind` said nothing of the 11,500
        # jobs its first 23 chunks had moved.
        exc.moved = moved  # type: ignore[attr-defined]
        raise
    return moved


def _apply_chunks(spool: Journal, which: Match, decide: Callable[..., Job],
                  moved: list[Job]) -> None:
    seen: set[str] = set()
    for _ in range(LISTING_PASSES):
        listed: dict[str, JobState] = {}
        for state in which.states:
            for job_id in spool.store.names(state.value):
                if job_id not in seen:
                    listed.setdefault(job_id, state)
        if not listed:
            break
        seen.update(listed)
        ids = sorted(listed)
        for start in range(0, len(ids), CHUNK):
            # Signals wait for the chunk's end (the lock is taken first: a Ctrl-C while
            # waiting for it gives up at once): a chunk is counted exactly when it landed.
            with spool.lock.hold(), interrupts.deferred():
                now = spool.now()
                suspect = spool.lock.suspect()
                pairs: list[tuple[Job | None, Job | None]] = []
                extra = []
                for job_id in ids[start:start + CHUNK]:
                    job, stale = _current(spool, job_id, listed[job_id], suspect=bool(suspect))
                    if job is not None and job.state in which.states and which(job, now):
                        pairs.append((job, decide(job, now=now)))
                        extra.extend(spool.stale_removals(job_id, stale))
                if pairs:
                    spool.commit_changes(pairs, extra)
                moved.extend(new for _, new in pairs if new is not None)


# Listings of the chosen states: the first, and one for jobs that moved during it (both
# stores' bulk moves).
LISTING_PASSES = 2


def _current(spool: Journal, job_id: str, listed_in: JobState, *,
             suspect: bool) -> tuple[Job | None, list[JobState]]:
    """The job's current copy (and stale ones) under the lock: one read where it was listed
    while the spool holds no crash leftovers, else every state looked at (`locate`)."""
    if not suspect:
        job = spool.read_job(listed_in, job_id)
        if job is not None:
            return job, []
    return spool.locate(job_id)


def cancel_matching(spool: Journal, *, kind: str | None = None,
                    states: Iterable[JobState | str] | str | None = None,
                    older_than: float | None = None) -> list[Job]:
    """Cancel every unfinished job matching the filters (all cancelable states by default)."""
    which = match("cancel", kind=kind, states=states, older_than=older_than)
    spool.check_writable("cancel")
    return apply_matching(spool, "cancel", which, machine.cancel)


def requeue_matching(spool: Journal, *, kind: str | None = None,
                     states: Iterable[JobState | str] | str | None = None,
                     older_than: float | None = None,
                     changed_until: float | None = None) -> list[Job]:
    """Requeue every job matching the filters (dead letters by default; canceled on request)."""
    which = match("requeue", kind=kind, states=states, older_than=older_than,
                  changed_until=changed_until)
    spool.check_writable("requeue")
    return apply_matching(spool, "requeue", which, machine.requeue)


__all__ = ["CHUNK", "Match", "apply_matching", "cancel_matching", "match", "requeue_matching"]


def move_one(spool: Journal, job_id: str, action: str, decide: Callable[..., Job]) -> Job:
    """Move one job by id (an operator's `cancel` or `requeue`), clearing any crash
    leftover of it."""
    validate_job_id(job_id)
    with spool.lock.hold():
        job, stale = spool.locate(job_id)
        if job is None:
            raise spool.missing(job_id)
        check_source(job_id, action, job.state)
        new = decide(job, now=spool.now())
        spool.commit_changes([(job, new)], spool.stale_removals(job_id, stale))
        return new


def requeue_all(spool: Journal, state: JobState | str) -> list[Job]:
    """Requeue every job in `state`, in chunks of `CHUNK` (one lock hold for 20,000 dead
    letters stalled every producer and worker for the 7 s it took)."""
    return apply_matching(spool, "requeue", Match((requeue_source(state),)), machine.requeue)


def requeue_source(state: JobState | str) -> JobState:
    """The state `requeue_all` empties: `InvalidJob` naming a value that is no state (a
    bare ValueError before), `InvalidTransition` naming the states it takes (it named a
    job '*' before)."""
    if state is None:
        raise InvalidJob("requeue_all needs a state: dead_letter, canceled or completed",
                         field="state")
    (src,) = job_states(state)
    if src not in REQUEUEABLE:
        raise InvalidTransition("*", src.value, "requeue",
                                f"cannot requeue the jobs in state {src.value!r}: requeue "
                                "takes dead_letter, canceled or completed jobs")
    return src
