"""Opening a PostgreSQL spool: the schema, the settings it was created with, the clocks.

`Spool(url)` creates (or migrates) the schema unless `create=False`, reads the
settings stored at creation (given options win for this process, as with a
file spool's `spool.json`), names the NOTIFY channel after the schema, and
measures how far this host's clock is from the database's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobspool.errors import InvalidJob, SpoolError, one_line
from jobspool.pg.schema import (
    FENCE_GONE,
    NO_PRIMARY_KEY,
    SCHEMA_VERSION,
    check,
    fence_missing,
    load_settings,
    migrate,
    repair,
    restore_fence,
    retyped,
    schema_problem,
)
from jobspool.queue.job import MAX_JOB_BYTES, validate_int, validate_seconds
from jobspool.queue.layout import SpoolSettings
from jobspool.queue.payload import MAX_JOB_BYTES_LIMIT

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.db import Database

log = logging.getLogger("jobspool.pg")

# The persisted settings and their defaults (the same as a file spool's).
DEFAULTS: dict[str, Any] = {
    "lease_seconds": 60.0, "max_attempts": 5, "retry_base_seconds": 1.0,
    "retry_max_seconds": 300.0, "keep_terminal": 1000, "keep_terminal_seconds": None,
    "max_rescues": 10, "prepare_grace_seconds": 300.0, "max_job_bytes": MAX_JOB_BYTES,
    "keep_dead": None,
}


def default_local_dir(display: str) -> Path:
    """Where per-process artifacts of a database spool live on this machine."""
    base = os.environ.get("JOBSPOOL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "jobspool")
    return Path(base) / hashlib.sha256(display.encode()).hexdigest()[:16]


# In this machine's directory for a spool: which database it serves (`database_identity`).
IDENTITY_FILE = "database"


def database_identity(conn: Any) -> str:
    """The database a connection reached, whatever URL named it (user, host spelling,
    options): the cluster's system identifier, the database's oid and the jobs table's
    (two spools may share a database, each in a schema of its own). The local
    directory is named by the URL, so that a monitor connecting as another role (as the
    README advises) looked in a directory of its own, and `health` said ok with every
    worker stuck. Readers find the workers' directories by this identity."""
    row = conn.execute("SELECT (SELECT system_identifier FROM pg_control_system()), "
                       "(SELECT oid FROM pg_database WHERE datname = current_database()), "
                       "to_regclass('jobspool_jobs')::oid").fetchone()
    if row is None or None in row:
        return ""
    return f"{row[0]}:{row[1]}:{row[2]}"


def note_identity(path: Path, identity: str) -> None:
    """Record in a local directory which database it serves (best effort: a directory
    without it is found only by its own URL, as before)."""
    target = path / IDENTITY_FILE
    try:
        if target.read_text(encoding="utf-8").strip() == identity:
            return
    except (OSError, UnicodeDecodeError):
        pass
    tmp = path / f".{IDENTITY_FILE}.{os.getpid()}"
    try:
        tmp.write_text(identity + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def local_dirs_of(path: Path, identity: str) -> list[Path]:
    """The other local directories beside `path` that serve the same database."""
    out = []
    try:
        siblings = sorted(os.scandir(path.parent), key=lambda e: e.name)
    except OSError:
        return []
    for entry in siblings:
        if entry.name == path.name or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, IDENTITY_FILE), encoding="utf-8") as f:
                if f.read(200).strip() == identity:
                    out.append(Path(entry.path))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def private_local_dir(path: Path) -> None:
    """Create this machine's directory for the spool, private (0700) whatever the umask:
    worker metrics, job progress and the default projection live there, as private as a
    file spool's. One already there is left as its owner set it."""
    from jobspool.queue.perms import make_dir

    if path.is_dir():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        make_dir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SpoolError(f"cannot create {path} (this machine's directory for "
                         f"the spool): {exc.strerror or exc}") from None


class LocalLock:
    """A process-local stand-in for the file spool's lock (schedule marks use it)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            yield


@dataclass(frozen=True)
class Opened:
    created: bool  # the schema was created by this open
    settings: SpoolSettings  # stored at creation, overridden by the options given now
    channel: str  # the NOTIFY channel of this schema
    clock_offset: float  # database clock minus this host's, in seconds
    upgraded_from: int | None = None  # the schema version this open migrated from


def open_database(db: Database, *, create: bool, read_only: bool,
                  given: dict[str, Any]) -> Opened:
    # Stored as checked (plain floats and ints): a numpy or Fraction value the checks
    # accept reached psycopg's JSON dumper as given ("Object of type float32 is not JSON
    # serializable", a traceback), where the file spool stored 5.0.
    checked = validated({**DEFAULTS, **given})
    given = {k: getattr(checked, k) for k in given}
    conn = db.connect()
    version: int | None = None
    reading = True  # until the version is read: a refusal then is not about creating
    try:
        version = check(conn, db.display)
        reading = False
        if version is None and (read_only or not create):
            problem = schema_problem(conn)
            if problem is not None:
                raise SpoolError(f"{db.display}: {problem}")
            raise SpoolError(f"{db.display} holds no jobspool schema; run `jobspool init "
                             f"--root {db.display}` first")
        if read_only and version is not None and version < SCHEMA_VERSION:
            raise SpoolError(f"{db.display} has jobspool schema version {version}, older than "
                             f"this release's {SCHEMA_VERSION}: run `jobspool init --root "
                             f"{db.display}` once (as a role that may create tables) to "
                             "upgrade it")
        # Up to date: no DDL at all, so a role that may only read and write the tables
        # (no CREATE on the schema: the usual application role) can open it.
        created = False if read_only or version == SCHEMA_VERSION else migrate(
            conn, db.display, {**DEFAULTS, **given})
        if version is not None and not read_only and fence_missing(conn):
            _restore_fence(conn, db.display, create=create)
        if not read_only:
            _check_may_write(conn, db.display)
        stored = load_settings(conn)
        # The schema that holds the tables, not the search_path's first one: with
        # `search_path=q1,public` and the tables in public, the channel was named after q1
        # and wakeups between this process and one whose path is `public` were lost (the
        # poll fallback saw to them), and nothing said which queue this was.
        schema = conn.execute(
            "SELECT n.nspname, current_schema() FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = to_regclass('jobspool_jobs')").fetchone()
        if schema is not None and schema[1] is not None and schema[0] != schema[1]:
            log.warning("%s: jobspool's tables are in schema %r, found through the "
                        "search_path after its first schema %r: this is the queue in %r "
                        "(to make one in %r, leave %r out of the search_path and run "
                        "`jobspool init`)", db.display, schema[0], schema[1], schema[0],
                        schema[1], schema[0])
        row = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
        t1 = time.time()
    except SpoolError:
        raise
    except Exception as exc:
        import psycopg

        if isinstance(exc, psycopg.errors.InsufficientPrivilege) and reading:
            # Refused while reading the version: the schema may well be current.
            raise SpoolError(f"database {db.display}: {one_line(exc)}; this role needs "
                             "SELECT (and, to write, INSERT/UPDATE/DELETE) on jobspool's "
                             "tables") from None
        if isinstance(exc, psycopg.errors.InsufficientPrivilege) and version != SCHEMA_VERSION:
            raise SpoolError(f"database {db.display}: {one_line(exc)}; creating or upgrading "
                             "the schema needs a role that may create tables in it: run "
                             "`jobspool init` as that role once") from None
        if isinstance(exc, psycopg.errors.UndefinedTable) and version == SCHEMA_VERSION:
            # Dropped by hand under a version table that says all is there.
            raise SpoolError(f"database {db.display}: {one_line(exc)}: the schema lacks "
                             "what this release's holds; `jobspool init` makes it again "
                             "(`jobspool fsck` lists what is missing)") from None
        if isinstance(exc, psycopg.errors.UndefinedColumn | psycopg.errors.WrongObjectType):
            # CREATE ... IF NOT EXISTS kept a table of someone else's under one of our names,
            # and the next statement failed on it ('column "state" does not exist').
            raise SpoolError(f"database {db.display}: {one_line(exc)}: a table named like "
                             "jobspool's (jobspool_*) is there and is not jobspool's; rename "
                             "it, or give jobspool a schema of its own "
                             "(?options=-csearch_path%3Dmyschema)") from None
        if isinstance(exc, psycopg.Error):
            # A session killed or cut while the spool opened (a failover, a pooler, a
            # pg_terminate_backend storm) is "unreachable for now", as at the connect: a
            # SpoolError made `worker --wait-for-store` exit at once, and a pool give up.
            from jobspool.pg.db import connect_error

            raise connect_error(exc, f"database {db.display}: {one_line(exc)}") from None
        raise
    finally:
        conn.close()
    try:
        settings = validated({**DEFAULTS, **stored, **given})
    except InvalidJob as exc:
        # Checked when stored: someone edited the table by hand. Name it, not an option.
        raise SpoolError(f"{db.display}: jobspool_settings holds a bad setting: {exc}; fix "
                         "it in that table") from None
    return Opened(created=created, settings=settings,
                  channel=channel_name(schema[0] if schema else "public"),
                  # Against the reply's arrival, not the round trip's midpoint: the
                  # estimate then never puts this host ahead of the database, so a job
                  # due "now" (enqueued, requeued) is due for the very next claim; from
                  # the midpoint, an asymmetric round trip under load put run_at a few
                  # ms in the database's future and an immediate claim found nothing.
                  clock_offset=(float(row[0]) - t1) if row else 0.0,
                  upgraded_from=version if version is not None and not read_only
                  and version < SCHEMA_VERSION else None)


def repair_damage(url: str, given: dict[str, Any]) -> list[str]:
    """`jobspool init` on a schema at this release's version: recreate what was dropped by
    hand (`schema.repair`), saying what in a warning. What was found missing."""
    import psycopg

    from jobspool.pg.db import Database

    db = Database(url)
    conn = db.connect()
    try:
        try:
            current = check(conn, db.display) == SCHEMA_VERSION
        except psycopg.Error:
            current = False  # a table not jobspool's under its name: opening names it
        if not current:
            return []  # none yet, or older: opening creates or upgrades it
        found = repair(conn, {**DEFAULTS, **given}, db.display)
    except psycopg.Error as exc:
        from jobspool.pg.db import connect_error

        raise connect_error(exc, f"database {db.display}: {one_line(exc)}") from None
    finally:
        conn.close()
    fixed = [d for d in found if d != NO_PRIMARY_KEY and not retyped(d)]
    for d in found:
        if retyped(d):
            log.warning("%s: %s", db.display, d)
    if fixed:
        tables = [d for d in fixed if d.split()[0] in _TABLES]
        log.warning("%s: the schema lacked what this release's holds (%s); made again%s%s",
                    db.display, "; ".join(fixed),
                    " (a table made again is empty: restore its rows from a backup if it "
                    "held any)" if tables else "",
                    "; the token sequence starts above every token the jobs hold. "
                    + _GRANT_AGAIN if "jobspool_fence is missing" in fixed else "")
    if NO_PRIMARY_KEY in found:
        log.warning("%s: %s: not made again, as ids may be doubled meanwhile; find them "
                    "(SELECT id FROM jobspool_jobs GROUP BY id HAVING count(*) > 1), keep "
                    "one row each, then ALTER TABLE jobspool_jobs ADD PRIMARY KEY (id)",
                    db.display, NO_PRIMARY_KEY)
    return found


_TABLES = ("jobspool_settings", "jobspool_jobs", "jobspool_schedule_marks")
# A sequence made again has only its maker's grants.
_GRANT_AGAIN = ("Grant it again to the roles that run workers (USAGE, SELECT, UPDATE ON "
                "SEQUENCE jobspool_fence: a worker raises it above its projection's tokens)")


def channel_name(schema: str) -> str:
    """The NOTIFY channel of a schema: at most 63 *bytes*, as PostgreSQL takes them (cut at
    63 characters, a schema named in Cyrillic made a name `pg_notify` refused, and every
    enqueue failed on "channel name too long"); never cut inside a character."""
    return f"jobspool_{schema}".encode()[:63].decode(errors="ignore")


def validated(s: dict[str, Any]) -> SpoolSettings:
    """The settings, each checked as the file spool checks it."""
    kts, rescues = s["keep_terminal_seconds"], s["max_rescues"]
    return SpoolSettings(
        lease_seconds=validate_seconds("lease_seconds", s["lease_seconds"], positive=True),
        max_attempts=validate_int("max_attempts", s["max_attempts"], minimum=1),
        retry_base_seconds=validate_seconds("retry_base_seconds", s["retry_base_seconds"]),
        retry_max_seconds=validate_seconds("retry_max_seconds", s["retry_max_seconds"]),
        keep_terminal=validate_int("keep_terminal", s["keep_terminal"], minimum=0),
        max_rescues=None if rescues is None else validate_int("max_rescues", rescues,
                                                               minimum=1),
        prepare_grace_seconds=validate_seconds("prepare_grace_seconds",
                                               s["prepare_grace_seconds"]),
        keep_terminal_seconds=None if kts is None else validate_seconds(
            "keep_terminal_seconds", kts),
        max_job_bytes=validate_int("max_job_bytes", s["max_job_bytes"], minimum=1024,
                                   maximum=MAX_JOB_BYTES_LIMIT),
        keep_dead=None if s.get("keep_dead") is None else validate_int(
            "keep_dead", s["keep_dead"], minimum=0))


def check_process_options(*, pool_size: object, reconnect_seconds: object, max_due: object,
                          max_lag_seconds: object, clock: object, durable: object = True,
                          sync_mode: object = "auto", read_only: object = False) -> None:
    """This process's own options (not stored): the file spool's rules (`ProcessOptions`)
    for the ones both stores take (`durable` and `sync_mode` too: ignored here, but one
    configuration serves both stores, so a bad value is refused on both), and the pool's."""
    from jobspool.queue.options import ProcessOptions

    ProcessOptions(clock=time.time if clock is None else clock,  # type: ignore[arg-type]
                   max_due=max_due, max_lag_seconds=max_lag_seconds,  # type: ignore[arg-type]
                   durable=durable, sync_mode=sync_mode, read_only=read_only)  # type: ignore[arg-type]
    validate_int("pool_size", pool_size, minimum=1)
    validate_seconds("reconnect_seconds", reconnect_seconds)


def _restore_fence(conn: psycopg.Connection[Any], where: str, *, create: bool) -> None:
    """A writing open of a schema whose token sequence is gone: recreated above every token
    the jobs hold (as a file spool rebuilds a deleted fence file), when this open may
    create; refused in one line otherwise. Every command failed on it before, `init`
    included ('relation "jobspool_fence" does not exist')."""
    import psycopg

    if not create:
        raise SpoolError(f"{where}: {FENCE_GONE}")
    try:
        top = restore_fence(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SpoolError(f"database {where}: {one_line(exc)}: the token sequence "
                         "jobspool_fence is missing and this role may not create it; run "
                         "`jobspool init` as a role that may create in the schema") from None
    if top is not None:
        log.warning("%s: the token sequence jobspool_fence was missing (a dump restored "
                    "without it?); recreated at %d, above every token the jobs hold. "
                    "%s", where, top, _GRANT_AGAIN)


_MAY_WRITE = """
SELECT has_table_privilege('jobspool_jobs', 'INSERT')
   AND has_table_privilege('jobspool_jobs', 'UPDATE')
   AND has_table_privilege('jobspool_jobs', 'DELETE')
   AND has_sequence_privilege('jobspool_fence', 'USAGE')
"""


def _check_may_write(conn: psycopg.Connection[Any], where: str) -> None:
    """Refuse at once, in one line, a writing open by a role that may only read: its
    first claim would fail on every retry instead (a worker's supervisor backs off)."""
    row = conn.execute(_MAY_WRITE).fetchone()
    if not (row and row[0]):
        raise SpoolError(f"database {where}: this role may not write the jobspool tables "
                         "(it needs INSERT, UPDATE, DELETE on jobspool_jobs and USAGE on the "
                         "jobspool_fence sequence); reading commands work with SELECT alone")
