"""The worker runs serving on one spool, so that closing the spool stops them first.

Closing a spool under a running worker cut the worker off mid-batch: it raised
`WorkerSpoolClosed` and every job it held stayed leased until its lease ran out.
`close()` now asks each run to stop as `Worker.stop()` does (running handlers get the
worker's grace, jobs not begun go back uncounted) and waits for it to end before the
spool's files and locks go.
"""

from __future__ import annotations

import threading
from typing import Protocol

# Past a run's grace: what it takes to give back the cut-off runs and publish its report.
STOP_MARGIN_SECONDS = 5.0


class Stoppable(Protocol):
    grace_seconds: float

    def stop(self) -> None: ...


class Runs:
    """The runs in progress on one spool (`Worker` registers each of its runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Stoppable, int, threading.Event]] = {}

    def begin(self, worker: Stoppable) -> None:
        with self._lock:
            self._live[id(worker)] = (worker, threading.get_ident(), threading.Event())

    def end(self, worker: Stoppable) -> None:
        with self._lock:
            entry = self._live.pop(id(worker), None)
        if entry is not None:
            entry[2].set()

    def stop_all(self) -> None:
        """Ask every run to stop and wait for each to end (at most its grace and a margin)."""
        with self._lock:
            live = list(self._live.values())
        for worker, _, _ in live:
            worker.stop()
        me = threading.get_ident()
        for worker, thread, ended in live:
            # Closed from the run's own loop (an async handler, a callback): waiting there
            # would block the very run it waits for.
            if thread != me:
                ended.wait(worker.grace_seconds + STOP_MARGIN_SECONDS)
