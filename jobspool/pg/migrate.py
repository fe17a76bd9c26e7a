"""Copy a file spool's jobs into a PostgreSQL spool (`jobspool migrate --to URL`).

Leases are not copied: a job leased in the source arrives `ready` with its
attempt given back, as `release` does: the migration cut that run off, not
the job (counted, a job on its last attempt arrived with none left and was
claimed past `max_attempts`). Workers on the old spool must be stopped
first; one still running would finish a job the new spool runs again. The
source's settings (lease length, attempts, backoff, retention, sizes) are
the target's when the migration creates it. Ids the target
already holds are left alone and reported, so running it twice is harmless;
one the source moved on since (its workers ran it between two tries of the
migration) takes the source's newer version while no worker of the target
has started it, and is reported as diverged (exit 2) otherwise.
The target's token sequence is raised above every token the source issued:
projection rows written under the old spool carry those tokens, and a new
run's writes must never lose to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from jobspool.pg.rows import INSERT_SQL, UPDATE_SQL, write_values
from jobspool.queue.job import Job, evolve
from jobspool.queue.marks import RULE_MARK
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.core import PgCore as PgSpool

CHUNK = 500


@dataclass
class MigrationReport:
    copied: int = 0
    skipped: list[str] = field(default_factory=list)  # ids the target already had
    conflicts: list[str] = field(default_factory=list)  # of those, another job (kind/payload)
    updated: list[str] = field(default_factory=list)  # of those, brought up to the source
    diverged: list[str] = field(default_factory=list)  # of those, changed on both sides
    unleased: int = 0  # leased in the source, copied as ready
    fence: int = 0  # the target's sequence after the copy
    marks: int = 0  # schedule marks carried over

    def to_dict(self) -> dict[str, Any]:
        return {"copied": self.copied, "skipped": len(self.skipped),
                "skipped_ids": self.skipped[:100], "conflicts": len(self.conflicts),
                "conflict_ids": self.conflicts[:100], "updated": len(self.updated),
                "updated_ids": self.updated[:100], "diverged": len(self.diverged),
                "diverged_ids": self.diverged[:100], "unleased": self.unleased,
                "fence": self.fence, "schedule_marks": self.marks}


def _chunks(jobs: Iterable[Job]) -> Iterator[list[Job]]:
    chunk: list[Job] = []
    for job in jobs:
        chunk.append(job)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def copy_jobs(jobs: Iterable[Job], target: PgSpool, *, source_fence: int) -> MigrationReport:
    """Insert `jobs` into `target` (one transaction per chunk); see the module docstring."""
    report = MigrationReport()
    now = target.now()
    for chunk in _chunks(jobs):
        rows: list[Job] = []
        unleased: set[str] = set()
        for job in chunk:
            if job.state is JobState.LEASED:
                job = evolve(job, state=JobState.READY, lease=None, run_at=now,
                             attempts=max(0, job.attempts - 1),
                             revision=job.revision + 1, updated_at=now)
                unleased.add(job.id)
            rows.append(job)

        def go(conn: psycopg.Connection[Any], rows: list[Job] = rows) -> _Repeat:
            out = _Repeat()
            with conn.transaction():
                for job in rows:
                    cur = conn.execute(INSERT_SQL, [job.id, *write_values(job)])
                    if cur.rowcount == 0:
                        out.skipped.append(job.id)
                theirs = {r[0]: r[1:] for r in conn.execute(
                    "SELECT id, kind, payload::text, state, revision FROM jobspool_jobs "
                    "WHERE id = ANY(%s)", (out.skipped,)).fetchall()} if out.skipped else {}
                mine = {job.id: job for job in rows}
                for i in out.skipped:
                    if i not in theirs:
                        continue
                    kind, payload, state, revision = theirs[i]
                    job = mine[i]
                    if kind != job.kind or orjson.loads(payload) != job.payload:
                        # Another job under the id: this one was not copied.
                        out.other.append(i)
                    elif job.revision > revision and state in _UNTOUCHED:
                        # A repeat after the source moved on (its workers ran the job between
                        # two tries of the migration): left alone, the target ran it again.
                        # Not started on the target: it takes the source's newer version.
                        cur = conn.execute(UPDATE_SQL, [*write_values(job), i, revision])
                        (out.updated if cur.rowcount else out.diverged).append(i)
                    elif job.revision > revision:
                        out.diverged.append(i)  # moved on both sides: a person decides
                    # Else the target has it as copied, or moved it on (its workers ran it
                    # since): a repeat of the migration, left alone.
            return out

        repeat = target.db.run(go, what="migrate")
        skipped = repeat.skipped
        report.skipped.extend(skipped)
        report.conflicts.extend(repeat.other)
        report.updated.extend(repeat.updated)
        report.diverged.extend(repeat.diverged)
        report.copied += len(rows) - len(skipped)
        report.unleased += len(unleased - set(skipped))  # of those copied, not left alone

    def raise_fence(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT setval('jobspool_fence', greatest(%s::bigint, "
            "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM jobspool_fence), 1))",
            (source_fence,)).fetchone()
        return int(row[0]) if row else 0

    report.fence = target.db.run(raise_fence, what="migrate")
    return report


@dataclass
class _Repeat:
    """What one chunk found already in the target."""

    skipped: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)


# States a job copied by an earlier run is in while no worker of the target took it.
_UNTOUCHED = frozenset({JobState.READY.value, JobState.RETRYABLE.value,
                        JobState.PREPARED.value})


def copy_marks(marks: dict[str, int], target: PgSpool) -> int:
    """Carry the file spool's schedule marks over (a mark only moves forward): without
    them, the first scheduler on PostgreSQL fired again a tick fired and pruned on the
    file spool, and `catch_up="all"` lost the ticks missed during the move."""
    if not marks:
        return 0
    ticks = {name: tick for name, tick in marks.items() if not name.endswith(RULE_MARK)}
    with target.hold_schedule_marks() as held:  # type: ignore[attr-defined]
        for name, tick in ticks.items():
            if tick >= held.get(name, tick):
                held[name] = tick
                # The rule the tick was fired under goes with it (`marks` read with
                # `rules=True`): without it, a rule made finer after the move was judged
                # by the old check, and an hour's mark fired 50 "missed" minute ticks.
                rule = marks.get(name + RULE_MARK)
                if rule is not None:
                    held[name + RULE_MARK] = rule
    return len(ticks)
