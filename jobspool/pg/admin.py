"""Stats, retention, fsck and health for the PostgreSQL store (recovery: `recovering.py`).

The same reports as the file spool's (`Stats`, `RecoveryReport`,
`PruneReport`, `FsckReport`, `Health`), so the CLI, the dashboard and
scripts read both alike. Fields that describe files (quarantine, temp files,
stale copies) are zero or empty: a database has none.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from jobspool.errors import UnreadableJob
from jobspool.health import (
    DEFAULT_MAINTENANCE_CADENCE,
    DEFAULT_MAX_DUE_AGE,
    DEFAULT_MAX_MAINTENANCE_FAILURES,
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_MIN_FREE_PERCENT,
    DEFAULT_WORKER_STALE,
    MAX_FILES_READ,
)
from jobspool.health.reasons import ids as some_ids
from jobspool.pg.rows import COLUMNS, to_job
from jobspool.pg.schema import FOREIGN_HINT, LOST_FOR_GOOD, NO_PRIMARY_KEY, damage, retyped
from jobspool.queue.bulk import LISTING_PASSES
from jobspool.queue.job import Job, validate_int, validate_seconds
from jobspool.queue.states import ALL_STATES, TERMINAL, JobState
from jobspool.queue.stats import Stats

if TYPE_CHECKING:
    import psycopg

    from jobspool.health import Health
    from jobspool.pg.core import PgCore as PgSpool
    from jobspool.queue.bulk import Match
    from jobspool.recovery.fsck import FsckReport
    from jobspool.recovery.prune import PruneReport

_TERMINAL = (JobState.COMPLETED, JobState.DEAD_LETTER, JobState.CANCELED)

log = logging.getLogger("jobspool.pg")


def stats(spool: PgSpool, *, by_kind: bool = False) -> Stats:
    now = spool.now()
    rows = spool.db.run(lambda c: c.execute(
        "SELECT state, kind, count(*), "
        "count(*) FILTER (WHERE state = 'ready' OR (state = 'retryable' AND run_at <= %(now)s)), "
        "min(greatest(run_at, updated_at)) "  # since it came due or arrived (`waiting_since`)
        "FILTER (WHERE state = 'ready' OR (state = 'retryable' AND run_at <= %(now)s)), "
        "count(*) FILTER (WHERE state = 'retryable' AND attempts = 0 "
        "AND last_error IS NULL) "
        "FROM jobspool_jobs GROUP BY state, kind", {"now": now}).fetchall(), what="stats")
    counts = {s.value: 0 for s in ALL_STATES}
    kinds: dict[str, dict[str, int]] = {}
    due = scheduled = 0
    oldest: float | None = None
    for state, kind, n, n_due, first_due, n_sched in rows:
        if state not in counts:
            # A row edited by hand past the CHECK constraint: `fsck` names it; `stats` and
            # `health` ended in a KeyError traceback.
            log.warning("%s: %d job(s) in unknown state %r; run `jobspool fsck`",
                        spool.display, n, state)
            continue
        counts[state] += n
        due += n_due
        scheduled += n_sched
        if first_due is not None:
            oldest = first_due if oldest is None else min(oldest, first_due)
        if by_kind:
            per = kinds.setdefault(kind, {})  # only the states it has, as the file spool
            per[state] = per.get(state, 0) + n
    return Stats(counts=counts, total=sum(counts.values()), due=due,
                 oldest_due_age=None if oldest is None else max(0.0, now - oldest),
                 fence=spool.fence_value(), quarantined=0, temp_files=0, now=now,
                 by_kind=kinds, scheduled=scheduled)


def prune(spool: PgSpool, *, keep: int | None = None, older_than: float | None = None,
          keep_dead: int | None = None, count: bool = True) -> PruneReport:
    """Delete terminal jobs beyond the newest `keep` of their state AND older than
    `older_than` seconds (the file spool's rule; one statement, one DELETE per state in
    it, reading the newest from an index). `count=False` (automatic retention) skips the report's
    per-state counts of what was kept."""
    from jobspool.recovery.prune import PruneReport

    if keep is None and older_than is None:
        keep, older_than = spool.keep_terminal, spool.keep_terminal_seconds
    keep = 0 if keep is None else validate_int("keep", keep, minimum=0)
    # Dead letters keep their own limit unless one is given for them: `prune --keep 1000`
    # (or `--older-than`) is about finished work, and cut the evidence to 1000 with it.
    keep_dead = spool.keep_dead if keep_dead is None else validate_int("keep_dead", keep_dead,
                                                                       minimum=0)
    if older_than is not None:
        older_than = validate_seconds("older_than", older_than)
    cutoff = None if older_than is None else spool.now() - older_than
    params: dict[str, Any] = {"cutoff": cutoff}
    for state in _TERMINAL:
        params[state.value] = keep_dead if state is JobState.DEAD_LETTER else keep
    removed: dict[JobState, list[str]] = {state: [] for state in _TERMINAL}
    for job_id, name in spool.db.run(functools.partial(_prune_states, params=params),
                                     what="prune"):
        removed[JobState(name)].append(job_id)
    for state in _TERMINAL:
        removed[state].sort()
    kept: dict[str, int] = {}
    if count:
        for state in _TERMINAL:
            kept[state.value] = spool.db.run(functools.partial(_count, state=state),
                                             what="prune")
    return PruneReport(completed=tuple(removed[JobState.COMPLETED]),
                       dead_letter=tuple(removed[JobState.DEAD_LETTER]),
                       canceled=tuple(removed[JobState.CANCELED]), kept=kept)


# One statement for the three terminal states (one round trip and one commit: automatic
# retention runs on the settle path, where three cost a raw claim + complete ~10% of its
# rate, bench/pg.py), one DELETE per state in it. Each state's bound is its `keep`-th
# newest row, read once from the terminal index (an uncorrelated subquery: an InitPlan,
# run once whatever the statistics); everything older in that state goes, walking the
# same index. Not `id IN (SELECT ... OFFSET keep)`: with statistics taken before the churn
# (rows=1 in a terminal state until autovacuum's next analyze) the planner re-ran that
# subquery once per terminal row, a quadratic 0.2 s per 1,000 rows kept, on the settle
# path. Nor a SELECT of the ids then a DELETE of them: two round trips and every id sent
# both ways.
def _prune_one(state: str, bounded: bool, cutoff: bool) -> str:
    conditions = [f"state = '{state}'"]
    if bounded:
        conditions.append(f"""(updated_at, id) < (
            SELECT updated_at, id FROM jobspool_jobs WHERE state = '{state}'
            ORDER BY updated_at DESC, id DESC OFFSET %({state})s - 1 LIMIT 1)""")
    if cutoff:
        conditions.append("updated_at < %(cutoff)s::float8")
    where = "\n      AND ".join(conditions)
    return f"""
  {state} AS (DELETE FROM jobspool_jobs
    WHERE {where}
    RETURNING id, state)"""


# One text per shape (which states keep a number, whether an age applies): pooled
# connections plan generically (db.SESSION), and a generic plan of `$keep = 0 OR (updated_at,
# id) < bound` could not use the bound as an index condition; it read every kept row of the
# state from the heap at each prune (1,000 by default, bench/pg.py `--statements`).
@functools.lru_cache(maxsize=32)
def _prune_sql(bounded: tuple[bool, ...], cutoff: bool) -> str:
    states = zip(_TERMINAL, bounded, strict=True)
    return ("WITH" + ",".join(_prune_one(s.value, b, cutoff) for s, b in states)
            + "\n" + "\nUNION ALL ".join(f"SELECT id, state FROM {s.value}" for s in _TERMINAL))


def _prune_states(conn: psycopg.Connection[Any], params: dict[str, Any]
                  ) -> list[tuple[str, str]]:
    statement = _prune_sql(tuple(params[s.value] > 0 for s in _TERMINAL),
                           params["cutoff"] is not None)
    return [(r[0], r[1]) for r in conn.execute(statement, params).fetchall()]


# A statement per state, its state written in: pooled connections plan prepared
# statements generically (db.SESSION), and a generic plan of `state = $1` cannot use the
# partial index of any one state.
_COUNT = {s: f"SELECT count(*) FROM jobspool_jobs WHERE state = '{s.value}'" for s in JobState}
_STATE_IDS = {s: f"SELECT id FROM jobspool_jobs WHERE state = '{s.value}'" for s in JobState}
_PAGE = {s: (f"SELECT {COLUMNS} FROM jobspool_jobs WHERE state = '{s.value}' AND id > %s "
             "AND (%s::text IS NULL OR kind = %s) ORDER BY id LIMIT 500") for s in JobState}
# By version, not id alone: a job requeued and ended again since it was read (or its id
# pruned, used again and ended) is another version, left alone.
_REMOVE = {s: ("DELETE FROM jobspool_jobs j USING unnest(%s::text[], %s::bigint[], "
               "%s::float8[]) AS v(id, revision, updated_at) WHERE j.id = v.id "
               f"AND j.revision = v.revision AND j.updated_at = v.updated_at "
               f"AND j.state = '{s.value}' RETURNING j.id") for s in JobState}


def _count(conn: psycopg.Connection[Any], state: JobState) -> int:
    row = conn.execute(_COUNT[state]).fetchone()
    return int(row[0]) if row else 0


# How many of the leases above a fence that is behind `health` reads (the highest first).
HIGHEST_SHOWN = 100


def still_above(spool: PgSpool, rows: list[Any]) -> list[Any]:
    """Of (id, token) rows read as above a fence read before them, those above the fence
    read now. Claims draw tokens between the two reads: each token a row held when it was
    read had been drawn by then, so a fence read afterwards is at or above it unless the
    fence really is behind. Compared with the earlier reading, a worker claiming made
    `health` report `fence_behind` (exit 2, "run recover") on a healthy database, and
    `recover` raise the sequence and warn of rows above it."""
    if not rows:
        return rows
    fence = spool.fence_value()
    return [r for r in rows if int(r[1]) > fence]


def _remedy(found: str) -> str:
    """What `fsck` says to do about one thing `schema.damage` found."""
    if FOREIGN_HINT in found or retyped(found):
        return ""
    if found == NO_PRIMARY_KEY:
        return ": ids may be doubled; see the warning of `jobspool init`"
    if any(found == f"column jobspool_jobs.{c} is missing" for c in LOST_FOR_GOOD):
        return ": what it held is gone; restore jobspool_jobs from a backup"
    return "; `jobspool init` makes it again"


def unreadable_damage(found: list[str]) -> bool:
    """Whether what `schema.damage` found keeps the job table from being read at all (it
    or its sequence gone, or a column every read names): nothing past it can be checked."""
    # A column of another type too: the reads past it failed on it ("COALESCE types text
    # and integer cannot be matched" for a `token` made text), instead of naming it.
    return any(d.startswith(("jobspool_jobs is", "jobspool_fence is", "column jobspool_jobs."))
               or retyped(d) for d in found)


def fsck(spool: PgSpool) -> FsckReport:
    """Check the invariants a database can still break (the schema enforces the rest)."""
    from jobspool.recovery.fsck import FsckReport

    found = spool.db.run(damage, what="fsck")
    problems: list[str] = [f"schema: {d}{_remedy(d)}" for d in found]
    if unreadable_damage(found):
        return FsckReport(ok=False, problems=tuple(problems))  # nothing more can be read
    rows = spool.db.run(lambda c: c.execute(
        "SELECT state, count(*), max(token) FROM jobspool_jobs GROUP BY state").fetchall(),
        what="fsck")
    counts = {s.value: 0 for s in ALL_STATES}
    max_token = highest = 0
    for state, n, top in rows:
        counts[state] = int(n)
        highest = max(highest, int(top or 0))
        if state == JobState.LEASED.value:
            # Reported as the file store does: the highest lease held (a settled row keeps
            # its token only to recognise a settle sent again).
            max_token = int(top or 0)
    fence = spool.fence_value()
    if highest > fence:
        problems.append(f"a job holds token {highest}, above the fence sequence's {fence}: "
                        "tokens could be issued twice")
    # Rows no reader can take (a hand's edit: an id or kind no producer could give, a
    # negative attempt count, JSON past what jobspool writes) name why, once each: the
    # checks below list what the reader lets through but the invariants do not.
    unreadable = _unreadable_rows(spool, limit=100)[0]
    said = {i for i, _ in unreadable}
    bad = spool.db.run(lambda c: c.execute(
        "SELECT id, state FROM jobspool_jobs WHERE attempts < 0 OR max_attempts < 1 "
        "OR revision < 1 "
        "OR (state <> 'leased' AND owner IS NOT NULL) LIMIT 100").fetchall(), what="fsck")
    problems.extend(f"job {i} ({s}): fields out of range" for i, s in bad if i not in said)
    problems.extend(why for _, why in unreadable)
    notes: list[str] = []
    expired = spool.db.run(lambda c: c.execute(
        "SELECT count(*) FROM jobspool_jobs WHERE state = 'leased' AND expires_at <= %s",
        (spool.now(),)).fetchone(), what="fsck")
    if expired and expired[0]:
        notes.append(f"{expired[0]} expired lease(s) waiting for a sweep (workers and "
                     "`jobspool recover` reclaim them)")
    return FsckReport(ok=not problems, problems=tuple(problems), notes=tuple(notes),
                      counts=counts, jobs=sum(counts.values()), fence=fence,
                      max_token=max_token)


def _unreadable_rows(spool: PgSpool, *, limit: int, max_rows: int | None = None,
                     live: bool = False) -> tuple[list[tuple[str, str]], int]:
    """Rows no reader can take as jobs (`rows.to_job`: a hand's `1e999` payload, a NaN
    time, a negative time limit) as (id, why), at most `limit`, and how many rows were
    read: every row (fsck, as the file store's reads every file) or the first `max_rows`
    of the unfinished states (`live`: health), in pages by id. fsck called such a table
    consistent while a worker looped on it or listings failed."""
    out: list[tuple[str, str]] = []
    after, read = "", 0
    while len(out) < limit and (max_rows is None or read < max_rows):
        page = 1000 if max_rows is None else min(1000, max_rows - read)
        rows = spool.db.run(functools.partial(_rows_after, after=after, page=page, live=live),
                            what="fsck")
        read += len(rows)
        for r in rows:
            try:
                to_job(r)
            except UnreadableJob as exc:
                out.append((r[0], str(exc)))
        if len(rows) < page:
            break
        after = rows[-1][0]
    return out[:limit], read


def _rows_after(conn: psycopg.Connection[Any], after: str, page: int,
                live: bool) -> list[Any]:
    states = "AND state NOT IN ('completed', 'dead_letter', 'canceled') " if live else ""
    return conn.execute(f"SELECT {COLUMNS} FROM jobspool_jobs WHERE id > %s {states}"
                        "ORDER BY id LIMIT %s", (after, page)).fetchall()


def health(spool: PgSpool, *, max_due_age: float = DEFAULT_MAX_DUE_AGE,
           projection: str | os.PathLike[str] | None = None, lease_grace: float = 0.0,
           maintenance_cadence: float = DEFAULT_MAINTENANCE_CADENCE,
           max_maintenance_failures: int = DEFAULT_MAX_MAINTENANCE_FAILURES,
           min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
           min_free_percent: float = DEFAULT_MIN_FREE_PERCENT,
           worker_stale: float = DEFAULT_WORKER_STALE,
           max_files_read: int = MAX_FILES_READ) -> Health:
    """`ok` / `degraded` with reasons: dead letters, stuck due jobs, unswept leases, stale
    prepared jobs, rows no reader can take (the first `max_files_read` unfinished ones, as
    the file spool reads that many files); and, as on the file spool, what this machine
    holds (`host_reasons`)."""
    from jobspool.health import (
        Health,
        Reason,
        check_max_files_read,
        check_options,
        expired_reason,
        fence_behind_reason,
        host_reasons,
        queue_reasons,
        stale_prepared_reason,
    )

    check_options(max_due_age=max_due_age, lease_grace=lease_grace,
                  maintenance_cadence=maintenance_cadence,
                  max_maintenance_failures=max_maintenance_failures,
                  min_free_bytes=min_free_bytes, min_free_percent=min_free_percent,
                  worker_stale=worker_stale)
    check_max_files_read(max_files_read)
    damaged = spool.db.run(damage, what="health")
    # Each of these fails a part of the queue (a claim, a schedule's tick) while the counts
    # look fine; `fsck` lists them with what to do.
    schema_reason = Reason("schema_damaged", f"the schema is not what this release's holds: "
                           f"{'; '.join(damaged)}; run `jobspool fsck`", len(damaged))
    # A lost sequence is the one-line error that names it (reading the fence), as before.
    if unreadable_damage([d for d in damaged if not d.startswith("jobspool_fence is")]):
        # The counts cannot be read past it: said, rather than "refused stats: column ...".
        return Health(reasons=[schema_reason], root=spool.display, checked_at=spool.now(),
                      figures={})
    now = spool.now()
    st = stats(spool)
    # The same reasons, codes and texts as the file spool's, so one alert rule serves both.
    reasons = queue_reasons(st, max_due_age)
    row = spool.db.run(lambda c: c.execute(
        "SELECT count(*) FILTER (WHERE state = 'leased' AND expires_at <= %s), "
        "count(*) FILTER (WHERE state = 'prepared' AND updated_at <= %s), "
        # What a worker's transactions would be: a read-only database (a standby, or
        # default_transaction_read_only) fails every claim while the counts look fine.
        "current_setting('transaction_read_only') = 'on' OR pg_is_in_recovery() "
        "FROM jobspool_jobs",
        (now - lease_grace, now - spool.prepare_grace_seconds)).fetchone(), what="health")
    expired, stale = (int(row[0]), int(row[1])) if row else (0, 0)
    read_only = bool(row[2]) if row else False
    if read_only:
        reasons.append(Reason("database_read_only", "the database takes no writes (a standby, "
                              "or default_transaction_read_only is on): every claim, enqueue "
                              "and settle fails", 1))
    if damaged:
        reasons.append(schema_reason)
    if expired:
        ids = [r[0] for r in spool.db.run(lambda c: c.execute(
            "SELECT id FROM jobspool_jobs WHERE state = 'leased' AND expires_at <= %s "
            "ORDER BY id LIMIT 5", (now - lease_grace,)).fetchall(), what="health")]
        reasons.append(expired_reason(ids, expired))
    above = still_above(spool, spool.db.run(lambda c: c.execute(
        "SELECT id, token FROM jobspool_jobs WHERE state = 'leased' AND token > %s "
        f"ORDER BY token DESC LIMIT {HIGHEST_SHOWN}", (st.fence,)).fetchall(), what="health"))
    if above:
        fence = spool.fence_value()
        total = None
        if len(above) == HIGHEST_SHOWN:  # the highest only: the reason counts them all
            row = spool.db.run(lambda c: c.execute(
                "SELECT count(*) FROM jobspool_jobs WHERE state = 'leased' AND token > %s",
                (fence,)).fetchone(), what="health")
            total = int(row[0]) if row else None
        behind = fence_behind_reason(fence, [(int(t), i) for i, t in above], total)
        if behind is not None:
            reasons.append(behind)
    if stale:
        ids = [r[0] for r in spool.db.run(lambda c: c.execute(
            "SELECT id FROM jobspool_jobs WHERE state = 'prepared' AND updated_at <= %s "
            "ORDER BY id LIMIT 5", (now - spool.prepare_grace_seconds,)).fetchall(),
            what="health")]
        reasons.append(stale_prepared_reason(ids, stale, spool.prepare_grace_seconds))
    broken, read = _unreadable_rows(spool, limit=100, max_rows=max_files_read, live=True)
    if broken:
        # A file spool's `unreadable_files`. Here a claim dead-letters such a row once it
        # is due (naming why): the job never runs as it was meant to.
        reasons.append(Reason("unreadable_files", f"{len(broken)} unfinished row(s) no "
                              f"reader can take ({some_ids([i for i, _ in broken])}): a claim "
                              "dead-letters each once it is due, so those jobs never run; "
                              "`jobspool fsck` says why each, fix or delete them by hand",
                              len(broken)))
    local, local_figures = host_reasons(
        spool, now=now, projection=projection, maintenance_cadence=maintenance_cadence,
        max_maintenance_failures=max_maintenance_failures, min_free_bytes=min_free_bytes,
        min_free_percent=min_free_percent, worker_stale=worker_stale)
    reasons.extend(local)
    # The file spool's keys, so one consumer reads both: what has no meaning on a database
    # (job files) is zero, as the README says.
    figures = {"counts": dict(st.counts), "due": st.due, "oldest_due_age": st.oldest_due_age,
               "fence": st.fence, "quarantined": 0, "expired_leases": expired,
               "stale_prepared": stale, "unreadable_files": len(broken), "no_read_access": 0,
               "ready_not_claimed": 0, "job_files_read": read,
               "job_files": sum(n for s, n in st.counts.items() if JobState(s) not in TERMINAL),
               "database_read_only": read_only, **local_figures}
    return Health(reasons=reasons, root=spool.display, checked_at=now, figures=figures)


def iter_jobs(spool: PgSpool, states: Sequence[JobState], kind: str | None) -> Iterator[Job]:
    """Jobs per state in id order, read in pages of 500 (keyset, no OFFSET)."""
    for state in states:
        after = ""
        while True:
            params = (after, kind, kind)
            rows = spool.db.run(functools.partial(_page, state=state, params=params),
                                what="listing jobs")
            for r in rows:
                try:
                    yield to_job(r)
                except UnreadableJob as exc:  # as the file store skips a damaged file
                    log.warning("skipped: %s", exc)
            if len(rows) < 500:
                break
            after = rows[-1][0]


def state_ids(spool: PgSpool, state: JobState) -> list[str]:
    """The ids of one state in id order, nothing else read: what the file store's directory
    listing gives the dashboard (a page of 50 read every row and payload of its state:
    15 s and 800 MB for 20,000 jobs of 40 KB)."""
    rows = spool.db.run(lambda c: c.execute(_STATE_IDS[state]).fetchall(),
                        what="listing job ids")
    # Sorted here: the database's collation need not be Python's (code point) order, which
    # the dashboard's cursor bisects by.
    return sorted(r[0] for r in rows)


def _page(conn: psycopg.Connection[Any], state: JobState, params: tuple[Any, ...]
          ) -> list[Any]:
    return conn.execute(_PAGE[state], params).fetchall()


def apply_matching(spool: PgSpool, action: str, which: Match, decide: Callable[..., Job]
                   ) -> list[Job]:
    """A bulk cancel or requeue: each job re-read under its row lock and moved only if it
    is *now* in a chosen state and matches (one finished meanwhile is left alone); one
    transaction per job, so workers never wait. As on the file store (`queue/bulk.py`): a
    job that moved between the listing and its turn into another chosen state (ready ->
    leased under a worker) is moved, not skipped; a second listing takes the jobs that
    moved into an already-listed state meanwhile; each job is listed once, however often
    it moved while the states were read; and only what this call moved is reported.
    Before, a job claimed in that gap kept running after "cancel every job of this kind",
    and one a worker completed meanwhile was reported canceled (its row compared with the
    listed snapshot, not with what this call wrote)."""
    # Refused up front, as on the file store, even when nothing matches.
    spool.check_writable(action)
    moved: list[Job] = []
    seen: set[str] = set()
    in_flight = None
    try:
        for _ in range(LISTING_PASSES):
            ids = sorted({job.id for job in iter_jobs(spool, which.states, which.kind)} - seen)
            if not ids:
                break
            seen.update(ids)
            for job_id in ids:
                in_flight = job_id
                wrote = _move_one(spool, action, job_id, which, decide)
                in_flight = None
                if wrote is not None:
                    moved.append(wrote)
    except KeyboardInterrupt as exc:
        # As the file store says what stands (`queue/bulk.py`). The move in flight as the
        # signal came may have committed (a third of the interruptions in a probe) or not:
        # named, not counted, rather than a count one short.
        exc.moved = moved  # type: ignore[attr-defined]
        exc.in_flight = in_flight  # type: ignore[attr-defined]
        raise
    return sorted(moved, key=lambda j: j.id)  # by id, as the file store lists them


def _move_one(spool: PgSpool, action: str, job_id: str, which: Match,
              decide: Callable[..., Job]) -> Job | None:
    """Move one job if it is now chosen; what this call wrote, or None."""
    last: list[Job | None] = [None]

    def step(cur: Job, now: float) -> Job:
        mine = last[0]
        if mine is not None and (cur.revision, cur.state) == (mine.revision, mine.state):
            return cur  # sent again after a lost reply: the first try's write committed
        last[0] = None
        if cur.state not in which.states or not which(cur, now):
            return cur
        new = decide(cur, now=now)
        last[0] = None if new is cur else new
        return new

    spool.mutate_job(job_id, step, missing=lambda: None, what=action)
    return last[0]


def remove_terminal(spool: PgSpool, jobs: Sequence[Job], state: JobState) -> list[str]:
    """Delete these jobs where they are still the versions given, in terminal `state`;
    the ids removed."""
    if state not in _TERMINAL:
        raise ValueError(f"{state.value} is not a terminal state")
    params = ([j.id for j in jobs], [j.revision for j in jobs], [j.updated_at for j in jobs])
    rows = spool.db.run(lambda c: c.execute(_REMOVE[state], params).fetchall(),
                        what="removing jobs")
    return sorted(r[0] for r in rows)
