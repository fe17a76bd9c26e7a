"""`check_health(spool)`: an `ok` / `degraded` verdict with reasons an operator can act on.

`jobspool health` prints it and exits 0 when ok, 2 when degraded, so a cron
job, a container healthcheck or a monitoring probe can use the exit code
alone. Each reason has a stable `code` (for alert rules), a `message` that
names what to look at and the command that helps, and the `value` that
tripped it.

| code                    | degraded when                                                  |
|-------------------------|----------------------------------------------------------------|
| `dead_letters`          | any job is in `dead_letter/`                                   |
| `queue_not_draining`    | the oldest due job has waited more than `max_due_age`          |
| `expired_leases`        | a lease expired (plus `lease_grace`) and nothing reclaimed it  |
| `dead_holders`          | an unexpired lease is held by a process that is gone (its      |
|                         | liveness file unlocked); `recover` takes it back at once       |
| `fence_behind`          | the fence counter is below a token a lease holds: tokens could |
|                         | be issued twice (a restored backup, a sequence reset by hand)  |
| `fence_unreadable`      | a file spool's `fence` file is missing, unreadable or holds no |
|                         | counter (deleted or edited by hand)                            |
| `stale_prepared`        | a prepared job is older than `prepare_grace_seconds`           |
| `quarantined_files`     | `quarantine/` holds files                                      |
| `maintenance_stale`     | a projection table has not been maintained successfully for    |
|                         | 3x `maintenance_cadence` although maintenance was attempted    |
| `maintenance_failing`   | a table's optimize failed `max_maintenance_failures` times in  |
|                         | a row (lost commit races are `deferred`, never counted)        |
| `unreadable_files`      | a state directory holds a file that is not a readable job      |
|                         | (claims skip it: the job it should be never runs)              |
| `no_read_access`        | this user may not read some job files (a reader whose access   |
|                         | was granted by a one-time chmod): those jobs go unchecked      |
| `ready_not_claimed`     | a file has sat in `ready/` longer than `max_due_age` since it  |
|                         | arrived there (by its ctime): e.g. placed by hand where no     |
|                         | worker for its kind looks                                      |
| `low_disk_space`        | the spool's filesystem has less than `min_free_bytes` or       |
|                         | `min_free_percent` free (a full disk fails every write)        |
| `worker_stale`          | a worker's metrics file under `metrics/` was last written more |
|                         | than `worker_stale` seconds ago (it refreshes every 5 s while  |
|                         | its loop runs: the worker is stuck, or died without cleanup)   |
| `projection_not_found`  | `projection=` names a local directory that does not exist (a   |
|                         | typo would otherwise read as "nothing to report")              |
| `state_dir_not_writable`| a directory of the spool is not writable by its owner (asked   |
|                         | by the owner: a mode changed by hand)                          |

Cost: one listing of every state directory (`Spool.stats`), plus one
lock-free read of every job file to find unreadable ones (as `stats
--prometheus` does; terminal states are bounded by retention), one `lstat`
per file in `ready/`, one `statvfs`, the worker metrics files and the
projection's maintenance state file. Nothing is written, so read access to
the spool is enough (`Spool(root, read_only=True)`).

Time: spool rules use the spool's clock (`spool.now()`). Maintenance
timestamps are wall-clock seconds written by `maintain`; they are compared
with the same `spool.now()`, which is the wall clock unless a test injects
another. File times (a ready file's arrival, a worker's metrics file) are
the filesystem's and are compared with the wall clock (`time.time()`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from jobspool.health.host import disk_figures, host_reasons
from jobspool.health.reasons import Health, Reason, default_projection
from jobspool.health.reasons import ids as _ids
from jobspool.health.reasons import plural as _plural
from jobspool.queue.states import JobState
from jobspool.queue.store import JOB_SUFFIX, ignored_name
from jobspool.queue.unreadable import reported_once

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI as Spool
    from jobspool.queue.stats import Stats

DEFAULT_MAX_DUE_AGE = 300.0
DEFAULT_MAINTENANCE_CADENCE = 60.0  # MaintenanceBeat's default interval
DEFAULT_MAX_MAINTENANCE_FAILURES = 3
DEFAULT_MIN_FREE_BYTES = 100 * 1024 * 1024
DEFAULT_MIN_FREE_PERCENT = 1.0
DEFAULT_WORKER_STALE = 60.0  # workers rewrite their metrics file every 5 s
# Job files one check reads for damage (~0.3 s warm, ~1 s from a cold cache here); a
# deeper spool is sampled (`_unreadable_files`).
MAX_FILES_READ = 10_000

# Seam for tests (a clock for file times).
wall_clock = time.time
P = ParamSpec("P")


def expired_reason(ids: list[str], total: int) -> Reason:
    """`expired_leases`, with the same text on every store (one alert rule serves both)."""
    return Reason("expired_leases",
                  f"{_plural(total, 'lease')} expired and not reclaimed ({_ids(ids, total)}): "
                  "workers died and nothing recovered; run `jobspool recover` or start a "
                  "worker for their kinds", total)


def stale_prepared_reason(ids: list[str], total: int, grace: float) -> Reason:
    """`stale_prepared`, with the same text on every store (one alert rule serves both)."""
    return Reason("stale_prepared",
                  f"{_plural(total, 'prepared job')} older than the replay grace ({grace:g} s): "
                  f"a producer died between prepare and commit ({_ids(ids, total)}); run "
                  "`jobspool recover --app MODULE:ATTR` with replay hooks, or look at "
                  "`jobspool list --state prepared`", total)


def queue_reasons(stats: Stats, max_due_age: float) -> list[Reason]:
    """The reasons every store reports from its counts: dead letters, a queue not draining."""
    reasons: list[Reason] = []
    dead = stats.counts.get(JobState.DEAD_LETTER.value, 0)
    if dead:
        reasons.append(Reason(
            "dead_letters",
            f"{_plural(dead, 'dead-lettered job')}: inspect them with `jobspool list --state "
            f"dead_letter` (last_error says why), then `jobspool requeue ID` or `--all-dead`",
            dead))
    age = stats.oldest_due_age
    if age is not None and age > max_due_age:
        reasons.append(Reason(
            "queue_not_draining",
            f"the oldest due job has waited {age:.0f} s (bound {max_due_age:g} s) with "
            f"{stats.due} due: are workers running for its kind? see `jobspool stats --by-kind`",
            round(age, 3)))
    return reasons


def check_max_files_read(max_files_read: object) -> None:
    """`ValueError` unless a whole number >= 0 (both stores' health take it)."""
    if isinstance(max_files_read, bool) or not isinstance(max_files_read, int) \
            or max_files_read < 0:
        raise ValueError(f"max_files_read must be a whole number >= 0, not {max_files_read!r}")


# How long `health` waits for the spool lock before it reports the lock held instead: it
# answers a container's HEALTHCHECK or a cron probe, and waited as long as the holder did.
HEALTH_LOCK_WAIT = 5.0


def _lock_bounded(check: Callable[Concatenate[Spool, P], Health]
                  ) -> Callable[Concatenate[Spool, P], Health]:
    """`check`, after asking whether the file spool's lock can be taken within
    `HEALTH_LOCK_WAIT` s (`lockwait.free_within`); a lock held longer (by another process,
    or another thread of this one) is the verdict: "degraded", nothing else checked."""

    def bounded(spool: Spool, /, *args: P.args, **kwargs: P.kwargs) -> Health:
        from jobspool.queue import lockwait

        path = lockwait.held_too_long(spool, HEALTH_LOCK_WAIT)
        if path is None:
            return check(spool, *args, **kwargs)
        return Health(reasons=[Reason(
            "lock_held", f"the spool lock {path} has been held for over "
            f"{HEALTH_LOCK_WAIT:g} s (a long fenced block, or a stopped or stuck process: "
            f"every writer waits for it); nothing else was checked. Is a process stopped "
            f"(`ps -o stat` shows T) or hung inside `ctx.fenced()`? `fuser {path}` names "
            "the processes that have it open", HEALTH_LOCK_WAIT)],
            root=str(spool.root), checked_at=wall_clock(), figures={})

    # (not functools.wraps: mypy loses the ParamSpec through it)
    bounded.__name__, bounded.__doc__ = check.__name__, check.__doc__
    return bounded


@_lock_bounded
@reported_once()
def check_health(
    spool: Spool,
    *,
    max_due_age: float = DEFAULT_MAX_DUE_AGE,
    projection: str | os.PathLike[str] | None = None,
    lease_grace: float = 0.0,
    maintenance_cadence: float = DEFAULT_MAINTENANCE_CADENCE,
    max_maintenance_failures: int = DEFAULT_MAX_MAINTENANCE_FAILURES,
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
    min_free_percent: float = DEFAULT_MIN_FREE_PERCENT,
    worker_stale: float = DEFAULT_WORKER_STALE,
    max_files_read: int = MAX_FILES_READ,
) -> Health:
    """Check a spool (and its projection's maintenance) and return the verdict with reasons.

    `projection` is the LanceDB URI whose maintenance state to read; it
    defaults to `<root>/index` when that directory exists. A remote URI has
    no local state file and adds no reasons. `lease_grace` tolerates leases
    that expired that recently (a worker about to reclaim them).
    `min_free_bytes` / `min_free_percent` bound the free space of the
    spool's filesystem; `worker_stale` is the age in seconds past which a
    worker's metrics file means a stuck or vanished worker. At most
    `max_files_read` job files are read for damage (a deeper spool is checked
    on a sample, the live states first: the figures `job_files_read` and
    `job_files` say how much); `fsck` reads every file.
    """
    check_options(max_due_age=max_due_age, lease_grace=lease_grace,
                  maintenance_cadence=maintenance_cadence,
                  max_maintenance_failures=max_maintenance_failures,
                  min_free_bytes=min_free_bytes, min_free_percent=min_free_percent,
                  worker_stale=worker_stale)
    check_max_files_read(max_files_read)
    stats = spool.stats()
    now = stats.now
    reasons = queue_reasons(stats, max_due_age)

    leased = list(spool.jobs(JobState.LEASED))
    expired = [j.id for j in leased
               if j.lease is not None and j.lease.expires_at <= now - lease_grace]
    if expired:
        reasons.append(expired_reason(expired, len(expired)))
    ceiling, fence_problem = _fence_ceiling(spool)
    if fence_problem is not None:
        reasons.append(Reason(
            "fence_unreadable",
            f"the fence file {fence_problem}: " + (
                "workers restart tokens above the clock (a power loss before its data "
                "reached the disk leaves it so); run `jobspool recover` to rewrite it"
                if fence_problem in ("is empty", "is missing") else
                "a worker that opens the spool now cannot tell which tokens were handed "
                "out; run `jobspool recover` (it rebuilds the file above every token on "
                "disk)"), 1))
    behind = fence_behind_reason(ceiling, [(j.lease.token, j.id) for j in leased
                                           if j.lease is not None])
    if behind is not None:
        reasons.append(behind)
    lapsed = set(expired)
    orphaned = _held_by_the_dead(spool, [j for j in leased if j.id not in lapsed])
    if orphaned:
        reasons.append(Reason(
            "dead_holders",
            f"{_plural(len(orphaned), 'lease')} held by a process that is gone "
            f"({_ids(orphaned)}): their jobs wait until the leases expire; run `jobspool "
            "recover` (or start a worker for their kinds) to take them back now",
            len(orphaned)))

    stuck = _stale_prepared(spool, now - spool.prepare_grace_seconds)
    if stuck:
        reasons.append(stale_prepared_reason(stuck, len(stuck), spool.prepare_grace_seconds))

    if stats.quarantined:
        reasons.append(Reason(
            "quarantined_files",
            f"{_plural(stats.quarantined, 'unreadable file')} in {spool.root / 'quarantine'}: "
            f"`jobspool quarantine list` says why each was moved; repair one in place and "
            f"`jobspool quarantine restore ID`, or `jobspool quarantine purge` them",
            stats.quarantined))

    unreadable, read, listed = _unreadable_files(spool, max_files_read)
    # A file this user may not open is not a broken job (its owner's workers read it fine):
    # it is a gap in what this check can see, so say that, not "run recover".
    denied = [p for p in unreadable if _denied(spool, p)]
    unreadable = [p for p in unreadable if p not in denied]
    if denied:
        reasons.append(Reason(
            "no_read_access",
            f"{_plural(len(denied), 'job file')} this user may not read ({_ids(denied)}): "
            f"they are not checked; a spool's files are written with its saved access mode, "
            f"so a one-time chmod does not cover later ones — create it with `jobspool init "
            f"--access group-read` and run this check as a member of its group",
            len(denied)))
    if unreadable:
        reasons.append(Reason(
            "unreadable_files",
            f"{_plural(len(unreadable), 'unreadable file')} in state directories "
            f"({_ids(unreadable)}): claims skip them, so those jobs never run; run `jobspool "
            f"recover` to quarantine them, then `jobspool quarantine show`",
            len(unreadable)))

    waiting = _ready_not_claimed(spool, max_due_age)
    if waiting:
        reasons.append(Reason(
            "ready_not_claimed",
            f"{_plural(len(waiting), 'job file')} sat in ready/ over {max_due_age:g} s since "
            f"arriving ({_ids(waiting)}): no worker took them; is a worker running for their "
            f"kind? (a file placed by hand is noticed by workers within seconds)",
            len(waiting)))

    locked = _unwritable_dirs(spool)
    if disk_figures(spool).get("read_only_fs"):
        reasons.append(Reason(
            "state_dir_not_writable",
            f"the filesystem holding {spool.root} is mounted read-only: workers fail every "
            f"change; remount it read-write", 1))
    elif locked:
        reasons.append(Reason(
            "state_dir_not_writable",
            f"{_plural(len(locked), 'directory')} of the spool its owner may not write "
            f"({', '.join(locked)}): workers fail every change there; restore the mode "
            f"(`chmod u+w`)", len(locked)))

    local, local_figures = host_reasons(
        spool, now=now, projection=projection, maintenance_cadence=maintenance_cadence,
        max_maintenance_failures=max_maintenance_failures, min_free_bytes=min_free_bytes,
        min_free_percent=min_free_percent, worker_stale=worker_stale)
    reasons.extend(local)
    figures = {"counts": dict(stats.counts), "due": stats.due,
               "oldest_due_age": stats.oldest_due_age, "fence": stats.fence,
               "quarantined": stats.quarantined, "expired_leases": len(expired),
               "stale_prepared": len(stuck), "unreadable_files": len(unreadable),
               "no_read_access": len(denied), "ready_not_claimed": len(waiting),
               "job_files_read": read, "job_files": listed, **local_figures}
    return Health(reasons=reasons, root=str(spool.root), checked_at=now, figures=figures)


def check_options(*, max_due_age: float, lease_grace: float, maintenance_cadence: float,
                  max_maintenance_failures: int, min_free_bytes: int, min_free_percent: float,
                  worker_stale: float) -> None:
    """Refuse a bad threshold (`ValueError`, one line naming it), whatever the store."""
    if not max_due_age > 0:
        raise ValueError(f"max_due_age must be a positive number, not {max_due_age!r}")
    if not maintenance_cadence > 0:
        raise ValueError(f"maintenance_cadence must be a positive number, not "
                         f"{maintenance_cadence!r}")
    if lease_grace < 0:
        raise ValueError(f"lease_grace must not be negative, not {lease_grace!r}")
    if max_maintenance_failures < 1:
        raise ValueError(f"max_maintenance_failures must be at least 1, not "
                         f"{max_maintenance_failures!r}")
    if not min_free_bytes >= 0:
        raise ValueError(f"min_free_bytes must not be negative, not {min_free_bytes!r}")
    if not 0 <= min_free_percent <= 100:
        raise ValueError(f"min_free_percent must be between 0 and 100, not {min_free_percent!r}")
    if not worker_stale > 0:
        raise ValueError(f"worker_stale must be a positive number, not {worker_stale!r}")


def _unwritable_dirs(spool: Spool) -> list[str]:
    """The spool's directories its owner may not write, when the owner is asking (a reader
    of a read-only spool is not told about its own access: that is how it should be). A
    state directory made read-only by hand made every worker fail its loop while `health`
    said ok."""
    from jobspool.queue.states import ALL_STATES

    out = []
    for name in (*(s.value for s in ALL_STATES), "tmp"):
        path = Path(spool.root) / name
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.geteuid() and not os.access(path, os.W_OK | os.X_OK):
            out.append(f"{name}/")
    return out


def _held_by_the_dead(spool: Spool, leased: list[Any]) -> list[str]:
    """Unexpired leases whose process is known dead (its liveness file unlocked: a crash,
    or an exit holding leases): health said ok until they expired, `recover` takes them
    back at once."""
    from jobspool.queue import liveness

    verdicts: dict[str, str] = {}
    out: list[str] = []
    for job in leased:
        proc = job.lease.proc if job.lease is not None else None
        if not proc:
            continue
        if proc not in verdicts:
            verdicts[proc] = liveness.probe(Path(spool.root), proc)[0]
        if verdicts[proc] == liveness.Verdict.DEAD:
            out.append(job.id)
    return out


def _fence_ceiling(spool: Spool) -> tuple[int | None, str | None]:
    """The fence counter on disk, or what is wrong with its file (a file spool's; fsck
    named a missing, unreadable or garbled one and health said ok)."""
    from jobspool.queue.fence import FENCE_FILE, decode_fence
    from jobspool.queue.journal import journal_of

    journal = journal_of(spool)
    if journal is None:
        return None, None
    try:
        data = journal.store.read("", FENCE_FILE)
        if not data:
            return None, "is empty"
        return decode_fence(data), None
    except FileNotFoundError:
        return None, "is missing"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    except ValueError:
        return None, "does not hold a counter"


def fence_behind_reason(fence: int | None, held: Iterable[tuple[int, str]],
                        total: int | None = None) -> Reason | None:
    """`fence_behind` when a held lease's token (`held`: token, job id) is above the counter:
    the next claims would hand out tokens a live holder has (fsck said so; health, ok).
    `total`: how many leases are above it, when `held` is only the highest of them."""
    if fence is None:
        return None
    above = sorted(((token, job_id) for token, job_id in held if token > fence), reverse=True)
    if not above:
        return None
    token, job_id = above[0]
    count = max(len(above), total or 0)
    return Reason("fence_behind",
                  f"the fence counter ({fence}) is below token {token} held by {job_id} "
                  f"({_plural(count, 'lease')} above it): tokens could be issued twice; "
                  "run `jobspool recover` (it raises the fence above every token)", count)


def _stale_prepared(spool: Spool, cutoff: float) -> list[str]:
    """Prepared jobs last touched at or before `cutoff` — the rule recovery replays by."""
    return [job.id for job in spool.jobs(JobState.PREPARED) if job.updated_at <= cutoff]


def _unreadable_files(spool: Spool, limit: int) -> tuple[list[str], int, int]:
    """`state/name` of each file in a state directory that is not a readable job, confirmed
    by a second read under the lock (a lock-free read can race a recycled file, scan.py);
    with how many files were read for it, of how many listed. Bounded: reading every file
    took `health` 5 s (24 s from a cold cache) at 200,000 ready jobs, past the timeout of
    any probe that runs it, and the dashboard's overview waited as long."""
    from jobspool.queue.journal import journal_of
    from jobspool.recovery.quarantine import confirm
    from jobspool.recovery.scan import sample_spool

    journal = journal_of(spool)
    if journal is None:
        return [], 0, 0  # only files can be unreadable
    scan, read, listed = sample_spool(journal, limit)
    if not scan.bad:
        return [], read, listed
    with journal.lock.hold():
        confirmed = [confirm(journal, bad) for bad in scan.bad]
    return sorted(bad.path for bad in confirmed if bad is not None), read, listed


def _denied(spool: Spool, path: str) -> bool:
    """Whether `state/name` exists but this process may not read it (a permission gap, not
    a damaged file)."""
    full = Path(spool.root) / path
    return os.path.isfile(full) and not os.access(full, os.R_OK)


def _ready_not_claimed(spool: Spool, max_due_age: float) -> list[str]:
    """Ids of files in `ready/` that arrived (ctime: the rename into ready/) over
    `max_due_age` seconds ago."""
    directory = Path(spool.root) / JobState.READY.value
    cutoff = wall_clock() - max_due_age
    out: list[str] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if not entry.name.endswith(JOB_SUFFIX) or ignored_name(entry.name):
                    continue
                try:
                    arrived = entry.stat(follow_symlinks=False).st_ctime
                except FileNotFoundError:
                    continue  # claimed meanwhile
                if arrived <= cutoff:
                    out.append(entry.name[: -len(JOB_SUFFIX)])
    except FileNotFoundError:
        return []
    return sorted(out)


__all__ = ["Health", "Reason", "check_health", "default_projection", "host_reasons"]
