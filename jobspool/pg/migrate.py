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

Whether a side moved is read from the migration's own bookkeeping, a table
`jobspool_migrated` (source root, job id, the source's revision copied, the
revision the target was given, the job's creation time), written in the
transaction that writes the job: every transition bumps a job's revision on either side, so the source
moved when its revision is no longer the one copied, and the target when its
row's is no longer the one written. No clock or transaction id is compared
(each differs between hosts, servers, and a dump and its restore), and a job
run once on each side, to the same end or not, is seen as changed on both. A
job the target finished and pruned is not copied again, also from the spool
under another path (renamed, mounted elsewhere, a copy of it): a record of
another source counts when it names the same job, by id and creation time
(keyed by path alone, a renamed spool's second run copied every pruned job
back, and they ran again). A row of the same id, kind and payload created at
another time was enqueued on the database itself: left alone, never replaced.
Without a record (an older release's copy), a job whose revisions agree but
whose contents do not moved on both sides; one whose target copy is further
on is taken as the target's own progress.
A job holding a value the database's columns cannot (a priority past 64
bits, which old releases accepted) is refused alone and listed.
The target's token sequence is raised above every token the source issued:
projection rows written under the old spool carry those tokens, and a new
run's writes must never lose to them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import SpoolError, UnreadableJob, one_line
from jobspool.pg.rows import COLUMNS, INSERT_SQL, UPDATE_SQL, to_job, write_values
from jobspool.pg.tokens import fence_value, keep_tokens_above
from jobspool.queue.job import Job, evolve
from jobspool.queue.marks import RULE_MARK
from jobspool.queue.states import JobState

log = logging.getLogger("jobspool.pg")

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.core import PgCore as PgSpool

CHUNK = 500
_LOCK_KEY = 0x6A6F626D  # "jobm": the advisory lock around creating the bookkeeping table
_BOOKS = """CREATE TABLE IF NOT EXISTS jobspool_migrated (
    source text NOT NULL,
    id text NOT NULL,
    src_revision bigint NOT NULL,
    tgt_revision bigint NOT NULL,
    created_at float8,
    PRIMARY KEY (source, id))"""
# Added after the first release of the table: its rows have none (matched by source only).
_BOOKS_CREATED = "ALTER TABLE jobspool_migrated ADD COLUMN IF NOT EXISTS created_at float8"
# Records are looked up by id across sources (`_NOTED`): without it each chunk of 500
# read the whole table (a million jobs: two billion rows read over the copy).
_BOOKS_BY_ID = "CREATE INDEX IF NOT EXISTS jobspool_migrated_id ON jobspool_migrated (id)"
_RAN = -1  # a recorded target revision: the target ran the job (reported diverged)
_NOTE = ("INSERT INTO jobspool_migrated (source, id, src_revision, tgt_revision, created_at) "
         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (source, id) DO UPDATE SET "
         "src_revision = EXCLUDED.src_revision, tgt_revision = EXCLUDED.tgt_revision, "
         "created_at = EXCLUDED.created_at")
# A table of an earlier release, which this role may not alter: records by path alone.
_NOTE_BY_PATH = ("INSERT INTO jobspool_migrated (source, id, src_revision, tgt_revision) "
                 "VALUES (%s, %s, %s, %s) ON CONFLICT (source, id) DO UPDATE SET "
                 "src_revision = EXCLUDED.src_revision, tgt_revision = EXCLUDED.tgt_revision")
_NOTED_BY_PATH = ("SELECT id, src_revision, tgt_revision, true AS own, NULL::float8 "
                  "FROM jobspool_migrated WHERE source = %s AND id = ANY(%s) AND source = %s")
# This source's records, and other sources' that name the same job (id and creation time).
_NOTED = ("SELECT id, src_revision, tgt_revision, source = %s AS own, created_at "
          "FROM jobspool_migrated WHERE id = ANY(%s) AND (source = %s OR created_at IS NOT NULL) "
          "ORDER BY own")
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
                # Every one: the run that finds them records them handled, and no later
                # run lists them again (the others are found again by every run).
                "diverged_ids": list(self.diverged), "refused": len(self.refused),
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
              source: str = "") -> MigrationReport:
    """Insert `jobs` into `target` (one transaction per chunk); see the module docstring.
    `source` names the source (its real path): the key of its bookkeeping."""
    report = MigrationReport()
    now = target.now()

    def books(conn: psycopg.Connection[Any]) -> bool:
        """Make the bookkeeping table when missing; whether it has `created_at`."""
        # Looked up first: CREATE ... IF NOT EXISTS checks the privilege to create before
        # it checks whether the table exists (an application role without CREATE on the
        # schema was refused on a database that had the table).
        import psycopg

        row = conn.execute("SELECT to_regclass('jobspool_migrated')").fetchone()
        if row is not None and row[0] is not None:
            has = conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = "
                               "'jobspool_migrated'::regclass AND attname = 'created_at' "
                               "AND NOT attisdropped").fetchone()
            if has is None:
                # A table of an earlier release: its own records still work by path; a
                # role that may not alter it keeps that (no match across paths).
                try:
                    with conn.transaction():
                        conn.execute(_BOOKS_CREATED)
                except psycopg.errors.InsufficientPrivilege:
                    return False
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege), \
                    conn.transaction():
                conn.execute(_BOOKS_BY_ID)  # a table of an earlier release has none
            return True

        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                conn.execute(_BOOKS)
                conn.execute(_BOOKS_BY_ID)
        except psycopg.errors.InsufficientPrivilege as exc:
            # "refused migrate: permission denied for schema public" did not say what
            # migrate wanted to create there.
            raise SpoolError(f"database {target.display}: {one_line(exc)}: migrate keeps "
                             "what it copied in a table jobspool_migrated, which this role "
                             "may not create; run it once as a role that may create tables "
                             "in the schema (later runs need only write it)") from None
        return True

    with_created = target.db.run(books, what="migrate")
    note_sql, noted_sql = (_NOTE, _NOTED) if with_created else (_NOTE_BY_PATH, _NOTED_BY_PATH)

    # Before the first chunk: a worker already serving the database, or one started after
    # an interrupted copy, drew tokens from 1 meanwhile, below those the source issued (its
    # projection rows would win over new runs).
    keep_tokens_above(target, source_fence)
    for chunk in _chunks(jobs):
        rows: list[Job] = []
        unleased: set[str] = set()
        source_rev: dict[str, int] = {}
        for job in chunk:
            why = _unfit(job)
            if why is not None:
                report.refused.append(job.id)
                report.refused_why = report.refused_why or f"{job.id!r}: {why}"
                continue
            source_rev[job.id] = job.revision
            if job.state is JobState.LEASED:
                job = evolve(job, state=JobState.READY, lease=None, run_at=now,
                             attempts=max(0, job.attempts - 1),
                             revision=job.revision + 1, updated_at=now)
                unleased.add(job.id)
            elif job.state is JobState.READY and job.run_at > now:
                # Ready is due on a file spool whatever its run_at (a producer whose clock
                # ran ahead wrote it); the database claims only what its clock has reached:
                # it waited that long, while stats counted it due.
                job = evolve(job, run_at=now)
            rows.append(job)

        def go(conn: psycopg.Connection[Any], rows: list[Job] = rows,
               source_rev: dict[str, int] = source_rev) -> _Repeat:
            out = _Repeat()
            ids = [job.id for job in rows]
            with conn.transaction():
                created = {job.id: job.created_at for job in rows}
                noted: dict[str, tuple[int, int]] = {}
                # Ordered other sources first, own last: this source's record wins.
                for r in conn.execute(noted_sql, (source, ids, source)).fetchall():
                    # This source's record names the job unless it was made for another
                    # of that id (pruned there, the id used again: a new creation time).
                    if r[4] == created[r[0]] or (r[3] and r[4] is None):
                        noted[r[0]] = (int(r[1]), int(r[2]))

                def note(*values: Any) -> None:
                    conn.execute(note_sql, values if with_created else values[:4])
                theirs = {r[0]: r for r in conn.execute(
                    f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id = ANY(%s) FOR UPDATE",
                    (ids,)).fetchall()}
                for job in rows:
                    i = job.id
                    if i not in theirs:
                        if i in noted:
                            # Copied once, then gone from the target (finished and pruned,
                            # or deleted): copied again, it would run again.
                            out.skipped.append(i)
                            if source_rev[i] != noted[i][0]:
                                out.diverged.append(i)  # reported once, as below
                                note(source, i, source_rev[i], _RAN,
                                                     job.created_at)
                            continue
                        cur = conn.execute(INSERT_SQL, [i, *write_values(job)])
                        if cur.rowcount == 0:  # a concurrent migration's
                            out.skipped.append(i)
                            continue
                        note(source, i, source_rev[i], job.revision,
                                             job.created_at)
                        continue
                    out.skipped.append(i)
                    try:
                        held = to_job(theirs[i])
                    except UnreadableJob:
                        out.diverged.append(i)  # a hand-edited row: a person decides
                        continue
                    if held.kind != job.kind or held.payload != job.payload:
                        # Another job under the id: this one was not copied.
                        out.other.append(i)
                        continue
                    verdict = _judge(job, held, source_rev[i], noted.get(i))
                    if verdict == "update":
                        # A repeat after the source moved on (its workers ran the job between
                        # two tries of the migration) while the target left it as copied:
                        # the target takes the source's newer version.
                        cur = conn.execute(UPDATE_SQL, [*write_values(job), i, held.revision])
                        if cur.rowcount:
                            note(source, i, source_rev[i], job.revision,
                                                 job.created_at)
                            out.updated.append(i)
                        else:
                            out.diverged.append(i)
                    elif verdict == "diverged":
                        out.diverged.append(i)  # moved on both sides: a person decides
                        # Reported by the run that finds it (else every run exited 2 with no
                        # way to settle it); the target ran it, so a later change of the
                        # source never replaces what it did: it is reported again instead.
                        note(source, i, source_rev[i], _RAN, job.created_at)
                    elif verdict == "same":
                        note(source, i, source_rev[i], held.revision,
                                             job.created_at)
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

    report.fence = fence_value(target)
    if report.copied:
        _analyze(target)
    return report


def _analyze(target: PgSpool) -> None:
    """Statistics for the rows just copied. Without them (autovacuum reaches a freshly
    loaded table minutes later on a busy server), a claim for several kinds read and sorted
    the whole backlog: a worker ran 2,000 jobs in 17 s, against 0.8 s after ANALYZE (a
    scale probe, 200k jobs). A role that may not ANALYZE leaves it to autovacuum."""
    import psycopg

    def go(conn: psycopg.Connection[Any]) -> None:
        conn.execute("ANALYZE jobspool_jobs")

    try:
        target.db.run(go, what="analyzing the copied jobs")
    except (SpoolError, psycopg.Error) as exc:
        log.warning("migrate: could not ANALYZE jobspool_jobs (%s); autovacuum will", exc)


def stored_settings(target: PgSpool) -> dict[str, Any]:
    """The settings the target stores (its process's own are the options it was given)."""
    from jobspool.pg.schema import load_settings

    return dict(target.db.run(load_settings, what="migrate"))


def _judge(job: Job, held: Job, source_revision: int, noted: tuple[int, int] | None) -> str:
    """"repeat", "same" (a repeat, as copied), "update" or "diverged" for a job the target
    already holds as `held`; `job` is what this run would write, `source_revision` the
    source's own revision, `noted` the (source, target) revisions its last copy recorded
    (None: no record)."""
    if noted is not None:
        if source_revision == noted[0]:
            return "repeat"  # the source did not move since: whatever the target did stands
        return "update" if held.revision == noted[1] else "diverged"
    if held.created_at != job.created_at:
        # Enqueued on the database itself under the id, kind and payload (every copy keeps
        # the source's creation time): its own job, left alone as an enqueue with
        # on_conflict="keep" leaves it. It was replaced when the file's revision was higher.
        return "repeat"
    # No record (an older release's copy): revisions and contents.
    same = ((held.state, held.revision, held.attempts, held.rescues)
            == (job.state, job.revision, job.attempts, job.rescues)
            and held.result == job.result)
    if same:
        return "same"  # as copied: bookkept from now on
    if job.revision < held.revision:
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
