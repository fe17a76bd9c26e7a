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

Whether a side moved is read from a record in the target's settings table
(`migration:<root>`): the transactions every run from that source wrote rows in
(added by each chunk's own transaction, so a run cut off leaves them too), and
when the last completed run started, by the source's clock. A row whose `xmin`
is not one of those transactions was changed on the target since it was
copied; a source job whose `updated_at` is past that start moved on the source.
No clock is compared with another's, and revisions alone could not tell: a job
run once on each side has the same revision on both. Without a record (an
older release's copy), a job whose revisions agree but whose contents do not
moved on both sides; one whose target copy is further on is taken as the
target's own progress.
A job holding a value the database's columns cannot (a priority past 64
bits, which old releases accepted) is refused alone and listed.
The target's token sequence is raised above every token the source issued:
projection rows written under the old spool carry those tokens, and a new
run's writes must never lose to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import UnreadableJob
from jobspool.pg.rows import COLUMNS, INSERT_SQL, UPDATE_SQL, to_job, write_values
from jobspool.queue.job import Job, evolve
from jobspool.queue.marks import RULE_MARK
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.core import PgCore as PgSpool

CHUNK = 500
RECORD = "migration:"  # + the source's root: what runs from it wrote, and when (a setting)
_XID = "txid_current() & 4294967295"  # this transaction's id as a row's xmin shows it
_BIGINT = range(-(1 << 63), 1 << 63)


@dataclass
class MigrationReport:
    copied: int = 0
    skipped: list[str] = field(default_factory=list)  # ids the target already had
    conflicts: list[str] = field(default_factory=list)  # of those, another job (kind/payload)
    updated: list[str] = field(default_factory=list)  # of those, brought up to the source
    diverged: list[str] = field(default_factory=list)  # of those, changed on both sides
    refused: list[str] = field(default_factory=list)  # values the columns cannot hold
    refused_why: str = ""  # the first one's reason
    unleased: int = 0  # leased in the source, copied as ready
    fence: int = 0  # the target's sequence after the copy
    marks: int = 0  # schedule marks carried over

    def to_dict(self) -> dict[str, Any]:
        return {"copied": self.copied, "skipped": len(self.skipped),
                "skipped_ids": self.skipped[:100], "conflicts": len(self.conflicts),
                "conflict_ids": self.conflicts[:100], "updated": len(self.updated),
                "updated_ids": self.updated[:100], "diverged": len(self.diverged),
                "diverged_ids": self.diverged[:100], "refused": len(self.refused),
                "refused_ids": self.refused[:100], "unleased": self.unleased,
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


def copy_jobs(jobs: Iterable[Job], target: PgSpool, *, source_fence: int,
              source: str = "", started: float | None = None) -> MigrationReport:
    """Insert `jobs` into `target` (one transaction per chunk); see the module docstring.
    `source` names the source (its root) and `started` is when this run began by the
    source's clock: the record the next run judges what moved by."""
    report = MigrationReport()
    now = target.now()
    key = RECORD + source
    last = _last_run(target, key) if source else None
    for chunk in _chunks(jobs):
        rows: list[Job] = []
        unleased: set[str] = set()
        source_updated: dict[str, float] = {}
        for job in chunk:
            why = _unfit(job)
            if why is not None:
                report.refused.append(job.id)
                report.refused_why = report.refused_why or f"{job.id!r}: {why}"
                continue
            source_updated[job.id] = job.updated_at
            if job.state is JobState.LEASED:
                job = evolve(job, state=JobState.READY, lease=None, run_at=now,
                             attempts=max(0, job.attempts - 1),
                             revision=job.revision + 1, updated_at=now)
                unleased.add(job.id)
            rows.append(job)

        def go(conn: psycopg.Connection[Any], rows: list[Job] = rows,
               source_updated: dict[str, float] = source_updated) -> _Repeat:
            out = _Repeat()
            with conn.transaction():
                for job in rows:
                    cur = conn.execute(INSERT_SQL, [job.id, *write_values(job)])
                    if cur.rowcount == 0:
                        out.skipped.append(job.id)
                theirs = {r[0]: r for r in conn.execute(
                    f"SELECT {COLUMNS}, xmin::text::bigint FROM jobspool_jobs "
                    "WHERE id = ANY(%s)", (out.skipped,)).fetchall()} if out.skipped else {}
                mine = {job.id: job for job in rows}
                for i in out.skipped:
                    if i not in theirs:
                        continue
                    job = mine[i]
                    try:
                        held = to_job(theirs[i][:-1])
                    except UnreadableJob:
                        out.diverged.append(i)  # a hand-edited row: a person decides
                        continue
                    if held.kind != job.kind or held.payload != job.payload:
                        # Another job under the id: this one was not copied.
                        out.other.append(i)
                        continue
                    verdict = _judge(job, held, source_updated[i], int(theirs[i][-1]), last)
                    if verdict == "update":
                        # A repeat after the source moved on (its workers ran the job between
                        # two tries of the migration) while the target left it as copied:
                        # the target takes the source's newer version.
                        cur = conn.execute(UPDATE_SQL, [*write_values(job), i, held.revision])
                        (out.updated if cur.rowcount else out.diverged).append(i)
                    elif verdict == "diverged":
                        out.diverged.append(i)  # moved on both sides: a person decides
                    # Else the target has it as copied, or moved it on (its workers ran it
                    # since): a repeat of the migration, left alone.
                if source and (len(out.skipped) < len(rows) or out.updated):
                    # In the transaction that wrote the rows: a run cut off after it still
                    # knows these rows as its own copies.
                    conn.execute(
                        "INSERT INTO jobspool_settings (key, value) VALUES "
                        f"(%(k)s, jsonb_build_object('xids', jsonb_build_array({_XID}))) "
                        "ON CONFLICT (key) DO UPDATE SET value = jsonb_set("
                        "jobspool_settings.value, '{xids}', coalesce(jobspool_settings.value"
                        f" -> 'xids', '[]'::jsonb) || to_jsonb({_XID}))", {"k": key})
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
        if source and started is not None:
            # Written last: a run cut off before here leaves the previous start, which
            # judges conservatively (a change since it counts as a change).
            conn.execute("INSERT INTO jobspool_settings (key, value) VALUES (%(k)s, "
                         "jsonb_build_object('source_started', %(t)s::float8, 'xids', "
                         "'[]'::jsonb)) ON CONFLICT (key) DO UPDATE SET value = jsonb_set("
                         "jobspool_settings.value, '{source_started}', to_jsonb(%(t)s::float8))",
                         {"k": key, "t": started})
        return int(row[0]) if row else 0

    report.fence = target.db.run(raise_fence, what="migrate")
    return report


def stored_settings(target: PgSpool) -> dict[str, Any]:
    """The settings the target stores (its process's own are the options it was given)."""
    from jobspool.pg.schema import load_settings

    return dict(target.db.run(load_settings, what="migrate"))


@dataclass
class _Record:
    """What the target knows of earlier runs from one source."""

    xids: frozenset[int]  # the transactions they wrote rows in (as `xmin` shows them)
    source_started: float | None  # when the last completed one began, by the source's clock


def _last_run(target: PgSpool, key: str) -> _Record | None:
    def read(conn: psycopg.Connection[Any]) -> Any:
        row = conn.execute("SELECT value FROM jobspool_settings WHERE key = %s",
                           (key,)).fetchone()
        return row[0] if row else None

    value = target.db.run(read, what="migrate")
    if not isinstance(value, dict):
        return None
    xids = value.get("xids")
    started = value.get("source_started")
    if isinstance(started, bool) or not isinstance(started, int | float):
        started = None
    return _Record(xids=frozenset(x for x in xids if isinstance(x, int))
                   if isinstance(xids, list) else frozenset(),
                   source_started=None if started is None else float(started))


def _judge(job: Job, held: Job, source_updated: float, xmin: int,
           last: _Record | None) -> str:
    """"repeat", "update" or "diverged" for a job the target already holds as `held` (its
    row last written by transaction `xmin`); `job` is what this run would write and
    `source_updated` the source's own `updated_at`."""
    same = ((held.state, held.revision, held.attempts, held.rescues)
            == (job.state, job.revision, job.attempts, job.rescues)
            and held.result == job.result)
    if last is not None and xmin in last.xids:
        # As a run copied it: whatever differs is the source's doing since.
        return "repeat" if same else "update"
    if last is not None and last.source_started is not None:
        # Changed on the target since it was copied (or by an older release's run).
        if source_updated <= last.source_started:
            return "repeat"  # and not on the source since the last run: its own progress
        return "diverged"
    # No record to go by: revisions and contents.
    if same or job.revision < held.revision:
        return "repeat"
    if job.revision == held.revision:
        return "diverged"  # as many changes on each side, and not the same ones
    return "update" if held.state.value in _UNTOUCHED else "diverged"


def _unfit(job: Job) -> str | None:
    """Why the database's columns cannot hold `job` (None when they can)."""
    for name in ("priority", "attempts", "max_attempts", "revision", "rescues"):
        if getattr(job, name) not in _BIGINT:
            return f"{name} {getattr(job, name)} does not fit PostgreSQL's bigint"
    return None


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
