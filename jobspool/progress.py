"""A one-line progress bar for `run-until-idle` on a terminal (never under --json or a pipe)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool
    from jobspool.queue.worker import RunReport

_WIDTH = 28


class Progress:
    """Redraws `[#####.....] done/total  completed retried dead  N jobs/s` in place."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = max(total, 0)
        self.stream = stream
        self._last = 0.0
        self._drawn = False
        self._final: RunReport | None = None

    @classmethod
    def for_stdout(cls, spool: Spool, kinds: Iterable[str]) -> Progress | None:
        if not sys.stdout.isatty():
            return None
        # Interactive only, so reading every file once for an honest total is affordable.
        wanted = set(kinds)
        now = spool.now()
        total = sum(1 for state in ("ready", "retryable") for job in spool.jobs(state=state)
                    if job.kind in wanted and (state == "ready" or job.run_at <= now))
        return cls(total, sys.stdout)

    def update(self, report: RunReport, *, force: bool = False) -> None:
        now = time.monotonic()
        self._final = report
        if now - self._last < 0.1 and not force:
            return
        self._last = now
        done = report.completed + report.retried + report.dead_lettered
        total = max(self.total, done)
        filled = int(_WIDTH * done / total) if total else _WIDTH
        bar = "#" * filled + "." * (_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{total}  completed {report.completed}  retried "
                          f"{report.retried}  dead {report.dead_lettered}  "
                          f"{report.rate:,.0f} jobs/s ")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._final is not None:
            self.update(self._final, force=True)  # the last frame, never throttled away
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
