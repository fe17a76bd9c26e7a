"""The database schema and its migrations.

`migrate` runs under a transaction-level advisory lock, so any number of
processes may run `jobspool init` (or open a spool with `create=True`) at once;
each migration is applied exactly once and recorded in `jobspool_schema`. A
database whose schema is newer than this code is refused before any write:
an old worker must not guess at columns it does not know.

Layout choices, each for the claim path:
- one table; terminal rows stay out of the claim's way through partial
  indexes on the claimable states only;
- no index on `expires_at` or `updated_at`, so a heartbeat (which changes
  only `expires_at` and `revision`) is a HOT update that touches no index;
- `fillfactor` leaves room on each page for those HOT updates, and
  autovacuum runs on a small fraction of churn rather than the default 20%.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from jobspool.errors import SpoolError

SCHEMA_VERSION = 5
_LOCK_KEY = 0x6A6F6273  # "jobs": the advisory lock migrations hold

_V1 = """
CREATE TABLE IF NOT EXISTS jobspool_settings (
    key text PRIMARY KEY,
    value jsonb NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS jobspool_fence AS bigint MINVALUE 1 CACHE 1;
CREATE TABLE IF NOT EXISTS jobspool_jobs (
    id text PRIMARY KEY,
    kind text NOT NULL,
    state text NOT NULL CHECK (state IN ('prepared', 'ready', 'leased', 'retryable',
                                         'completed', 'dead_letter', 'canceled')),
    priority bigint NOT NULL,
    attempts bigint NOT NULL,
    max_attempts bigint NOT NULL,
    revision bigint NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    run_at double precision NOT NULL,
    token bigint,
    owner text,
    expires_at double precision,
    proc text,
    payload json,
    result json,
    last_error text,
    traceback text,
    reservations text[] NOT NULL DEFAULT '{}',
    rescues bigint NOT NULL DEFAULT 0,
    timeout double precision,
    CHECK ((state = 'leased') = (expires_at IS NOT NULL AND token IS NOT NULL))
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_threshold = 500, autovacuum_analyze_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0);
CREATE INDEX IF NOT EXISTS jobspool_jobs_due ON jobspool_jobs (priority, run_at, id)
    WHERE state IN ('ready', 'retryable');
CREATE INDEX IF NOT EXISTS jobspool_jobs_leased ON jobspool_jobs (id) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS jobspool_jobs_prepared ON jobspool_jobs (id) WHERE state = 'prepared';
"""

# v2 (bench/pg.py findings): a worker claims by kind, and without table statistics the
# planner read and sorted every waiting job for it; an index per (kind, claim order) keeps
# one kind's claim an index scan whatever the statistics. Retention reads the newest
# terminal jobs per state from an index instead of sorting the table. Neither index
# holds `expires_at`, so heartbeats stay HOT updates.
_V2 = """
CREATE INDEX IF NOT EXISTS jobspool_jobs_due_kind ON jobspool_jobs (kind, priority, run_at, id)
    WHERE state IN ('ready', 'retryable');
CREATE INDEX IF NOT EXISTS jobspool_jobs_terminal ON jobspool_jobs (state, updated_at, id)
    WHERE state IN ('completed', 'dead_letter', 'canceled');
"""

# v3: schedule marks shared by every machine (tests/test_pg_schedules.py: with per-machine
# marks, a tick fired and pruned on one machine was fired again on another).
_V3 = """
CREATE TABLE IF NOT EXISTS jobspool_schedule_marks (
    name text PRIMARY KEY,
    last_tick bigint NOT NULL
);
"""

# v4: whether a lease's handler started, for leases of rescued jobs claimed by a Worker
# (sql.py, "charging an expired lease"): NULL unknown, false not yet, true started.
# Not indexed: marking a start stays a HOT update.
_V4 = """
ALTER TABLE jobspool_jobs ADD COLUMN IF NOT EXISTS started boolean;
"""

# v5: the counters as bigint in databases made before v1's text said so (it was changed
# in place): there, a priority past 2**31 was refused ("integer out of range") after the
# upgrade while a new database took it. A table already right is not rewritten.
_V5 = """
DO $$
DECLARE c text;
BEGIN
  FOR c IN SELECT column_name FROM information_schema.columns
           WHERE table_schema = current_schema() AND table_name = 'jobspool_jobs'
             AND data_type = 'integer'
             AND column_name IN ('priority', 'attempts', 'max_attempts', 'revision', 'rescues')
  LOOP
    EXECUTE format('ALTER TABLE jobspool_jobs ALTER COLUMN %I TYPE bigint', c);
  END LOOP;
END $$;
"""

MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}


FOREIGN_HINT = ("a table named like jobspool's (jobspool_*) is there and is not jobspool's; "
                "rename it, or give jobspool a schema of its own "
                "(?options=-csearch_path%3Dmyschema)")

# The columns jobspool reads from each of its tables by name (and their types, where a
# value is converted): how its tables are told from someone else's under the same name,
# which CREATE TABLE IF NOT EXISTS keeps. A foreign jobspool_schedule_marks was adopted,
# `fsck` and `health` said ok, and every schedule failed to fire for ever; a foreign
# jobspool_schema with a text version made every command print "invalid literal for
# int()" and exit 1.
TABLE_COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    "jobspool_schema": {"version": ("integer", "bigint", "smallint")},
    "jobspool_settings": {"key": ("text",), "value": ("jsonb", "json")},
    "jobspool_schedule_marks": {"name": ("text",), "last_tick": ("bigint", "integer")},
}


def foreign_tables(conn: psycopg.Connection[Any],
                   names: tuple[str, ...] = tuple(TABLE_COLUMNS)) -> list[str]:
    """Which of `names` exist here without the columns jobspool's have: what is wrong
    with each, e.g. "jobspool_schedule_marks has no column name"."""
    rows = conn.execute(
        "SELECT t, a.attname, format_type(a.atttypid, a.atttypmod) FROM unnest(%s::text[]) "
        "AS t LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(t) AND a.attnum > 0 "
        "AND NOT a.attisdropped WHERE to_regclass(t) IS NOT NULL", (list(names),)).fetchall()
    have: dict[str, dict[str, str]] = {}
    for table, column, kind in rows:
        have.setdefault(table, {})
        if column is not None:
            have[table][column] = kind
    out = []
    for table, columns in have.items():
        for column, kinds in TABLE_COLUMNS[table].items():
            if column not in columns:
                out.append(f"{table} has no column {column}")
            elif columns[column] not in kinds:
                out.append(f"{table}.{column} is {columns[column]}, not {kinds[0]}")
    return out


def refuse_foreign(conn: psycopg.Connection[Any], where: str,
                   names: tuple[str, ...] = tuple(TABLE_COLUMNS)) -> None:
    found = foreign_tables(conn, names)
    if found:
        raise SpoolError(f"{where}: {'; '.join(found)}: {FOREIGN_HINT}")


def _current(conn: psycopg.Connection[Any], where: str) -> int | None:
    """The applied schema version, None when this database has no jobspool schema."""
    row = conn.execute("SELECT to_regclass('jobspool_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    refuse_foreign(conn, where, ("jobspool_schema",))
    row = conn.execute("SELECT max(version) FROM jobspool_schema").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def check(conn: psycopg.Connection[Any], where: str) -> int | None:
    """The schema version, refusing a newer one than this code knows."""
    version = _current(conn, where)
    if version is not None and version > SCHEMA_VERSION:
        raise SpoolError(f"{where} has jobspool schema version {version}, newer than this "
                         f"release's {SCHEMA_VERSION}: upgrade jobspool before using it")
    return version


def schema_problem(conn: psycopg.Connection[Any]) -> str | None:
    """Why this role sees no schema to work in (`current_schema()` is NULL): the
    search_path's first schema does not exist, or this role may not use it. "Holds no
    jobspool schema; run init" sent an operator to re-create what was only ungranted."""
    row = conn.execute("SELECT current_schema(), current_user, "
                       "current_setting('search_path')").fetchone()
    if row is None or row[0] is not None:
        return None
    role, path = row[1], row[2]
    if (path or "").strip() in ("", '""'):  # `SET search_path = ''` shows as ""
        # Taken for the default path, it blamed permissions on public ("grant it"), to a
        # superuser.
        return ("the search_path is empty, so it names no schema to work in; name one "
                "(?options=-csearch_path%3Dmyschema), or leave the search_path out")
    given = path.split(",")[0].strip() or "public"
    # As PostgreSQL reads it: a quoted name as written, any other folded to lower case.
    first = given[1:-1].replace('""', '"') if given.startswith('"') else given.lower()
    if first == "$user":
        first = role
    exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (first,)).fetchone()
    if exists:
        return (f"role {role!r} may not use schema {first!r}; grant it (GRANT USAGE ON "
                f"SCHEMA {first} TO {role}, and SELECT/INSERT/UPDATE/DELETE on its tables)")
    other = conn.execute("SELECT nspname FROM pg_namespace WHERE lower(nspname) = lower(%s) "
                         "ORDER BY nspname LIMIT 1", (first,)).fetchone()
    if other is not None and not given.startswith('"'):
        # "may not use schema 'MyQueue'; grant it" sent a superuser to grant what it had.
        return (f"the search_path names schema {first!r} (an unquoted name is folded to "
                f"lower case), which does not exist; schema {other[0]!r} does: quote it "
                f"in the search_path (\"{other[0]}\", %22{other[0]}%22 in a URL)")
    return (f"the search_path names schema {first!r}, which does not exist; create it "
            "first")


def migrate(conn: psycopg.Connection[Any], where: str, settings: dict[str, Any]) -> bool:
    """Bring the schema to `SCHEMA_VERSION`; returns True when it was created now.

    `settings` are stored once, at creation (like a file spool's `spool.json`).
    """
    from psycopg.types.json import Jsonb

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        problem = schema_problem(conn)
        if problem is not None:
            raise SpoolError(f"{where}: no schema to create tables in: {problem}")
        conn.execute("CREATE TABLE IF NOT EXISTS jobspool_schema ("
                     "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        version = check(conn, where) or 0
        for v in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute(MIGRATIONS[v])
            conn.execute("INSERT INTO jobspool_schema (version) VALUES (%s)", (v,))
        refuse_foreign(conn, where)  # raised inside the transaction: nothing is made
        if version == 0:
            for key, value in settings.items():
                conn.execute("INSERT INTO jobspool_settings (key, value) VALUES (%s, %s) "
                             "ON CONFLICT (key) DO NOTHING", (key, Jsonb(value)))
    return version == 0


# Far enough above the highest token a row holds that no token issued before (and held
# only by rows pruned since, or drawn by a claim meanwhile) is issued again.
FENCE_MARGIN = 100_000

FENCE_GONE = ("the token sequence jobspool_fence is missing (a dump restored without it?); "
              "run `jobspool init` to recreate it above every token the jobs hold")

# The schema of this queue: the one whose `jobspool_jobs` the search_path finds (with
# `q1,public`, a name looked up alone found public's sequence when q1's was gone, and
# claims in q1 drew another queue's tokens, below the ones q1's rows hold).
HOME = ("COALESCE((SELECT relnamespace FROM pg_class WHERE oid = to_regclass('jobspool_jobs')),"
        " (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))")
FENCE_REL = ("(SELECT oid FROM pg_class WHERE relname = 'jobspool_fence' AND relkind = 'S' "
             f"AND relnamespace = {HOME})")
_FENCE_MISSING = f"SELECT {FENCE_REL} IS NULL"


def fence_missing(conn: psycopg.Connection[Any]) -> bool:
    """Whether the token sequence is gone from a schema that has the tables (a dump
    restored without it: `pg_dump -t 'jobspool_*'` takes tables, not sequences)."""
    row = conn.execute(_FENCE_MISSING).fetchone()
    return bool(row and row[0])


def restore_fence(conn: psycopg.Connection[Any]) -> int | None:
    """Recreate a missing token sequence above every token the jobs hold; the value it
    now holds, or None when another process recreated it first."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        if not fence_missing(conn):
            return None
        conn.execute(sql.SQL("CREATE SEQUENCE {} AS bigint MINVALUE 1 CACHE 1").format(
            _fence_name(conn)))
        return fence_above_tokens(conn)


def fence_above_tokens(conn: psycopg.Connection[Any]) -> int:
    """Set this queue's token sequence `FENCE_MARGIN` above the highest token a row holds
    (none: above 0); the value it now holds. The one way the fence is raised: after a
    restore without the sequence, a repair, and `recover` finding rows above it."""
    fence = _fence_name(conn)
    row = conn.execute(sql.SQL(
        "SELECT setval({}, (SELECT COALESCE(max(token), 0) FROM jobspool_jobs) + %s)"
    ).format(sql.Literal(fence.as_string(conn))), (FENCE_MARGIN,)).fetchone()
    assert row is not None
    return int(row[0])


def _fence_name(conn: psycopg.Connection[Any]) -> sql.Identifier:
    """The token sequence of this queue, named in the schema of its jobs table (`HOME`)."""
    home = conn.execute(f"SELECT nspname FROM pg_namespace WHERE oid = {HOME}").fetchone()
    assert home is not None
    return sql.Identifier(home[0], "jobspool_fence")


# What a schema at `SCHEMA_VERSION` holds: its relations, and the job table's columns.
_RELATIONS = ("jobspool_settings", "jobspool_jobs", "jobspool_schedule_marks", "jobspool_fence",
              "jobspool_jobs_due", "jobspool_jobs_leased", "jobspool_jobs_prepared",
              "jobspool_jobs_due_kind", "jobspool_jobs_terminal")
_JOB_COLUMNS = ("id", "kind", "state", "priority", "attempts", "max_attempts", "revision",
                "created_at", "updated_at", "run_at", "token", "owner", "expires_at", "proc",
                "payload", "result", "last_error", "traceback", "reservations", "rescues",
                "timeout", "started")
NO_PRIMARY_KEY = "jobspool_jobs has no primary key on id"
# The job table's column types as v1 (and v5) make them. One changed by hand changes what a
# job holds without a word: `payload` as jsonb refused a NUL in a string and reordered a
# payload's keys, where the file spool and a schema jobspool made keep both.
_JOB_TYPES = {**{c: "text" for c in ("id", "kind", "state", "owner", "proc", "last_error",
                                     "traceback")},
              **{c: "bigint" for c in ("priority", "attempts", "max_attempts", "revision",
                                       "token", "rescues")},
              **{c: "double precision" for c in ("created_at", "updated_at", "run_at",
                                                 "expires_at", "timeout")},
              "payload": "json", "result": "json", "reservations": "text[]",
              "started": "boolean"}
_RETYPE = "not changed by init: ALTER TABLE jobspool_jobs ALTER COLUMN ... TYPE ... back"


def retyped(found: str) -> bool:
    """Whether one thing `damage` found is a column of another type (named, not repaired)."""
    return found.endswith(f"({_RETYPE})")
# A column dropped by hand, as `repair` adds it again: what every row gets, since what it
# held is gone (the defaults a new job would have; a time is the repair's). Defaults
# given only to fill the rows are dropped again (`_FILL_ONLY`), as v1 has none.
_EPOCH_NOW = "extract(epoch from clock_timestamp())"
_COLUMN_AGAIN = {
    "priority": "bigint NOT NULL DEFAULT 0", "attempts": "bigint NOT NULL DEFAULT 0",
    "max_attempts": "bigint NOT NULL DEFAULT {max_attempts}",
    "revision": "bigint NOT NULL DEFAULT 1",
    "created_at": f"double precision NOT NULL DEFAULT {_EPOCH_NOW}",
    "updated_at": f"double precision NOT NULL DEFAULT {_EPOCH_NOW}",
    "run_at": f"double precision NOT NULL DEFAULT {_EPOCH_NOW}",
    "token": "bigint", "owner": "text", "expires_at": "double precision", "proc": "text",
    "payload": "json", "result": "json", "last_error": "text", "traceback": "text",
    "reservations": "text[] NOT NULL DEFAULT '{{}}'", "rescues": "bigint NOT NULL DEFAULT 0",
    "timeout": "double precision", "started": "boolean",
}
_FILL_ONLY = ("max_attempts", "revision", "created_at", "updated_at", "run_at")
# What no default can stand for: the job's identity and where it is.
LOST_FOR_GOOD = ("id", "kind", "state")
# The job table's CHECK constraints, by what their text holds: dropped with a column they
# name (or by hand), and added again (`_checks_again`) once every row is back within them.
_CHECKS = {
    "lease": ("jobspool_jobs_lease_check",
              "CHECK ((state = 'leased') = (expires_at IS NOT NULL AND token IS NOT NULL))"),
    "state": ("jobspool_jobs_state_check",
              "CHECK (state IN ('prepared', 'ready', 'leased', 'retryable', 'completed', "
              "'dead_letter', 'canceled'))"),
}
# What `pg_get_constraintdef` of each holds, to find it whatever its name.
_CHECK_MARKS = {"lease": "expires_at IS NOT NULL", "state": "'dead_letter'"}
_NULLABLE = frozenset(c for c, d in _COLUMN_AGAIN.items() if "NOT NULL" not in d)


def damage(conn: psycopg.Connection[Any]) -> list[str]:
    """What a current schema lacks (a table, an index or a column dropped by hand): the
    version table says nothing of it, and `health` and `fsck` said ok while every claim
    failed."""
    gone = [r for r, missing in conn.execute(
        "SELECT r, NOT EXISTS (SELECT 1 FROM pg_class WHERE relname = r "
        f"AND relnamespace = {HOME}) FROM unnest(%s::text[]) AS r", (list(_RELATIONS),))
        if missing]
    found = [f"{r} is missing" for r in gone]
    if "jobspool_jobs" not in gone:
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = to_regclass('jobspool_jobs') AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
        have = {r[0]: r[1] for r in rows}
        found += [f"column jobspool_jobs.{c} is missing" for c in _JOB_COLUMNS if c not in have]
        found += [f"jobspool_jobs.{c} has type {have[c]}, not {want} ({_RETYPE})"
                  for c, want in _JOB_TYPES.items() if c in have and have[c] != want]
        # A column jobspool leaves NULL made NOT NULL by hand: every write that leaves it
        # NULL failed (every enqueue, for `started`) while `health` said ok.
        found += [f"column jobspool_jobs.{name} is NOT NULL, and jobspool leaves it NULL"
                  for name, _, not_null in rows if not_null and name in _NULLABLE]
        checks = " ".join(r[0] for r in conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = to_regclass('jobspool_jobs') AND contype = 'c'"))
        found += [f"the {label} check of jobspool_jobs is missing"
                  for label, mark in _CHECK_MARKS.items() if mark not in checks]
        if conn.execute("SELECT 1 FROM pg_index WHERE indrelid = to_regclass('jobspool_jobs') "
                        "AND indisprimary").fetchone() is None:
            found.append(NO_PRIMARY_KEY)
    return found + [f"{f} ({FOREIGN_HINT})" for f in foreign_tables(conn)]


def repair(conn: psycopg.Connection[Any], settings: dict[str, Any], where: str) -> list[str]:
    """Recreate what a current schema lacks (`jobspool init`): the migrations' statements
    again (each makes only what is not there), the settings' defaults where a setting is
    gone, and a lost sequence above every token the jobs hold. A lost primary key is not
    made again (ids may have been doubled meanwhile): it stays reported. Returns what was
    found missing."""
    from psycopg.types.json import Jsonb

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        refuse_foreign(conn, where)  # not made again by the migrations: someone else's
        found = damage(conn)
        if not [d for d in found if d != NO_PRIMARY_KEY and not retyped(d)]:
            return found
        lost = [c for c in LOST_FOR_GOOD if f"column jobspool_jobs.{c} is missing" in found]
        if lost:
            raise SpoolError(
                f"{where}: column{'s' if len(lost) > 1 else ''} "
                f"{', '.join(f'jobspool_jobs.{c}' for c in lost)} "
                f"{'are' if len(lost) > 1 else 'is'} missing and cannot be made again (no "
                "default can stand for a job's id, kind or state): restore jobspool_jobs "
                "from a backup; nothing was changed")
        fence_lost = fence_missing(conn)
        # Before the migrations: their indexes name these columns, and failed without them.
        _columns_again(conn, found, settings)
        for v in sorted(MIGRATIONS):
            conn.execute(MIGRATIONS[v])
        _checks_again(conn, damage(conn))  # the columns are back: what they still lack
        for key, value in settings.items():
            conn.execute("INSERT INTO jobspool_settings (key, value) VALUES (%s, %s) "
                         "ON CONFLICT (key) DO NOTHING", (key, Jsonb(value)))
        if fence_lost:  # v1 made it again, from 1: above every token instead
            fence_above_tokens(conn)
    return found


def _columns_again(conn: psycopg.Connection[Any], found: list[str],
                   settings: dict[str, Any]) -> None:
    """Add back the job table's columns `found` missing (`_COLUMN_AGAIN`); a lease whose
    token, expiry or owner went with its column is lost (`_lose_broken_leases`)."""
    missing = [c for c in _COLUMN_AGAIN if f"column jobspool_jobs.{c} is missing" in found]
    if not missing:
        return
    max_attempts = int(settings.get("max_attempts", 5))
    for column in missing:
        conn.execute(sql.SQL("ALTER TABLE jobspool_jobs ADD COLUMN IF NOT EXISTS {} ").format(
            sql.Identifier(column)) + sql.SQL(
            _COLUMN_AGAIN[column].format(max_attempts=max_attempts)))
        if column in _FILL_ONLY:
            conn.execute(sql.SQL("ALTER TABLE jobspool_jobs ALTER COLUMN {} DROP DEFAULT")
                         .format(sql.Identifier(column)))
    if {"token", "expires_at", "owner"} & set(missing):
        _lose_broken_leases(conn)



def _lose_broken_leases(conn: psycopg.Connection[Any]) -> None:
    """Leased rows whose token, expiry or owner went with a dropped column cannot be
    checked or beaten any more: back to `retryable`, due now, the holder fenced out (as a
    lease lost to `cancel` is)."""
    conn.execute(
        f"UPDATE jobspool_jobs SET state = 'retryable', run_at = {_EPOCH_NOW}, "
        f"updated_at = {_EPOCH_NOW}, revision = revision + 1, token = NULL, "
        "expires_at = NULL, owner = NULL, proc = NULL, started = NULL, "
        "last_error = left('lease lost: a column it needs was dropped by hand; "
        "before it: ' || coalesce(last_error, 'none'), 1024) "
        "WHERE state = 'leased' AND (token IS NULL OR expires_at IS NULL OR owner IS NULL)")


def _checks_again(conn: psycopg.Connection[Any], found: list[str]) -> None:
    """Make the table what jobspool writes into again: a NOT NULL put by hand on a column
    it leaves NULL is dropped, and a lost CHECK is added back. A lease whose token, expiry
    or owner is gone (its column dropped and made again) cannot be checked any more: the
    job goes back to `retryable`, due now, its holder fenced out (as a lease lost to
    `cancel` is)."""
    for name in sorted(_NULLABLE):
        if f"column jobspool_jobs.{name} is NOT NULL, and jobspool leaves it NULL" in found:
            conn.execute(sql.SQL("ALTER TABLE jobspool_jobs ALTER COLUMN {} DROP NOT NULL")
                         .format(sql.Identifier(name)))
    for label, (name, text) in _CHECKS.items():
        if f"the {label} check of jobspool_jobs is missing" not in found:
            continue
        if label == "lease":
            _lose_broken_leases(conn)
            conn.execute("UPDATE jobspool_jobs SET token = NULL, expires_at = NULL "
                         "WHERE state <> 'leased' AND (token IS NOT NULL) "
                         "AND expires_at IS NOT NULL")
        # A constraint left under our name (made by hand, or half of an earlier repair).
        conn.execute(sql.SQL("ALTER TABLE jobspool_jobs DROP CONSTRAINT IF EXISTS {}")
                     .format(sql.Identifier(name)))
        conn.execute(sql.SQL("ALTER TABLE jobspool_jobs ADD CONSTRAINT {} " + text)
                     .format(sql.Identifier(name)))


def load_settings(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    return {k: v for k, v in conn.execute("SELECT key, value FROM jobspool_settings")}
