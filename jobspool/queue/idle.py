"""How a worker run waits while it has nothing to do (a mixin of `Pipeline`).

An idle run sleeps until a job arrives (`_watch_arrivals`: the kernel says
when a file lands, wakeup.py), the next delayed job or expiring lease comes
due (`_claim_when_due`), a stop is asked (`_poke`), or its safety poll runs
out; it never wakes on a fixed short timer where something can wake it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from jobspool.queue import claimnotes

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI
    from jobspool.queue.config import WorkerConfig
    from jobspool.queue.host import Lifecycle
    from jobspool.queue.job import Lease
    from jobspool.queue.report import Counters
    from jobspool.queue.runners import Runners
    from jobspool.queue.settle import Settler
    from jobspool.queue.takeover import TakeOvers

# No next-due time read beside the last claim (`_claim_or_due`).
NO_HINT: Any = object()
# How often an idle `run_forever` looks for leases of dead worker processes.
DEAD_CHECK_SECONDS = 2.0
# The floor of a worker's safety poll: an arrival wakes an idle worker at once, and a poll
# of 1e-9 s kept a core busy listing the directory for nothing.
MIN_POLL_SECONDS = 0.01

log = logging.getLogger("jobspool.queue.worker")


class IdleWaits:
    """The waiting half of `Pipeline`; the attributes are the pipeline's."""

    spool: SpoolAPI
    config: WorkerConfig
    life: Lifecycle
    runners: Runners | None
    scopes: set[anyio.CancelScope]
    settler: Settler
    arrived: anyio.Event
    stop_poked: anyio.Event
    next_claim_at: float
    next_dead_check: float
    idle: float
    until_idle: bool
    wait_for_retries: float
    looked_past_claim: bool
    claim_dead_lettered: int  # by the latest claim, taking over exhausted expired leases
    counters: Counters
    _pokeless: bool
    _due_hint: Any
    take_overs: TakeOvers

    def _poke(self) -> None:
        """On the loop: a stop or hurry was asked (end an idle sleep, start the grace)."""
        self.arrived.set()
        self.stop_poked.set()
        if self.runners is not None:
            self.runners.nudge()  # parked runners return their slots and threads

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return early on a stop or when a job arrives (`_watch_arrivals`)."""
        deadline = time.monotonic() + seconds
        # Always yield once: a zero sleep in a loop that finds nothing to do must still let
        # the tasks beside it (a settle, the runners' results) run.
        await anyio.lowlevel.checkpoint()
        while not self.life.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # A stop pokes `arrived` (`on_stop`); the cap only bounds a stop that could not
            # poke (no thread-safe way into this loop). 20 wakeups a second at 0.05 s were
            # most of an idle worker's CPU.
            with anyio.move_on_after(min(left, 0.05 if self._pokeless else 1.0)):
                await self.arrived.wait()
            if self.arrived.is_set():
                self.arrived = anyio.Event()
                return

    async def _watch_arrivals(self) -> None:
        """Claim as soon as a job file lands in ready/ or retryable/ (wakeup.py): no polling
        delay between an enqueue by any process and an idle worker's claim."""
        watcher = self.spool.arrival_watcher()
        if not watcher.active:
            return
        try:
            while not self.life.stopping:
                # Long waits: the task is cancelled (the thread abandoned) when the run
                # ends, so the timeout only bounds how often an idle worker wakes.
                hit = await anyio.to_thread.run_sync(watcher.wait, 1.0,
                                                     abandon_on_cancel=True)
                if hit:
                    self.next_claim_at = 0.0
                    self.idle = 0.01
                    self.take_overs.arrival = True  # its claim need not look at leases
                    self.arrived.set()
        finally:
            watcher.close()

    def _claim_or_due(self, claim: Callable[[], list[Lease]]) -> tuple[list[Lease], Any]:
        """In a thread: the claim and, when it comes back empty in `run_forever`, when the
        next job comes due (`_claim_when_due`): one thread hop, not two, per idle poll."""
        claimnotes.take_dead_lettered()  # a note of an earlier call this thread made
        leases = claim()
        self.claim_dead_lettered = claimnotes.take_dead_lettered()
        if leases or self.until_idle:
            return leases, NO_HINT
        return leases, self.spool.next_due_at(self.config.kinds)

    async def _took_back_dead(self, *, now_or_never: bool = False) -> bool:
        """Idle: whether leases of dead worker processes were just taken back (the store's
        `reclaim_dead`; a store without liveness marks has none). At most every
        `DEAD_CHECK_SECONDS`, unless `now_or_never` (the last look of `run_until_idle`)."""
        # A pool's child leaves that to its supervisor, which knows why a sibling died (a
        # hung handler it killed is a time limit, not a rescue) and settles it at once.
        reclaim = (getattr(self.spool, "reclaim_dead", None)
                   if getattr(self.life, "reclaims_dead", True) else None)
        now = time.monotonic()
        if reclaim is None or (not now_or_never and now < self.next_dead_check):
            return False
        self.next_dead_check = now + DEAD_CHECK_SECONDS

        def take_back() -> tuple[int, int]:
            claimnotes.take_dead_lettered()
            return reclaim(), claimnotes.take_dead_lettered()

        try:
            taken, dead = await anyio.to_thread.run_sync(take_back)
            # A dead holder's job out of attempts is dead-lettered by this run: counted.
            self.counters.dead_lettered += dead
            return bool(taken)
        except Exception as exc:  # a look that failed: the leases expire as they would have
            log.debug("could not look for leases of dead workers: %s", exc)
            return False

    async def _claim_when_due(self) -> None:
        """Idle: claim again when the next delayed job or expiring lease comes due, if that
        is sooner than the next safety poll."""
        hint, self._due_hint = self._due_hint, NO_HINT
        due: float | None = (hint if hint is not NO_HINT else await anyio.to_thread.run_sync(
            self.spool.next_due_at, self.config.kinds))
        if due is not None:
            at = time.monotonic() + max(0.0, due - self.spool.now()) + 0.001
            self.next_claim_at = min(self.next_claim_at, at)

    async def _wait_for_due(self) -> bool:
        """Sleep until the next retry becomes due if that is within the bound."""
        if self.wait_for_retries <= 0:
            return False
        nxt = await anyio.to_thread.run_sync(self.spool.next_due_at, self.config.kinds)
        wait = None if nxt is None else nxt - self.spool.now()
        if wait is None or wait > self.wait_for_retries:
            # `next_due_at` names only what comes due later than now: a retry that came due
            # between the empty claim and this look is in neither, and the run ended with it
            # still waiting. One more claim sees it; an empty one after this look is idle.
            if self.looked_past_claim:
                return False
            self.looked_past_claim = True
            self.next_claim_at = 0.0
            return True
        self.looked_past_claim = False
        await self._sleep(max(0.0, wait) + 0.01)
        self.next_claim_at = 0.0
        return not self.life.stopping

    async def _cut_off_after_grace(self) -> None:
        await self._until(lambda: self.life.stopping)
        deadline = time.monotonic() + self.config.grace_seconds
        await self._until(lambda: self.life.hurrying, deadline)
        for scope in list(self.scopes):
            scope.cancel()
        self.settler.cut_off()  # a projection commit that hangs: left running, jobs back

    async def _until(self, done: Callable[[], bool], deadline: float | None = None) -> None:
        """Until `done()` (a stop or hurry, which poke `stop_poked`) or the deadline. Polled
        only where nothing can poke this loop: at 0.05 s it woke an idle worker 20 times a
        second."""
        step = 0.05 if self._pokeless else 1.0
        while not done():
            left = step if deadline is None else min(step, deadline - time.monotonic())
            if left <= 0:
                return
            if self.stop_poked.is_set():
                self.stop_poked = anyio.Event()
                continue
            with anyio.move_on_after(left):
                await self.stop_poked.wait()
