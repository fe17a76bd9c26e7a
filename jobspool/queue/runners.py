"""Sync handlers without a time limit, run back to back on long-lived worker threads.

The per-job path (`invoke.py`) hops to a thread and back for every job: a
task, a future and a wakeup of the event loop each time, which cost the
worker more than twice the raw claim + complete of a no-op job on
PostgreSQL (`bench/worker_overhead.py`). Here each handler slot that has
work runs one *runner*: one thread hop that takes jobs from a shared run
queue, in claim order, until the queue is empty. Finished jobs go back to
the loop in groups: one wakeup covers every job finished since the loop
last looked, so a burst of quick jobs costs one hop, not one per job.

What stays on the per-job path: async handlers, jobs with a time limit (a
thread past its limit is abandoned, which a runner serving a queue must not
be) and rescued jobs that must run alone.

Cancellation (a shutdown past its grace, the worker giving up) abandons a
runner's thread as the per-job path abandons its thread: the job it was
running ends `Interrupted`, whatever the thread does later is ignored, and
jobs still queued end unstarted (released uncounted).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from jobspool.queue.context import Context, Interrupted
from jobspool.queue.invoke import call_sync

if TYPE_CHECKING:
    from jobspool.queue.host import Lifecycle
    from jobspool.queue.slots import Slots


def soon_from_thread() -> Callable[[Callable[[], None]], Any] | None:
    """How a thread asks the running event loop to call something soon, without waiting:
    asyncio's `call_soon_threadsafe` or trio's token; None on another loop."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    try:
        trio: Any = importlib.import_module("trio")
        return trio.lowlevel.current_trio_token().run_sync_soon  # type: ignore[no-any-return]
    except (ImportError, RuntimeError):
        return None


def run_started(ctx: Context, life: Lifecycle, *, deadline: float | None,
                in_thread: bool = False) -> None:
    """A handler is about to be called (either path: here, or the pipeline's per-job one).
    `in_thread`: a time-limited sync handler, which `run_began` marks as its thread begins."""
    ctx.started = True
    ctx.deadline = deadline
    ctx.start_in_thread = in_thread
    life.note_start(ctx)
    if not in_thread:
        # Before the handler runs: if this process dies now, recovery blames this job only.
        ctx.spool.note_running([ctx.token], started=True)


def run_began(ctx: Context, life: Lifecycle) -> None:
    """In a time-limited sync handler's thread, as the handler begins. Marked (and its pool
    supervisor's clock started) when the loop handed it over, a run whose thread had not
    begun when another handler froze the loop was blamed for the death that followed:
    dead-lettered as timed out, its handler never called."""
    ctx.spool.note_running([ctx.token], started=True)
    life.note_began(ctx)


def run_returned(ctx: Context, life: Lifecycle) -> None:
    """In a sync handler's thread, as it returns (the loop may be held up): from now a death
    is not this job's doing, unless its writes are still to be merged (`run_ended`). Left
    to the loop, a job that returned in time was charged a rescue when its worker process
    was killed for a loop that another handler held up."""
    if not ctx.writes and not ctx.hung:
        ctx.spool.note_running([ctx.token], started=False)
        ctx.mark_cleared = True
    life.note_returned(ctx)


def run_ended(ctx: Context, life: Lifecycle) -> None:
    """Its handler returned, raised or was cut off."""
    life.note_end(ctx)
    # Returned: a death before its settle is not this job's doing, unless its own writes
    # are still to be merged (a merge that kills the process, again and again, must be
    # charged to the jobs in it, or it loops uncounted for ever). Those keep the mark
    # until their settle (`Settler._forget`), as a hung handler's does.
    ctx.mark_kept = ctx.hung or bool(ctx.writes)
    if not ctx.mark_kept and not ctx.mark_cleared:
        ctx.spool.note_running([ctx.token], started=False)


class _Run:
    """One runner's thread, as the loop sees it."""

    __slots__ = ("abandoned", "current")

    def __init__(self) -> None:
        self.current: Context | None = None
        self.abandoned = False


class Runners:
    """Up to one runner per slot draining one run queue of sync, unlimited jobs."""

    def __init__(self, *, life: Lifecycle, slots: Slots, threads: anyio.CapacityLimiter,
                 scopes: set[anyio.CancelScope], handler_for: Callable[[str], Callable[..., Any]],
                 finished: Callable[[Context], None],
                 soon: Callable[[Callable[[], None]], Any]) -> None:
        self.life = life
        self.slots = slots
        self.threads = threads
        self.scopes = scopes
        self.handler_for = handler_for
        self.finished = finished
        self.soon = soon
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)  # a parked runner waits here for jobs
        self._queue: collections.deque[Context] = collections.deque()
        self._active = 0  # runners started and not yet out of work; under _lock
        self._posted: list[Context] = []
        self._post_pending = False

    def submit(self, tg: anyio.abc.TaskGroup, ctxs: list[Context]) -> None:
        """Queue jobs (claim order kept) and start runners for free slots."""
        if not ctxs:
            return
        with self._lock:
            self._queue.extend(ctxs)
            start = min(self.slots.concurrency - self._active, len(self._queue))
            self._active += start
            self._more.notify(len(ctxs))  # parked runners take them first: no new task
        for _ in range(start):
            tg.start_soon(self._runner)

    async def _runner(self) -> None:
        run = _Run()
        try:
            with anyio.CancelScope() as scope:
                self.scopes.add(scope)
                try:
                    more = True
                    while more:  # between turns, a run for an earlier job takes the slot
                        # Taken as every other run takes one (`Slots.take`), saying for
                        # which job: taken from the limiter directly, an async runner never
                        # saw this one wait, and ran its whole queue of later jobs first.
                        await self.slots.take(self._head())
                        try:
                            more = await anyio.to_thread.run_sync(
                                self._drain, run, limiter=self.threads, abandon_on_cancel=True)
                        finally:
                            self.slots.release()
                finally:
                    self.scopes.discard(scope)
        finally:
            self._abandon(run)

    def _abandon(self, run: _Run) -> None:
        """If this runner's thread has not returned (we were cancelled), let it go: its job
        ends interrupted, the jobs still queued end unstarted."""
        with self._lock:
            if run.abandoned or run.current is _DONE:
                return
            run.abandoned = True
            self._more.notify_all()  # a parked thread wakes and returns
            self._active -= 1
            cut = run.current
            unstarted = list(self._queue)
            self._queue.clear()
        if cut is not None:
            cut.outcome = Interrupted()
            self.finished(cut)
        for ctx in unstarted:
            self.finished(ctx)

    def _drain(self, run: _Run) -> bool:
        """In a worker thread: run queued jobs until none is left (False), the loop let go
        (False), or a run for a job earlier in claim order waits for a handler slot (True:
        give the slot up for a turn). Without that turn a runner kept refilled by claims
        would hold its slot for the whole backlog, and a job with a time limit, a rescued
        one or an async one would starve or run out of priority order."""
        while True:
            with self._lock:
                if run.abandoned:
                    return False
                if not self._queue and not self.life.stopping:
                    # Park, keeping the slot, until more jobs come: a parked runner takes
                    # them without a new task, slot and thread hop (four per claim at
                    # concurrency 4: 30% of the loop's time per job, bench/worker_overhead;
                    # and one hop less between an idle worker's claim and its handler). It
                    # gives the slot up as soon as anything else wants it: a per-job run or
                    # an async runner waiting for a slot (`nudge`), a stop (`nudge`), the
                    # run ending (`_abandon`). No timeout: an idle worker's parked runners
                    # cost no wakeups.
                    self._more.wait_for(lambda: self._queue or run.abandoned
                                        or self.life.stopping or self.slots.contended())
                    if run.abandoned:
                        return False
                if not self._queue:
                    self._active -= 1
                    run.current = _DONE
                    return False
                if self.slots.contended(before=self._queue[0].seq):
                    return True  # a run for an earlier job (in claim order) waits
                ctx = run.current = self._queue.popleft()
            if ctx.unconfirmed():
                ctx.confirm()
            if not self.life.stopping and ctx.runnable():
                self._call(ctx)
            with self._lock:
                if run.abandoned:
                    return False  # the loop ended this job already (interrupted)
                run.current = None
                self._posted.append(ctx)
                wake, self._post_pending = not self._post_pending, True
            if wake:
                self.soon(self._collect)

    def _head(self) -> float:
        """The claim-order place of the next job queued here (none: after every job)."""
        with self._lock:
            return self._queue[0].seq if self._queue else math.inf

    def nudge(self) -> None:
        """Wake parked runners to look again (something waits for a slot, or a stop)."""
        with self._lock:
            self._more.notify_all()

    def _call(self, ctx: Context) -> None:
        run_started(ctx, self.life, deadline=None)
        try:
            call_sync(ctx, self.handler_for(ctx.job.kind))
        finally:
            run_ended(ctx, self.life)

    def _collect(self) -> None:
        """On the loop: hand every job finished since the last call to the pipeline."""
        with self._lock:
            got, self._posted = self._posted, []
            self._post_pending = False
        for ctx in got:
            self.finished(ctx)


# A runner whose thread returned on its own: nothing of it to abandon.
_DONE: Any = object()
