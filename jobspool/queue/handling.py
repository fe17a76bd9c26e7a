"""How a worker run runs its handlers one job at a time (a mixin of `Pipeline`).

Sync jobs with no time limit go to the parked runners (`runners.py`), async ones
without a limit to `async_runners.py`; everything else (a time limit, a rescued
job, a loop without runners) runs here, a task per job: it takes a handler slot
in claim order, is confirmed still leased, runs through `invoke`, and lands in
`done` for the next settle. A rescued job runs alone, after its batch mates ran
and what finished was settled.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from jobspool.errors import TimeLimitExceeded
from jobspool.queue.context import Context, Raised
from jobspool.queue.invoke import invoke
from jobspool.queue.monitor import Monitor
from jobspool.queue.report import Counters
from jobspool.queue.runners import run_began, run_ended, run_returned, run_started
from jobspool.queue.slots import Slots

if TYPE_CHECKING:
    from jobspool.queue.config import WorkerConfig
    from jobspool.queue.host import Lifecycle


class HandlerRuns:
    """The handler-running half of `Pipeline`; the attributes are the pipeline's."""

    config: WorkerConfig
    life: Lifecycle
    slots: Slots
    threads: anyio.CapacityLimiter
    monitor: Monitor
    counters: Counters
    scopes: set[anyio.CancelScope]
    in_hand: dict[str, Context]
    done: list[Context]
    settling: int
    first_done_at: float
    wake: anyio.Event
    rescue_waiting: bool
    rescued_in_hand: set[str]

    def _finished(self, ctx: Context) -> None:
        if ctx.settled:
            return  # given back already (cut off on the way out)
        if not self.done:
            self.first_done_at = time.monotonic()
        self.done.append(ctx)
        ctx.finish()
        self.rescued_in_hand.discard(ctx.job_id)
        self.wake.set()

    async def _run_one(self, ctx: Context) -> None:
        try:
            with anyio.CancelScope() as scope:
                self.scopes.add(scope)
                try:
                    if ctx.job.rescues == 0:
                        await self.slots.take(ctx.seq)  # the common case, no generator
                        try:
                            await self._call_unless_dropped(ctx)
                        finally:
                            self.slots.release()
                    else:  # a rescued job runs alone, after the mates claimed with it
                        await self._wait_for_mates(ctx)
                        async with self.slots.every():
                            await self._settle_before_rescue()
                            await self._call_unless_dropped(ctx)
                finally:
                    self.scopes.discard(scope)
        finally:
            self._finished(ctx)  # outcome None (never started, cut off): released at settle

    async def _wait_for_mates(self, ctx: Context) -> None:
        """The jobs in hand beside a rescued one run first: taking every slot at once, the
        rescued job went ahead of them, and they waited leased, unstarted, as long as it
        ran (all of a 10-minute run; no other worker could take them meanwhile)."""
        while not self.life.stopping and any(
                c is not ctx and c.job.rescues == 0 and not (c.finished or c.settled)
                for c in self.in_hand.values()):
            await anyio.sleep(0.002)

    async def _settle_before_rescue(self) -> None:
        """Before a rescued job runs alone, what already finished is settled: if the
        rescued job kills this process (a poison pill), finished work must not be run
        again, nor (on PostgreSQL, where its start was recorded) charged its crash."""
        while self.done or self.settling:
            self.rescue_waiting = True
            self.wake.set()  # the loop settles at once (`_settle_due`)
            await anyio.sleep(0.002)
        self.rescue_waiting = False

    async def _call_unless_dropped(self, ctx: Context) -> None:
        if ctx.unconfirmed():
            await anyio.to_thread.run_sync(ctx.confirm)
        if not self.life.stopping and ctx.runnable():
            await self._call(ctx)

    async def _call(self, ctx: Context, on_wait: Callable[[], None] | None = None) -> None:
        """Run one handler (`invoke.py`): how it ended lands in `ctx.outcome`; `on_wait` is
        called when an async one first suspends."""
        kind = ctx.job.kind
        fn = self.config.handlers[kind]
        # The job's own limit, given at enqueue, wins over its kind's policy.
        timeout = ctx.job.timeout if ctx.job.timeout is not None else self.config.timeout_for(kind)
        is_async = self.config.is_async(kind)
        run_started(ctx, self.life,
                    deadline=None if timeout is None else time.monotonic() + timeout,
                    in_thread=not is_async and timeout is not None)
        try:
            await invoke(ctx, fn, is_async=is_async, timeout=timeout,
                         monitor=self.monitor, threads=self.threads, on_hung=self.life.note_hung,
                         on_wait=on_wait, on_began=functools.partial(run_began, life=self.life),
                         on_returned=functools.partial(run_returned, life=self.life))
        finally:
            run_ended(ctx, self.life)
        self._count_timeout(ctx)

    def _ran(self, ctx: Context) -> None:
        """A runner's job ended (on the loop)."""
        self._count_timeout(ctx)
        self._finished(ctx)

    def _count_timeout(self, ctx: Context) -> None:
        if isinstance(ctx.outcome, Raised) and isinstance(ctx.outcome.exc, TimeLimitExceeded):
            self.counters.timed_out += 1
