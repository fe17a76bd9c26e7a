"""Async handlers without a time limit, run back to back by long-lived tasks on the loop.

The per-job path spawns a task per job, gives it a cancel scope and takes a
handler slot for it: on a no-op async handler that cost the worker 40% of
the raw claim + complete rate on PostgreSQL (`bench/worker_overhead.py`).
Here each handler slot with work runs one *runner* task that takes jobs from
a run queue in claim order and awaits them one after the other, holding its
slot across jobs. Each job still goes through `invoke` (`Pipeline._call`):
the same outcomes, the same blocked-loop tracking.

As the sync runners (`runners.py`): the concurrency cap is shared with the
per-job path (the same limiter), a runner gives its slot up at a job
boundary while a per-job run waits for one, and a cut-off (a shutdown past
its grace, the worker giving up) interrupts the job a runner is awaiting —
it ends `Interrupted` — while the jobs still queued end unstarted (released
uncounted).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.to_thread

from jobspool.queue.context import Context

if TYPE_CHECKING:
    from jobspool.queue.host import Lifecycle
    from jobspool.queue.slots import Slots


class AsyncRunners:
    """Up to one runner task per slot draining one run queue of async, unlimited jobs."""

    def __init__(self, *, life: Lifecycle, slots: Slots, scopes: set[anyio.CancelScope],
                 call: Callable[[Context, Callable[[], None]], Awaitable[None]],
                 finished: Callable[[Context], None]) -> None:
        self.life = life
        # Taken as a per-job run takes one (`Slots.take`): counted while it waits, so sync
        # runners parked on a slot give it up instead of keeping this one waiting.
        self.slots = slots
        self.scopes = scopes
        self.call = call
        self.finished = finished
        self._queue: collections.deque[Context] = collections.deque()
        self._active = 0
        self._in_handler = 0  # runners awaiting a handler (the others will look at the queue)
        self._tg: anyio.abc.TaskGroup | None = None

    def submit(self, tg: anyio.abc.TaskGroup, ctxs: list[Context]) -> None:
        """Queue jobs (claim order kept) and start a runner if none is free to take them."""
        self._tg = tg
        self._queue.extend(ctxs)
        self.spread()

    def spread(self) -> None:
        """Start one more runner when jobs wait, every runner is in a handler, and the cap
        allows. Called at a submit and when a handler first suspends: runners multiply only
        as handlers wait, up to the cap. Starting one per free slot at every claim made
        three tasks per batch that found the queue empty when handlers never wait (a first
        runner drains the batch without yielding): ~15 µs each."""
        if (self._queue and self._tg is not None and self._active == self._in_handler
                and self._active < self.slots.concurrency):
            self._active += 1
            self._tg.start_soon(self._runner)

    async def _runner(self) -> None:
        current: Context | None = None
        scope = anyio.CancelScope()
        try:
            with scope:
                self.scopes.add(scope)
                try:
                    while self._queue:
                        await self.slots.take(self._queue[0].seq)
                        try:
                            # Between jobs (and before the first: the slot may have come
                            # while an earlier job began to wait), a run waiting for a
                            # slot for an earlier job (in claim order) takes ours.
                            while self._queue and not self.slots.contended(
                                    before=self._queue[0].seq):
                                current = self._queue.popleft()
                                if current.unconfirmed():
                                    await anyio.to_thread.run_sync(current.confirm)
                                if not self.life.stopping and current.runnable():
                                    self._in_handler += 1
                                    try:
                                        await self.call(current, self.spread)
                                    finally:
                                        self._in_handler -= 1
                                self.finished(current)
                                current = None
                        finally:
                            self.slots.release()
                finally:
                    self.scopes.discard(scope)
        finally:
            self._active -= 1
            if current is not None:  # cut off while it ran: `invoke` recorded the outcome
                self.finished(current)
            if scope.cancel_called:  # the others were cut off too: nobody runs the rest
                unstarted, self._queue = list(self._queue), collections.deque()
                for ctx in unstarted:
                    self.finished(ctx)
