"""The worker runs serving on one spool, so that closing the spool stops them first.

Closing a spool under a running worker cut the worker off mid-batch: it raised
`WorkerSpoolClosed` and every job it held stayed leased until its lease ran out.
`close()` now asks each run to stop as `Worker.stop()` does (running handlers get the
worker's grace, jobs not begun go back uncounted) and waits for it to end before the
spool's files and locks go.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# Past a run's grace: what it takes to give back the cut-off runs and publish its report.
STOP_MARGIN_SECONDS = 5.0


# Threads inside a sync handler right now (set operations are atomic under the GIL). A
# handler cut off by the grace period keeps its thread (Python cannot stop one): the CLI
# exits past it rather than wait (`handler_threads_running`), but only for those; other
# threads of the worker (runners between jobs, idle pool threads) end on their own.
HANDLER_THREADS: set[int] = set()


def inside_handler() -> bool:
    """Whether the calling thread is inside a sync handler."""
    return threading.get_ident() in HANDLER_THREADS


def handler_threads_running() -> bool:
    """Whether some thread of this process is still inside a sync handler."""
    alive = {t.ident for t in threading.enumerate()}
    return bool(HANDLER_THREADS & alive)


class Stoppable(Protocol):
    grace_seconds: float

    def stop(self) -> None: ...


@dataclass(eq=False)
class Run:
    """One run in progress: a worker may serve several at once (one per thread)."""

    worker: Stoppable
    thread: int = field(default_factory=threading.get_ident)
    ended: threading.Event = field(default_factory=threading.Event)


class Runs:
    """The runs in progress on one spool (`Worker` registers each of its runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[Run] = set()
        self._close: Callable[[], None] | None = None  # left to the last run to end
        self._pid = os.getpid()

    def begin(self, worker: Stoppable) -> Run:
        run = Run(worker)
        with self._owned():
            self._live.add(run)
        return run

    def end(self, run: Run) -> None:
        with self._owned():
            self._live.discard(run)
            close, self._close = (self._close, None) if not self._live else (None, self._close)
        run.ended.set()
        if close is not None:
            close()

    def close_after(self, close: Callable[[], None]) -> None:
        """Ask every run to stop, wait for each to end (at most its grace and a margin),
        then `close()`.

        Asked from inside a run — its own loop (an async handler, a callback) or a sync
        handler's thread — waiting would hold up the very run it waits for, for its whole
        grace, and cut the handler off: then `close()` is left to the last run to end.
        """
        me = threading.get_ident()
        with self._owned():
            live = list(self._live)
            deferred = bool(live) and (inside_handler() or any(r.thread == me for r in live))
            if deferred:
                self._close = close
        for run in live:
            run.worker.stop()
        if deferred:
            return
        for run in live:
            run.ended.wait(run.worker.grace_seconds + STOP_MARGIN_SECONDS)
        close()

    def _owned(self) -> threading.Lock:
        """The lock, after forgetting the runs of the process we were forked from: they go
        on (or not) in the parent, and a child closing its copy must not wait for them —
        nor for a lock some parent thread held at the fork."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._live = set()
            self._close = None
        return self._lock
