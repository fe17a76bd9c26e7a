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

    @classmethod
    def for_stdout(cls, spool: Spool, kinds: Iterable[str]) -> Progress | None:
        if not sys.stdout.isatty():
            return None
        return cls(spool.stats().due, sys.stdout)

    def update(self, report: RunReport) -> None:
        now = time.monotonic()
        if now - self._last < 0.1:
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
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
