"""Retention pruning of terminal jobs (`completed`, `dead_letter`, `canceled`).

Rules (DESIGN §3, issue 12): a terminal job is removed only when it is beyond
the newest `keep` of its state (by `updated_at`; ties: the larger id is
newer) AND its `updated_at` is more than `older_than` seconds in the past.
Either bound alone is the whole rule (`keep` alone: count only; `older_than`
alone: age only, `keep` 0). Without either, the spool's retention applies:
`keep_terminal` and `keep_terminal_seconds` (None: count only), so a result
stays readable for at least `keep_terminal_seconds` however busy the spool
is. Dead letters have their own limit (DESIGN §3): the spool's `keep_dead`
(default: at least 10,000), in an explicit prune too unless `keep_dead` is
given, because they are evidence an operator may still need. Removing a job
removes every readable file of it in every state directory, so a stale copy
left by a crash can never bring it back; an unreadable copy is left for
recovery to quarantine (never delete what could not be read).

Cost: one listing per terminal directory, then, only for a directory over
its limit (or when `older_than` is given), one lock-free read per file of it
to learn `updated_at`; removals are re-checked under the lock in batches
(one read plus six existence probes per removed job). Nothing here looks at
`ready/`, `leased/` and the other live directories beyond those probes.

`prune_if_over` is what `Spool` calls after every few dozen terminal writes:
three `os.listdir` calls and nothing else while every directory is within
its limit. When one is over, pruning it reads `keep + excess` files and
removes `excess`; since the spool calls it only every
`max(64, keep_terminal // 4)` terminal writes, the excess is at least that
large, which bounds the amortized cost at about five reads per terminal
write whatever `keep_terminal` is. With `keep_terminal_seconds`, jobs still
too young are kept past the count, so a directory may stay over its count
and be read again at each call: the price of a guaranteed reading window.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.queue.job import validate_int, validate_seconds
from jobspool.queue.layout import ADMIN_BATCH as BATCH
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.store import JOB_SUFFIX, Change
from jobspool.recovery.scan import Bad, Entry, Scan, entry_of, read_job, scan_state

if TYPE_CHECKING:
    from jobspool.queue.job import Job
    from jobspool.queue.journal import Journal

log = logging.getLogger(__name__)

TERMINAL_ORDER: tuple[JobState, ...] = (JobState.COMPLETED, JobState.DEAD_LETTER,
                                        JobState.CANCELED)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What one pruning pass removed: ids per terminal state, plus stale copies removed."""

    completed: tuple[str, ...] = ()
    dead_letter: tuple[str, ...] = ()
    canceled: tuple[str, ...] = ()
    stale_copies: tuple[str, ...] = ()  # `state/id.json` of older copies removed with their job
    kept: dict[str, int] = field(default_factory=dict)  # jobs left per examined state

    @property
    def pruned(self) -> tuple[str, ...]:
        """Every removed job id."""
        return (*self.completed, *self.dead_letter, *self.canceled)

    @property
    def counts(self) -> dict[str, int]:
        return {"completed": len(self.completed), "dead_letter": len(self.dead_letter),
                "canceled": len(self.canceled), "stale_copies": len(self.stale_copies)}

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON: the removed ids per state (counts are their lengths) and the total."""
        return {"completed": list(self.completed), "dead_letter": list(self.dead_letter),
                "canceled": list(self.canceled), "stale_copies": list(self.stale_copies),
                "pruned": len(self.pruned)}


def prune(spool: Journal, *, keep: int | None = None, older_than: float | None = None,
          keep_dead: int | None = None, states: tuple[JobState, ...] = TERMINAL_ORDER,
          scan: Scan | None = None, due: dict[JobState, float] | None = None) -> PruneReport:
    """Remove old terminal jobs of `states`; see the module docstring for the rules.

    `scan` lets recovery hand over the lock-free scan it already made (every
    removal is re-checked under the lock anyway). `due`, when given, gets per state
    beyond its count when its next job becomes old enough to go (`older_than`).
    """
    if keep is None and older_than is None:
        keep, older_than = spool.keep_terminal, spool.keep_terminal_seconds
    keep = 0 if keep is None else validate_int("keep", keep, minimum=0)
    # Dead letters keep their own limit unless one is given for them: `prune --keep 1000`
    # (or `--older-than`) is about finished work, and cut the evidence to 1000 with it.
    keep_dead = spool.keep_dead if keep_dead is None else validate_int("keep_dead", keep_dead,
                                                                       minimum=0)
    if older_than is not None:
        older_than = validate_seconds("older_than", older_than)
    removed: dict[JobState, list[str]] = {s: [] for s in TERMINAL_ORDER}
    stale_removed: list[str] = []
    kept: dict[str, int] = {}
    for state in states:
        if state not in removed:
            raise ValueError(f"{state.value} is not a terminal state")
        limit = keep_dead if state is JobState.DEAD_LETTER else keep
        # The cheap test first: a directory within its count costs one listing (a job
        # must be beyond the count to go, whatever its age).
        if scan is None and (n := len(spool.store.names(state.value))) <= limit:
            kept[state.value] = n
            continue
        entries = scan.in_state(state) if scan is not None else _scan(spool, state)
        now = spool.now()
        victims = _victims(entries, limit, older_than, now)
        if due is not None and older_than is not None:
            young = _victims(entries, limit, None, now)
            if len(young) > len(victims):  # beyond the count, too young to go yet
                due[state] = min(e.updated_at for e in young
                                 if e.updated_at >= now - older_than) + older_than
        for start in range(0, len(victims), BATCH):
            gone, stale = _remove(spool, victims[start:start + BATCH])
            removed[state].extend(gone)
            stale_removed.extend(stale)
        kept[state.value] = len(entries) - len(removed[state])
    # Ids in order (time-ordered ids: oldest first), as the PostgreSQL store reports them.
    report = PruneReport(completed=tuple(sorted(removed[JobState.COMPLETED])),
                         dead_letter=tuple(sorted(removed[JobState.DEAD_LETTER])),
                         canceled=tuple(sorted(removed[JobState.CANCELED])),
                         stale_copies=tuple(sorted(stale_removed)), kept=kept)
    if report.pruned:
        log.info("pruned %d terminal jobs (%s)", len(report.pruned), report.counts)
    return report


def prune_if_over(spool: Journal, due: dict[JobState, float] | None = None
                  ) -> PruneReport | None:
    """Prune only the terminal directories holding more than `keep_terminal` files.

    Three directory listings when nothing is over; None then. `due` (kept by the caller
    between calls) holds when each state's next job becomes old enough to go under
    `keep_terminal_seconds`: before that, a directory over its count is not read again.
    Read at every automatic prune, 50,000 completed jobs all younger than an hour made
    each settle slower than the one before (a scale probe).
    """
    now = spool.now()
    over = tuple(s for s in TERMINAL_ORDER if now >= (due or {}).get(s, -math.inf)
                 and len(os.listdir(spool.root / s.value)) > (
                     spool.keep_dead if s is JobState.DEAD_LETTER else spool.keep_terminal))
    if not over:
        return None
    if due is not None:
        for state in over:
            due.pop(state, None)
    return prune(spool, states=over, due=due)


def _scan(spool: Journal, state: JobState) -> list[Entry]:
    out = Scan()
    scan_state(spool, state, out)
    return out.entries


def _victims(entries: list[Entry], limit: int, older_than: float | None,
             now: float) -> list[Entry]:
    ranked = sorted(entries, key=lambda e: (e.updated_at, e.job_id), reverse=True)
    victims = ranked[limit:]
    if older_than is not None:
        cutoff = now - older_than
        victims = [e for e in victims if e.updated_at < cutoff]  # beyond the count AND old
    return victims


def _remove(spool: Journal, victims: list[Entry]) -> tuple[list[str], list[str]]:
    """Remove a batch of jobs (every readable copy) under one lock hold and one flush."""
    gone: list[str] = []
    stale_paths: list[str] = []
    with spool.lock.hold():
        pairs: list[tuple[Job | None, Job | None]] = []
        extra: list[Change] = []
        for victim in victims:
            found = read_job(spool, victim.state.value, victim.job_id + JOB_SUFFIX)
            if found is None or isinstance(found, Bad) or found.revision != victim.revision \
                    or found.updated_at != victim.updated_at:
                # Moved on (requeued, re-read as corrupt) since the scan: not ours. The time
                # too: an id pruned, enqueued again and finished meanwhile is at the same
                # revision as the job the scan saw, and was removed milliseconds after its
                # completion, its result lost (a retention probe: 112 jobs in 13 s).
                continue
            others = _other_copies(spool, found)
            if any(o.revision >= found.revision for o in others):
                continue  # this copy is the stale one: recovery settles it, pruning must not
            pairs.append((found, None))
            for o in others:
                extra.append(Change(name=o.id + JOB_SUFFIX, dst=None, data=None,
                                    src=o.state.value))
                stale_paths.append(entry_of(o).path)
        if extra:
            # The stale copies go first, and reach the disk first: removing the newest copy
            # first, a prune killed (or a power loss) between the two left only the stale
            # one, an expired lease of a completed job, and the job ran again.
            spool.commit_changes([], extra)
            spool.store.flush_dirs({ch.src for ch in extra if ch.src})
            # A stale copy the disk would not remove keeps its newest copy too (it is
            # logged): alone, the stale one would make the job run again.
            kept = {ch.name for ch in extra
                    if ch.src and os.path.lexists(spool.root / ch.src / ch.name)}
            pairs = [(j, n) for j, n in pairs
                     if j is not None and j.id + JOB_SUFFIX not in kept]
        spool.commit_changes(pairs)
        # A removal the disk refused leaves the job whole (logged): not reported pruned.
        gone = [j.id for j, _ in pairs if j is not None
                and not os.path.lexists(spool.root / j.state.value / (j.id + JOB_SUFFIX))]
    return gone, stale_paths


def _other_copies(spool: Journal, job: Job) -> list[Job]:
    """Readable copies of `job` in the other state directories (an existence probe each)."""
    out: list[Job] = []
    name = job.id + JOB_SUFFIX
    for s in ALL_STATES:
        if s is job.state or not os.path.lexists(spool.root / s.value / name):
            continue
        got = read_job(spool, s.value, name)
        if got is not None and not isinstance(got, Bad):
            out.append(got)
    return out
