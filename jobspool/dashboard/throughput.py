"""Throughput over the last hour, per minute, from the run counters workers publish.

Workers leave their counters in `<root>/metrics/<owner>.json` every few
seconds (`jobspool.metrics.publish_worker_report`). Those are totals since
each worker started, so the dashboard samples them and keeps the increases
per minute in memory: a worker seen for the first time after the first
sample counts in full (it started meanwhile), one already there at the first
sample is a baseline, and a counter that went down (a restarted owner) counts
from zero. What happened before the dashboard started is filled in once from
the terminal jobs still on disk (their `updated_at`), so the chart is not
empty when it opens after a batch (`jobspool demo --dashboard`); retention
pruning bounds that pass.

A worker that exits leaves its last counters in `<owner>.final` (kept an
hour): what they add to the last snapshot seen of it is counted once, so a
run shorter than the 5 s between snapshots counts too. What it misses: in the
backfill, jobs that retention already pruned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobspool.metrics import MAX_COUNT
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool

BUCKET_SECONDS = 60
BUCKETS = 60
SERIES = ("completed", "failed")
_FAILED = ("retried", "dead_lettered")


class Throughput:
    """Per-minute completed and failed runs over the last hour (thread-safe)."""

    def __init__(self, spool: Spool, *, clock: Callable[[], float] = time.time) -> None:
        self.spool = spool
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, dict[str, int]] = {}
        self._last: dict[str, dict[str, Any]] | None = None
        self._finals: dict[str, float] = {}  # owner -> the final counters added (their time)
        self._ended: set[str] = set()  # owners whose last counters seen were a final
        self._started = clock()

    def _add(self, at: float, series: str, n: int) -> None:
        if n <= 0:
            return
        minute = int(at // BUCKET_SECONDS)
        bucket = self._buckets.setdefault(minute, {s: 0 for s in SERIES})
        bucket[series] += n

    def backfill(self) -> None:
        """Count terminal jobs that finished in the hour before the dashboard started."""
        since = self._started - BUCKETS * BUCKET_SECONDS
        seen: list[tuple[float, str]] = []
        for state, series in ((JobState.COMPLETED, "completed"),
                              (JobState.DEAD_LETTER, "failed")):
            for job in self.spool.jobs(state):
                if since <= job.updated_at < self._started:
                    seen.append((job.updated_at, series))
        with self._lock:
            for at, series in seen:
                self._add(at, series, 1)

    def sample(self) -> None:
        """Read the published worker counters and add what grew since the last sample."""
        from jobspool.metrics import read_final_reports, read_worker_reports

        reports = read_worker_reports(self.spool)
        # Workers that exited since we started: what their last counters add to the last
        # snapshot we saw of them (all of it for a run shorter than the snapshots' 5 s).
        finals = read_final_reports(self.spool, since=self._started)
        now = self.clock()
        with self._lock:
            first = self._last is None
            last = self._last or {}
            ended: set[str] = set()
            for owner, (written, began, counters) in finals.items():
                # One owner may run again (a `Worker` reused): a final is new by its time.
                if self._finals.get(owner) == written or owner in reports:
                    continue
                self._finals[owner] = written
                if owner not in last and (began is None or began < self._started):
                    # Never seen running, and begun before we looked: its earlier jobs are
                    # in the backfill, and its counters cannot tell them apart.
                    continue
                reports[owner] = counters
                ended.add(owner)
            for owner, counters in reports.items():
                if first and owner not in ended:
                    continue  # a baseline: what it did before we looked is in the backfill
                # Counters after a final are another run's, from zero (a reused `Worker`
                # ran 5 jobs twice: 5 after 5 read as no progress).
                prev = {} if owner in self._ended else last.get(owner, {})
                for series, names in (("completed", ("completed",)), ("failed", _FAILED)):
                    cur = sum(_int(counters.get(n)) for n in names)
                    before = sum(_int(prev.get(n)) for n in names)
                    self._add(now, series, cur - before if cur >= before else cur)
            self._last = reports
            self._ended = (self._ended - set(reports)) | ended
            horizon = int(now // BUCKET_SECONDS) - BUCKETS
            for minute in [m for m in self._buckets if m <= horizon]:
                del self._buckets[minute]

    def series(self) -> dict[str, Any]:
        """The last hour, oldest minute first, with totals and the chart's geometry."""
        now = self.clock()
        last_minute = int(now // BUCKET_SECONDS)
        with self._lock:
            rows = [{"minute": m * BUCKET_SECONDS,
                     **self._buckets.get(m, {s: 0 for s in SERIES})}
                    for m in range(last_minute - BUCKETS + 1, last_minute + 1)]
        totals = {s: sum(r[s] for r in rows) for s in SERIES}
        return {"bucket_seconds": BUCKET_SECONDS, "rows": rows, "totals": totals,
                "chart": chart(rows)}


def _int(value: object) -> int:
    """A count, or 0 for anything else (the snapshots are files anyone may write)."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else 0


def _nice_max(value: int) -> int:
    """The axis top: 1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    if value <= 1:
        return 1
    power = int("1" + "0" * (len(str(value - 1)) - 1))  # the largest power of ten below value
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def chart(rows: list[dict[str, Any]], *, width: int = 600, height: int = 120
          ) -> dict[str, Any]:
    """Bar geometry for an inline SVG (stacked: completed below, failed on top).

    Computed here once so the server-side template and the polling script draw
    the same thing without either doing arithmetic.
    """
    top = _nice_max(max((r["completed"] + r["failed"] for r in rows), default=0))
    n = max(1, len(rows))
    slot = width / n
    bars: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        base = float(height)
        for series in SERIES:
            value = r[series]
            if not value:
                continue
            h = value / top * height
            bars.append({"x": round(i * slot + 1, 2), "y": round(base - h, 2),
                         "w": round(max(1.0, slot - 2), 2), "h": round(h, 2),
                         "series": series,
                         "title": f"{value} {series} in the minute from "
                                  f"{time.strftime('%H:%M', time.localtime(r['minute']))}"})
            base -= h
    return {"width": width, "height": height, "max": top, "bars": bars}
