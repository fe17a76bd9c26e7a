"""What `health` checks on this machine whatever the store: free space and inodes where
the spool's local files live, workers that stopped refreshing their metrics files, workers
that cannot write their projection, and the projection's maintenance record."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from jobspool.health.reasons import STALE_FACTOR, Reason, default_projection, ids, plural

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI as Spool

# Seams for tests (a nearly full disk, a clock for file times).
os_statvfs = os.statvfs
wall_clock = time.time

# Outcomes that count as "maintenance is doing its job" besides `optimized`:
# nothing changed since the last success, or the table is gone.
_FINE_SKIPS = ("unchanged since", "table does not exist")


def host_reasons(spool: Any, *, now: float, projection: str | os.PathLike[str] | None,
                 maintenance_cadence: float, max_maintenance_failures: int,
                 min_free_bytes: int, min_free_percent: float, worker_stale: float
                 ) -> tuple[list[Reason], dict[str, Any]]:
    """What is checked on this machine, whatever the store: the free space where the spool's
    local files live (a file spool's root; a database spool's local directory: metrics, the
    default projection), workers that stopped refreshing their metrics files, and the
    projection's maintenance. A database spool ignored all of these (health said ok with a
    worker dead or a projection path that did not exist)."""
    reasons: list[Reason] = []
    disk = _disk_reason(spool, min_free_bytes, min_free_percent)
    if disk is not None:
        reasons.append(disk)

    stale_workers = _stale_workers(spool, worker_stale)
    if stale_workers:
        reasons.append(Reason(
            "worker_stale",
            f"{plural(len(stale_workers), 'worker')} stopped refreshing its metrics file for "
            f"over {worker_stale:g} s ({ids(stale_workers)}): stuck, or died without "
            f"cleaning up (a worker started on the same host removes a dead one's file); if "
            f"it is gone, delete its file under {spool.root / 'metrics'}",
            len(stale_workers)))

    failing = _failing_projections(spool, worker_stale)
    if failing:
        reasons.append(Reason(
            "projection_unwritable",
            f"{plural(len(failing), 'worker')} cannot write the projection for its storage "
            f"right now ({ids(failing)}): their jobs are deferred, not run; see the worker's "
            f"log (read-only, full, damaged table, object store down)", len(failing)))

    uri = os.fspath(projection) if projection is not None else default_projection(spool)
    if projection is not None and uri is not None and not _local_dir_exists(uri):
        reasons.append(Reason(
            "projection_not_found",
            f"projection {uri!r} is not a directory: its maintenance cannot be checked "
            f"(is the path right? the default is {spool.root / 'index'})", 1))
    if uri is not None:
        reasons.extend(_maintenance_reasons(uri, now, maintenance_cadence,
                                            max_maintenance_failures))
    return reasons, {"projection": uri, "stale_workers": len(stale_workers),
                     **disk_figures(spool)}


def _local_dir_exists(uri: str) -> bool:
    """True for a local directory that exists, and for any remote URI (not checked here)."""
    from jobspool.projection.objectstore import local_path

    local = local_path(uri)
    return local is None or os.path.isdir(local)


def disk_figures(spool: Spool) -> dict[str, Any]:
    try:
        st = os_statvfs(spool.root)
    except OSError:
        return {"free_bytes": None, "free_percent": None}
    free = st.f_bavail * st.f_frsize
    percent = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else 100.0
    # Inodes too: every job file is one; a filesystem out of them refuses every new job
    # file however many bytes are free (f_files is 0 where there is no fixed count).
    inodes = 100.0 * st.f_favail / st.f_files if st.f_files else 100.0
    return {"free_bytes": free, "free_percent": round(percent, 3),
            "free_inodes": st.f_favail if st.f_files else None,
            "free_inodes_percent": round(inodes, 3),
            "read_only_fs": bool(st.f_flag & os.ST_RDONLY)}


def _disk_reason(spool: Spool, min_bytes: int, min_percent: float) -> Reason | None:
    figures = disk_figures(spool)
    free, percent = figures["free_bytes"], figures["free_percent"]
    if free is None or percent is None:
        return None
    inodes = figures["free_inodes_percent"]
    short_space = free < min_bytes or percent < min_percent
    short_inodes = inodes < min_percent
    if not short_space and not short_inodes:
        return None
    # Both when both are short: naming the inodes alone hid a disk out of space.
    parts = []
    if short_space:
        parts.append(f"{free / 2**20:.1f} MiB free ({percent:.2f} %; bounds "
                     f"{min_bytes / 2**20:.1f} MiB and {min_percent:g} %)")
    if short_inodes:
        parts.append(f"{figures['free_inodes']} inodes free ({inodes:.2f} %; bound "
                     f"{min_percent:g} %, df -i)")
    if getattr(spool, "url", None) is not None:
        # A database's spool: this directory holds worker metrics, progress and the
        # default projection, not jobs, so pruning frees nothing here.
        advice = "workers' metrics, progress and the default projection will fail; free space"
    else:
        advice = ("every new job file will fail; prune (`jobspool prune`) or free space"
                  if short_inodes else "writes will start failing; prune (`jobspool prune`) "
                  "or free space")
    return Reason("low_disk_space",
                  f"the filesystem holding {spool.root} has {' and '.join(parts)}: {advice}",
                  free if short_space else figures["free_inodes"])


def _stale_workers(spool: Spool, stale_after: float) -> list[str]:
    """Owners of worker metrics files (`metrics.publish_worker_report`) older than
    `stale_after` seconds; a file that cannot be read counts by its modification time."""
    from jobspool.metrics import metrics_dirs

    now = wall_clock()
    out: list[str] = []
    for directory in metrics_dirs(spool):
        out += _stale_in(directory, now, stale_after)
    return out


def _stale_in(directory: Path, now: float, stale_after: float) -> list[str]:
    out: list[str] = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:  # none yet, or a reader who may not list it: nothing to judge
        return []
    for name in names:
        path = directory / name
        try:
            raw = path.read_bytes()
            written = path.stat().st_mtime
        except FileNotFoundError:
            continue  # the worker exited cleanly meanwhile
        except OSError:
            continue
        owner = name[: -len(".json")]
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            at = _number(doc.get("written_at"))
            written = at if at is not None else written
            owner = doc["owner"] if isinstance(doc.get("owner"), str) else owner
        if now - written > stale_after:
            out.append(owner)
    return out


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _maintenance_reasons(uri: str, now: float, cadence: float, max_failures: int
                         ) -> list[Reason]:
    from jobspool.projection.maintenance_state import read_maintenance_state

    state = read_maintenance_state(uri)
    tables = state.get("tables")
    if not isinstance(tables, dict):
        return []
    out: list[Reason] = []
    bound = STALE_FACTOR * cadence
    for name in sorted(tables):
        entry = tables[name]
        if not isinstance(entry, dict):
            continue
        failures = entry.get("consecutive_failures")
        reason = str(entry.get("last_reason") or "")
        if isinstance(failures, int) and not isinstance(failures, bool) and \
                failures >= max_failures:
            out.append(Reason(
                "maintenance_failing",
                f"projection table {name!r} at {uri}: optimize failed {failures} times in a row, "
                f"last: {reason[:200] or 'no reason recorded'}; run `jobspool maintain --tables "
                f"{name}` and read its error",
                failures))
            continue
        outcome = entry.get("last_outcome")
        fine = outcome == "optimized" or (outcome == "skipped" and reason.startswith(_FINE_SKIPS))
        if fine or outcome is None:
            continue
        # Maintenance was attempted and did not succeed: how long since it last did?
        since = _number(entry.get("last_success"))
        if since is None:
            since = _number(entry.get("first_attempt"))
        if since is None or now - since <= bound:
            continue
        out.append(Reason(
            "maintenance_stale",
            f"projection table {name!r} at {uri}: no successful maintenance for "
            f"{now - since:.0f} s (over 3x the {cadence:g} s cadence), last outcome {outcome}: "
            f"{reason[:200] or 'no reason recorded'}; run `jobspool maintain --tables {name}`",
            round(now - since, 3)))
    return out


def _failing_projections(spool: Any, stale_after: float) -> list[str]:
    from jobspool.metrics import failing_projections

    try:
        return failing_projections(spool, stale_after=stale_after)
    except OSError:
        return []
