"""When a Worker's claims also take over expired leases (`TakeOvers`).

On a store where that costs a read of every leased row (`lazy_take_over`:
PostgreSQL), a claim looks at least once a second, and after any claim that
came back short (a drained or idle queue, where an expired lease may be all
there is to take) — unless the claim is for a job that just arrived: an idle
worker's pickup of a new job then waits for no such read within the second
(EXPLAIN ANALYZE, one due job: 0.45-0.59 ms looking, 0.15-0.17 without). An
empty claim that did not look proves nothing: the worker claims again at once,
looking. (A first form let a claim that looked and came back short wait its
second: an idle worker woken by a lease's expiry then skipped it, and took it
over only at its next poll, `poll_seconds` late.)
"""

from __future__ import annotations

import time

# While claims skip expired leases, how often one looks anyway.
TAKE_OVER_SECONDS = 1.0


class TakeOvers:
    """The take-over state of one worker run."""

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy  # the store reads every leased row to take over (else: always)
        self._next = 0.0  # monotonic; before it, claims may skip expired leases
        self._look_next = True  # the next claim looks, whatever the time
        self.skipped = False  # the latest claim skipped them: empty, it proves nothing
        self.arrival = False  # a job arrived (`_watch_arrivals`) since the last claim

    def options(self) -> dict[str, bool]:
        """The `take_over` argument of the next claim (none where the store always does)."""
        if not self.lazy:
            return {}
        now = time.monotonic()
        arrival, self.arrival = self.arrival, False
        if now < self._next and (arrival or not self._look_next):
            return {"take_over": False}
        self._next = now + TAKE_OVER_SECONDS
        self._look_next = False
        return {"take_over": True}

    def claimed(self, options: dict[str, bool], short: bool) -> None:
        """A claim made with `options` came back (`short`: with fewer jobs than it asked)."""
        self.skipped = options.get("take_over") is False
        if short:
            self._look_next = True
