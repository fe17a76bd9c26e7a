"""What the dashboard shows, read through the public `Spool` API: overview, pages, one job.

Nothing here renders HTML; the views and the JSON endpoints share these
snapshots. Costs, because a dashboard left open polls all day:

- the overview lists each state directory once (`stats()`) and reads only
  `leased/` (live workers) and `prepared/` (health) files; counts per kind
  read every job file, so they are cached and refreshed at most every
  `20 x` what the last pass took (never more often than every 5 s), in the
  background after the first (requests get the last counts meanwhile);
- a list page lists its state directory once and reads only the files it
  shows — plus, with a kind or error filter, the files it has to look at to
  fill the page, at most `SCAN_BUDGET` of them, starting after the cursor.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import InvalidJob, JobNotFound, UnreadableJob
from jobspool.queue.states import ALL_STATES, CANCELABLE, REQUEUEABLE, TERMINAL, JobState

if TYPE_CHECKING:
    from jobspool.queue.job import Job
    from jobspool.queue.spool import Spool
    from jobspool.queue.stats import Stats

log = logging.getLogger("jobspool.dashboard")

PAGE_SIZE = 50
SCAN_BUDGET = 2000
LIVE_SECONDS = 30.0
# Leases listed per worker in the overview (expired first, then the soonest to expire);
# `running_total` counts them all. Every lease of every worker went out on each refresh:
# 608 KB a second at 6,000 leases, for a page that shows four per worker.
RUNNING_SHOWN = 20
_KIND_MIN_INTERVAL = 5.0
_KIND_COST_FACTOR = 20.0
# How long a request waits for the first per-kind pass before the page is served without
# it ("counting"): a small spool's pass is done by then, a deep one fills in when polled.
_KIND_FIRST_WAIT = 2.0


def newest_first(state: JobState) -> bool:
    """Terminal lists show the latest outcome first; live ones show the next to run first."""
    return state in TERMINAL


def list_ids(spool: Spool, state: JobState) -> list[str]:
    """Job ids in one state, in display order, from one directory listing (no file reads)
    or, on PostgreSQL, one query of ids alone."""
    store = getattr(spool, "store", None)
    names = getattr(store, "names", None)
    of_state = getattr(spool, "state_ids", None)
    ids = (sorted(names(state.value)) if callable(names)
           else list(of_state(state)) if callable(of_state)
           else sorted(j.id for j in spool.jobs(state)))
    if newest_first(state):
        ids.reverse()
    return ids


@dataclass(frozen=True)
class Page:
    """One page of a filtered list and how to get the next one."""

    state: JobState
    jobs: list[Job]
    total: int  # jobs in the state (unfiltered)
    next_cursor: str | None  # the last id looked at, when more may follow
    scanned: int  # files read to fill this page
    truncated: bool  # the scan budget ran out before the page was full


def _matches(job: Job, kind: str | None, text: str | None) -> bool:
    if kind is not None and job.kind != kind:
        return False
    if text:
        needle = text.casefold()
        hay = (job.id, job.last_error or "", getattr(job, "traceback", None) or "")
        return any(needle in h.casefold() for h in hay)
    return True


def page(spool: Spool, state: JobState, *, kind: str | None = None, text: str | None = None,
         cursor: str | None = None, size: int = PAGE_SIZE, budget: int = SCAN_BUDGET) -> Page:
    """The jobs of `state` after `cursor` (an id) that match the filters, at most `size`."""
    ids = list_ids(spool, state)
    start = 0
    if cursor:
        if newest_first(state):
            # ids descend: skip every id at or above the cursor
            start = len(ids) - bisect.bisect_left(ids[::-1], cursor)
        else:
            start = bisect.bisect_right(ids, cursor)
    out: list[Job] = []
    scanned = 0
    end = start
    filtered = bool(kind or text)
    while end < len(ids) and len(out) < size and not (filtered and scanned >= budget):
        job_id = ids[end]
        end += 1
        scanned += 1
        try:
            job = _get(spool, job_id)
        except UnreadableJob as exc:
            # One damaged (or private) file must not hide the readable jobs of its state
            # (a 503 for the whole list): skipped, as `list` skips it.
            log.warning("%s", exc)
            continue
        except InvalidJob as exc:  # a file named by hand ("has space.json"): not a job
            log.warning("%s/%s.json is not a job file: %s", state.value, job_id, exc)
            continue
        if job is None or job.state is not state or not _matches(job, kind, text):
            continue
        out.append(job)
    more = end < len(ids)
    return Page(state=state, jobs=out, total=len(ids),
                next_cursor=ids[end - 1] if more and end > start else None,
                scanned=scanned, truncated=more and len(out) < size)


def _get(spool: Spool, job_id: str) -> Job | None:
    try:
        return spool.get(job_id)
    except JobNotFound:
        return None  # finished and pruned, or never there: nothing to show


def get_job(spool: Spool, job_id: str) -> Job | None:
    """One job, or None (an invalid id is a `ValueError`/`InvalidJob` for the caller)."""
    return _get(spool, job_id)


def can_requeue(job: Job) -> bool:
    """Whether the requeue button belongs on this job (dead-lettered or canceled)."""
    return job.state in REQUEUEABLE


def can_cancel(job: Job) -> bool:
    """Whether the cancel button belongs on this job (not finished yet)."""
    return job.state in CANCELABLE


def timeline(job: Job) -> list[tuple[str, float]]:
    """The job's recorded moments, oldest first (ties keep this order: created, due, updated)."""
    points = [("created", job.created_at), ("due (run_at)", job.run_at),
              ("last updated", job.updated_at)]
    if job.lease is not None:
        points.append(("lease expires", job.lease.expires_at))
    return sorted(points, key=lambda p: p[1])


# ---------------------------------------------------------------- overview


@dataclass
class _KindCache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    at: float = float("-inf")
    interval: float = _KIND_MIN_INTERVAL
    by_kind: dict[str, dict[str, int]] | None = None
    refreshing: bool = False
    passed: threading.Event = field(default_factory=threading.Event)  # a pass ended


class Overview:
    """Builds the overview document; per-kind counts are cached (they read every file)."""

    def __init__(self, spool: Spool, *, max_due_age: float = 300.0) -> None:
        self.spool = spool
        self.max_due_age = max_due_age
        self._kinds = _KindCache()
        self._last_stats: Stats | None = None  # shown while the spool lock is held

    def by_kind(self) -> dict[str, dict[str, int]] | None:
        """Per-kind counts, from a pass in the background while requests get the last
        counts; None while the first pass has not ended within `_KIND_FIRST_WAIT` (the page
        says "counting"). Refreshed in a request, every page that came due for it waited
        the whole pass with the cache locked (12-14 s on a 325,000-job file spool); the
        first pass, in the request, kept the first page 23 s at 200,000 jobs."""
        cache = self._kinds
        with cache.lock:
            due = time.monotonic() - cache.at >= cache.interval  # at: -inf at first
            if due and not cache.refreshing:
                cache.refreshing = True
                cache.passed.clear()
                threading.Thread(target=self._refresh_in_background, daemon=True,
                                 name="jobspool-dashboard-kinds").start()
            first = cache.by_kind is None
        if first:
            cache.passed.wait(_KIND_FIRST_WAIT)
        with cache.lock:
            if cache.by_kind is None:
                return None
            return {k: dict(v) for k, v in cache.by_kind.items()}

    def _measure(self) -> tuple[dict[str, dict[str, int]], float]:
        """Per-kind counts, and how long to keep them (20 x what the pass took)."""
        t0 = time.monotonic()
        by_kind = self.spool.stats(by_kind=True).by_kind
        return by_kind, max(_KIND_MIN_INTERVAL, _KIND_COST_FACTOR * (time.monotonic() - t0))

    def _refresh_in_background(self) -> None:
        cache = self._kinds
        try:
            by_kind, interval = self._measure()
            with cache.lock:
                cache.by_kind, cache.interval, cache.at = by_kind, interval, time.monotonic()
        except Exception as exc:  # the spool closed, a store outage: a later request retries
            log.warning("dashboard: per-kind counts not refreshed: %s", exc)
            with cache.lock:
                cache.at = time.monotonic()  # not again at once
        finally:
            with cache.lock:
                cache.refreshing = False
                cache.passed.set()

    def snapshot(self, throughput: dict[str, Any] | None = None) -> dict[str, Any]:
        """Everything the overview page shows, as JSON-able data.

        Health first: it answers `lock_held` within its bound when another process holds
        the file spool's lock, and the counts (which wait for the lock) are then the last
        ones read, `counts_as_of` saying when. Counted first, the overview hung for as long
        as the lock was held (50 s behind a 50 s hold), just when the operator needed it,
        and never showed `lock_held`."""
        spool = self.spool
        health = spool.health(max_due_age=self.max_due_age)  # each store its own checks
        held = any(r.code == "lock_held" for r in health.reasons)
        stats = self._last_stats if held else None
        if stats is None:  # (held since this dashboard began: it waits, as it did)
            stats = self._last_stats = spool.stats()
        now = spool.now() if held else stats.now
        kinds = self.by_kind()
        return {
            "root": str(getattr(spool, "display", spool.root)),
            "now": now,
            "counts_as_of": stats.now,  # earlier than `now` while the lock is held
            "counts": dict(stats.counts),
            "total": stats.total,
            "due": stats.due,
            "scheduled": getattr(stats, "scheduled", 0),  # delayed: in retryable/, not due yet
            "oldest_due_age": stats.oldest_due_age,
            "fence": stats.fence,
            "quarantined": stats.quarantined,
            "by_kind": {k: {s.value: per.get(s.value, 0) for s in ALL_STATES}
                        for k, per in sorted((kinds or {}).items())},
            "by_kind_pending": kinds is None,  # the first count is still running
            "health": {"status": health.status,
                       "reasons": [r.to_dict() for r in health.reasons]},
            "workers": live_workers(spool, now),
            "throughput": throughput or {},
        }


def live_workers(spool: Spool, now: float) -> list[dict[str, Any]]:
    """Workers that published metrics recently, and every lease holder, with what each runs."""
    from jobspool.metrics import read_worker_reports

    # Workers publish every few seconds while they settle jobs; one that has said nothing
    # for LIVE_SECONDS is shown as quiet (busy with long jobs, stuck, or gone without
    # cleaning up: health tells those apart), and dropped once the metrics call it stale.
    reports = read_worker_reports(spool)
    fresh = read_worker_reports(spool, stale_after=LIVE_SECONDS)
    running: dict[str, list[dict[str, Any]]] = {}
    for job in spool.jobs(JobState.LEASED):
        if job.lease is None:
            continue
        running.setdefault(job.lease.owner, []).append({
            "id": job.id, "kind": job.kind, "attempts": job.attempts,
            "lease_left": round(job.lease.expires_at - now, 1),
            "expired": job.lease.expires_at <= now})
    out = []
    for owner in sorted(set(reports) | set(running)):
        counters = reports.get(owner)
        held = sorted(running.get(owner, []), key=lambda r: (r["lease_left"], r["id"]))
        out.append({"owner": owner, "publishing": counters is not None,
                    "quiet": counters is not None and owner not in fresh,
                    "counters": counters or {}, "running": held[:RUNNING_SHOWN],
                    "running_total": len(held),
                    "running_expired": sum(1 for r in held if r["expired"])})
    return out
