"""The beat of background maintenance: count commits per table, and run the tables
that are due on one background thread, one run at a time.

What a run does is the subclass's (`MaintenanceBeat._run` in maintenance.py runs
`maintain`); this module holds only the scheduling, so it needs no LanceDB.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jobspool.projection.maintenance_state import MaintenanceReport


class Beat:
    """Runs `_run` on the tables that are due, on a background thread (see `MaintenanceBeat`).

    A table is due once it has commits and either `interval` seconds passed since its
    last run or `commit_threshold` commits piled up. A table whose run was deferred or
    failed is due again on the next beat, not in a tight loop.
    """

    def __init__(self, *, interval: float, commit_threshold: int,
                 clock: Callable[[], float]) -> None:
        if interval < 0 or commit_threshold < 1:
            raise ValueError("interval must be >= 0 and commit_threshold >= 1")
        self._interval = interval
        self._threshold = commit_threshold
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: dict[str, int] = {}
        self._last_run: dict[str, float] = {}
        self._started = clock()
        self._cancel = threading.Event()
        self._closed = False
        self._running = False
        self._thread: threading.Thread | None = None
        self._runs = 0
        self._last_report: MaintenanceReport | None = None

    @property
    def last_report(self) -> MaintenanceReport | None:
        return self._last_report

    @property
    def running(self) -> bool:
        """True while a maintenance run is in progress."""
        return self._running

    @property
    def runs(self) -> int:
        """How many maintenance runs finished."""
        return self._runs

    def note_commit(self, table: str, count: int = 1) -> None:
        """Record `count` commits to `table` (call after each successful apply)."""
        with self._cond:
            self._pending[table] = self._pending.get(table, 0) + count
            if self._pending[table] >= self._threshold:
                self._cond.notify_all()

    def _due(self, now: float) -> tuple[list[str], float | None]:
        due: list[str] = []
        wait: float | None = None
        for table, n in self._pending.items():
            at = self._last_run.get(table, self._started) + self._interval
            if n >= self._threshold or now >= at:
                due.append(table)
            else:
                wait = at - now if wait is None else min(wait, at - now)
        return sorted(due), wait

    def maybe_run(self) -> bool:
        """Wake the background maintainer; True when some table is due now. Never blocks."""
        with self._cond:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="jobspool-maintenance-beat", daemon=True
                )
                self._thread.start()
            due, _ = self._due(self._clock())
            self._cond.notify_all()
            return bool(due) and not self._running

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    due, wait = self._due(self._clock())
                    if due:
                        break
                    self._cond.wait(wait)
                for table in due:
                    self._pending.pop(table, None)
                self._running = True
            report = self._run(due)
            with self._cond:
                now = self._clock()
                for table in due:
                    self._last_run[table] = now
                if report is not None:
                    for t in report.tables:
                        if t.outcome in ("deferred", "failed"):
                            # Try again on the next beat, not in a tight loop.
                            self._pending[t.table] = max(self._pending.get(t.table, 0), 1)
                self._last_report = report
                self._runs += 1
                self._running = False
                self._cond.notify_all()

    def _run(self, tables: list[str]) -> MaintenanceReport | None:
        """One run over `tables`, on the beat's thread; must not raise."""
        raise NotImplementedError

    def wait_for_run(self, timeout: float | None = None) -> MaintenanceReport | None:
        """Block until the next run finishes (or `timeout`); return its report."""
        with self._cond:
            seen = self._runs
            self._cond.wait_for(lambda: self._runs > seen or self._closed, timeout)
            return self._last_report if self._runs > seen else None

    def close(self, timeout: float | None = 30.0,
              give_up: Callable[[], bool] | None = None) -> None:
        """Stop the beat: cancel a run in progress between steps and join the thread, for
        up to `timeout` seconds or until `give_up()` says so (a worker's second signal)."""
        with self._cond:
            self._closed = True
            self._cancel.set()
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return
        if give_up is None:
            thread.join(timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while thread.is_alive() and not give_up():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            thread.join(0.1 if left is None else min(0.1, left))
