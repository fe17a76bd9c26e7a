"""`Supervisor`: what a worker does when its own machinery (not a handler) fails.

A failed claim or settle — the disk refusing, a lost lock, a bug of ours — is
logged, counted in the run's `crashes`, and followed by a backoff (0.1 s,
doubling, at most 5 s, cut short by a stop) before the loop carries on. When
`max_crashes` failures fall within `crash_window_seconds`, the supervisor
gives up with `WorkerCrashed`: restarting forever would hide a spool that
cannot work. Its memory of recent failures outlives one run, so a worker
restarted by a loop around `run_until_idle` still gives up.

A store that cannot be reached for now (`StoreUnavailable`: a PostgreSQL
server restarting, failing over, down for minutes), or a spool whose disk
is full (`WriteFailed.disk_full`), is an outage, not a failure of ours:
it is waited out, backing off to `MAX_BACKOFF_SECONDS`, for as long as it
lasts, logged when it starts, every minute while it lasts, and when it
ends. Giving up after five tries took every worker of
every host down in the first 30 s of an outage, with a batch of handlers
run for nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from jobspool.errors import (
    JobspoolError,
    SpoolClosed,
    StoreUnavailable,
    WorkerCrashed,
    WorkerSpoolClosed,
    WriteFailed,
)
from jobspool.queue.job import validate_int, validate_seconds
from jobspool.queue.report import Counters

log = logging.getLogger("jobspool.queue.worker")

# The backoff after the n-th failure within the window: 0.1 s doubling, at most this.
MAX_BACKOFF_SECONDS = 5.0
# How often a store outage that goes on is logged again.
OUTAGE_LOG_SECONDS = 60.0


class Supervisor:
    """Counts our own failures within a sliding window and says when to give up."""

    def __init__(self, *, max_crashes: int = 5, crash_window_seconds: float = 60.0,
                 stopping: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Checked at the worker's construction: `nan` never gave up, "5" failed at the
        # first failure (comparing a count with a str), 0 gave up at the first.
        self.max_crashes = validate_int("max_crashes", max_crashes, minimum=1)
        self.crash_window_seconds = validate_seconds("crash_window_seconds",
                                                     crash_window_seconds, positive=True)
        self._stopping = stopping  # a stop cuts the backoff short
        self._clock = clock
        self._crash_times: list[float] = []
        self.outage_since: float | None = None  # the store unreachable since (monotonic)
        self._outage_tries = 0
        self._outage_logged = 0.0

    @property
    def recent(self) -> int:
        """Failures within the window, as of the last one recorded."""
        return len(self._crash_times)

    @staticmethod
    def backoff_seconds(recent: int) -> float:
        """How long to wait after the `recent`-th failure within the window."""
        return min(MAX_BACKOFF_SECONDS, 0.1 * 2.0 ** max(0, recent - 1))

    def record(self, exc: BaseException, counters: Counters,
               patience: float | None = None) -> WorkerCrashed | None:
        """Log and count a failure; the `WorkerCrashed` to raise when it is time to give up.
        An outage is waited out, for at most `patience` seconds when given (a drain in a
        script: `run_until_idle(wait_for_store=...)`)."""
        if isinstance(exc, JobspoolError) and _waited_out(exc):
            self._outage(exc)
            assert self.outage_since is not None
            down = self._clock() - self.outage_since
            if patience is not None and down >= patience:
                return StoreOutage(down, exc)
            return None
        counters.crashes += 1
        if isinstance(exc, SpoolClosed):
            # A closed spool never reopens: retrying five times only delayed this verdict.
            return WorkerSpoolClosed(exc)
        now = self._clock()
        self._crash_times = [t for t in self._crash_times if now - t < self.crash_window_seconds]
        self._crash_times.append(now)
        # The disk or the spool refusing (EIO, ENOSPC, a lost lock) is one line; only an
        # unexpected exception, a bug of ours, earns its traceback in the log.
        expected = isinstance(exc, OSError | JobspoolError)
        log.error("worker loop failed (%s: %s); restarting", type(exc).__name__, exc,
                  exc_info=None if expected else exc)
        if len(self._crash_times) >= self.max_crashes:
            return WorkerCrashed(f"worker loop failed {len(self._crash_times)} times within "
                                 f"{self.crash_window_seconds:.0f} s; last: "
                                 f"{type(exc).__name__}: {exc}")
        return None

    def _outage(self, exc: JobspoolError) -> None:
        now = self._clock()
        self._outage_tries += 1
        if self.outage_since is None:
            down_for = getattr(exc, "down_for", 0.0)  # retried that long already
            self.outage_since, self._outage_logged = now - down_for, now
            log.warning("store unavailable%s (%s); waiting for it",
                        f" for {down_for:.0f} s" if down_for >= 1 else "", exc)
        elif now - self._outage_logged >= OUTAGE_LOG_SECONDS:
            self._outage_logged = now
            log.warning("store still unavailable after %.0f s (%s); waiting for it",
                        now - self.outage_since, exc)

    def reached(self) -> None:
        """The store answered: an outage, if one was going on, is over."""
        if self.outage_since is not None:
            log.warning("store reachable again after %.0f s", self._clock() - self.outage_since)
            self.outage_since = None
            self._outage_tries = 0

    async def failed(self, exc: BaseException, counters: Counters,
                     patience: float | None = None) -> WorkerCrashed | None:
        """Record a failure and back off; the `WorkerCrashed` verdict instead when giving up.

        Returned, not raised: the pipeline still has leases to give back
        before it raises it.
        """
        gave_up = self.record(exc, counters, patience)
        if gave_up is None:
            waited_out = _waited_out(exc)
            tries = self._outage_tries if waited_out else self.recent
            pause = self.backoff_seconds(tries)
            if waited_out and patience is not None and self.outage_since is not None:
                # Not past the patience by a whole backoff: the verdict comes on time.
                left = patience - (self._clock() - self.outage_since)
                pause = max(0.0, min(pause, left))
            await self._sleep_unless_stopped(pause)
        return gave_up

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(left, 0.05))


class StoreOutage(WorkerCrashed):
    """A drain gave up on a store outage that outlasted its `wait_for_store`."""

    def __init__(self, seconds: float, cause: BaseException) -> None:
        super().__init__(f"the store has been unavailable for {seconds:.0f} s, longer than "
                         f"this run waits for it: {cause}")
        self.seconds = seconds
        self.cause = cause


def _waited_out(exc: BaseException) -> bool:
    """An outage rather than a failure: the store unreachable, or its disk full. A full
    disk made every worker give up within two seconds (five tries), with the results of
    its finished runs thrown away; it passes once someone frees space."""
    return isinstance(exc, StoreUnavailable) or (isinstance(exc, WriteFailed) and exc.disk_full)
