"""One worker run: claim, run handlers, beat leases and settle, as a pipeline.

Jobs flow through three stages that overlap instead of taking turns:

- claim: whenever the jobs in hand (claimed, not yet settled) fall to half
  of `batch_size`, claim up to `batch_size` more in one batch (one lock
  hold, one shared flush);
- run: at most `concurrency` handlers at once (sync ones in worker
  threads, async ones on the loop); one beat task extends every unsettled
  lease every `lease_seconds / 3` in one `heartbeat_many`;
- settle: finished jobs are settled as a group — when nothing else is
  running, when `batch_size` are waiting, or `settle_seconds` after the
  first of them finished — so a slow job never holds its quick batch mates
  (or the next claim) hostage, and a burst of quick jobs still shares one
  projection merge per table and one flush per outcome.

A heartbeat or a pre-projection check that gets `LeaseLost` marks the job
lost: whatever its handler returns is discarded (counted, logged), and its
projection writes never reach a table.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from jobspool.errors import JobspoolError, LeaseLost, TimeLimitExceeded, WorkerCrashed, WriteFailed
from jobspool.queue.context import Context, Outcome
from jobspool.queue.invoke import invoke
from jobspool.queue.job import clip_error
from jobspool.queue.machine import Failure
from jobspool.queue.report import Counters, RunReport
from jobspool.queue.runtime import Monitor
from jobspool.queue.signals import Retry
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.host import WorkerHost

log = logging.getLogger("jobspool.queue.worker")

# How long the first finished job of a group waits for its batch mates before settling.
SETTLE_SECONDS = 0.05


class Pipeline:
    """The loop of one `run_until_idle` / `run_forever` call."""

    def __init__(self, worker: WorkerHost, counters: Counters, *, until_idle: bool,
                 max_jobs: int | None = None, wait_for_retries: float = 0.0,
                 poll_seconds: float = 0.5,
                 progress: Callable[[RunReport], None] | None = None) -> None:
        self.w = worker
        self.spool = worker.spool
        self.counters = counters
        self.until_idle = until_idle
        self.max_jobs = max_jobs
        self.wait_for_retries = wait_for_retries
        self.poll_seconds = poll_seconds
        self.progress = progress
        self.cap = max(worker.batch_size, worker.concurrency)
        self.in_hand: dict[str, Context] = {}
        self.done: list[Context] = []
        self.first_done_at = 0.0
        self.wake = anyio.Event()
        self.limiter = anyio.CapacityLimiter(worker.concurrency)
        self.threads = anyio.CapacityLimiter(worker.concurrency)
        self.scopes: set[anyio.CancelScope] = set()
        self.crashed: WorkerCrashed | None = None
        self.next_claim_at = 0.0
        self.idle = 0.01
        self.arrived = anyio.Event()
        self.monitor = Monitor(self.spool, lambda: list(self.in_hand.values()),
                               lease_seconds=worker.lease_seconds)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        # Before the first claim: this process reports its handlers' starts, so if it dies,
        # recovery charges only those and gives the rest back uncounted (liveness.py).
        self.spool.note_running((), started=True)
        self.monitor.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.monitor.ticker)
                tg.start_soon(self._cut_off_after_grace)
                if not self.until_idle:
                    tg.start_soon(self._watch_arrivals)
                try:
                    await self._loop(tg)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._give_back_everything()
                    tg.cancel_scope.cancel()
        finally:
            self.monitor.close()
        if self.crashed is not None:
            raise self.crashed

    async def _loop(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            # Idle or busy with long handlers, the metrics file stays fresh while this loop
            # turns (at most one write per 5 s): `health` reads a stale one as a stuck worker.
            self.w.publish(self.counters)
            if self._settle_due():
                group, self.done = self.done, []
                try:
                    await self._settle(group)
                except Exception as exc:  # our machinery: give the group back, carry on
                    await anyio.to_thread.run_sync(self._release_unsettled, group)
                    if not await self._supervise(exc, WorkerCrashed):
                        return
                self._report_progress()
                continue
            tried_claim = False
            if self._may_claim():
                tried_claim = True
                try:
                    n = await self._claim(tg)
                except Exception as exc:
                    if not await self._supervise(exc, WorkerCrashed):
                        return
                    continue
                if n:
                    self.idle = 0.01
                    continue
                self.next_claim_at = time.monotonic() + self.idle
                self.idle = min(self.poll_seconds, self.idle * 2)
                if not self.until_idle:
                    await self._claim_when_due()
            if not self.in_hand:
                if self.w.stopping:
                    return
                if self.until_idle:
                    if self._budget_spent() or not self.w.kinds:
                        return
                    if tried_claim and not await self._wait_for_due():
                        return
                    if not tried_claim:
                        await self._sleep(max(0.0, self.next_claim_at - time.monotonic()))
                    continue
                await self._sleep(max(0.0, self.next_claim_at - time.monotonic()))
                continue
            await self._wait_for_progress()

    def _settle_due(self) -> bool:
        if not self.done:
            return False
        if len(self.done) == len(self.in_hand) or len(self.done) >= self.w.batch_size:
            return True
        return time.monotonic() - self.first_done_at >= SETTLE_SECONDS

    def _budget_spent(self) -> bool:
        return self.max_jobs is not None and self.counters.claimed >= self.max_jobs

    def _may_claim(self) -> bool:
        if self.w.stopping or not self.w.kinds or self._budget_spent():
            return False
        if len(self.in_hand) > self.cap // 2:
            return False
        return time.monotonic() >= self.next_claim_at

    async def _claim(self, tg: anyio.abc.TaskGroup) -> int:
        want = self.cap - len(self.in_hand)
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.counters.claimed)
        if want <= 0:
            return 0
        leases = await anyio.to_thread.run_sync(functools.partial(
            self.spool.claim, kinds=self.w.kinds, limit=want, owner=self.w.owner,
            lease_seconds=self.w.lease_seconds, exclude=frozenset(self.in_hand)))
        self.counters.claimed += len(leases)
        for lease in leases:
            ctx = Context(self.spool, lease, key_for=self.w.keys)
            self.in_hand[ctx.job_id] = ctx
            tg.start_soon(self._run_one, ctx)
        return len(leases)

    async def _wait_for_progress(self) -> None:
        """Until a handler finishes, a settle timer runs out, or a claim comes due."""
        timeout = 0.05
        if self.done:
            timeout = max(0.0, self.first_done_at + SETTLE_SECONDS - time.monotonic())
        with anyio.move_on_after(timeout):
            await self.wake.wait()
        if self.wake.is_set():
            self.wake = anyio.Event()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return early on a stop or when a job arrives (`_watch_arrivals`)."""
        deadline = time.monotonic() + seconds
        while not self.w.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with anyio.move_on_after(min(left, 0.05)):
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
            while not self.w.stopping:
                hit = await anyio.to_thread.run_sync(watcher.wait, 0.25,
                                                     abandon_on_cancel=True)
                if hit:
                    self.next_claim_at = 0.0
                    self.idle = 0.01
                    self.arrived.set()
        finally:
            watcher.close()

    async def _claim_when_due(self) -> None:
        """Idle: claim again when the next delayed job or expiring lease comes due, if that
        is sooner than the next safety poll."""
        due = await anyio.to_thread.run_sync(self.spool.next_due_at, self.w.kinds)
        if due is not None:
            at = time.monotonic() + max(0.0, due - self.spool.now()) + 0.001
            self.next_claim_at = min(self.next_claim_at, at)

    async def _wait_for_due(self) -> bool:
        """Sleep until the next retry becomes due if that is within the bound."""
        if self.wait_for_retries <= 0:
            return False
        nxt = await anyio.to_thread.run_sync(self.spool.next_due_at, self.w.kinds)
        if nxt is None:
            return False
        wait = nxt - self.spool.now()
        if wait > self.wait_for_retries:
            return False
        await self._sleep(max(0.0, wait) + 0.01)
        self.next_claim_at = 0.0
        return not self.w.stopping

    async def _supervise(self, exc: BaseException, crashed: type[WorkerCrashed]) -> bool:
        """Our own machinery failed: log, back off; False when it is time to give up."""
        try:
            await self.w.supervise(exc, self.counters)
        except crashed as gave_up:
            self.crashed = gave_up
            self.w.stop()
            for scope in list(self.scopes):
                scope.cancel()
            return False
        return True

    def _report_progress(self) -> None:
        if self.progress is not None:
            self.progress(self.counters.freeze())
        self.w.publish(self.counters)

    # ------------------------------------------------------------ running handlers

    def _finished(self, ctx: Context) -> None:
        if ctx.settled:
            return  # given back already (cut off on the way out)
        if not self.done:
            self.first_done_at = time.monotonic()
        self.done.append(ctx)
        self.wake.set()

    async def _run_one(self, ctx: Context) -> None:
        try:
            with anyio.CancelScope() as scope:
                self.scopes.add(scope)
                try:
                    async with self.limiter:
                        if not ctx.lost and not self.w.stopping:
                            await self._call(ctx)
                finally:
                    self.scopes.discard(scope)
        finally:
            self._finished(ctx)  # outcome None (never started, cut off): released at settle

    async def _call(self, ctx: Context) -> None:
        """Run one handler (`invoke.py`): how it ended lands in `ctx.outcome`."""
        kind = ctx.job.kind
        fn = self.w.handlers[kind]
        # The job's own limit, given at enqueue, wins over its kind's policy.
        timeout = ctx.job.timeout if ctx.job.timeout is not None else self.w.timeout_for(kind)
        ctx.started = True
        ctx.deadline = None if timeout is None else time.monotonic() + timeout
        self.w.note_start(ctx)
        # Before the handler runs: if this process dies now, recovery blames this job only.
        self.spool.note_running([ctx.token], started=True)
        try:
            await invoke(ctx, fn, is_async=self.w.is_async(kind), timeout=timeout,
                         monitor=self.monitor, threads=self.threads, on_hung=self.w.note_hung)
        finally:
            self.w.note_end(ctx)
            if not ctx.hung:  # returned: a death before its settle is not this job's doing
                self.spool.note_running([ctx.token], started=False)
        if ctx.outcome is not None and isinstance(ctx.outcome.value, TimeLimitExceeded):
            self.counters.timed_out += 1

    async def _cut_off_after_grace(self) -> None:
        while not self.w.stopping:
            await anyio.sleep(0.05)
        deadline = time.monotonic() + self.w.grace_seconds
        while time.monotonic() < deadline and not self.w.hurrying:
            await anyio.sleep(0.05)
        for scope in list(self.scopes):
            scope.cancel()

    # ------------------------------------------------------------ settling

    async def _settle(self, group: list[Context]) -> None:
        done = [c for c in group if c.outcome is not None and c.outcome.kind == "complete"
                and not c.lost]
        if any(c.writes for c in done):
            # Drop the runs whose lease is gone before their writes reach a table: a
            # canceled job has no newer write to fence it out, so the merge's (version,
            # fence) rule alone would not stop it. Leases near expiry are extended here,
            # so none can lapse while the merge runs.
            checks = await anyio.to_thread.run_sync(functools.partial(
                self.spool.check_leases, [c.lease for c in done],
                margin=self.w.lease_seconds / 3.0, lease_seconds=self.w.lease_seconds))
            for ctx, check in zip(done, checks, strict=True):
                if isinstance(check, LeaseLost):
                    ctx.lost = True
                else:
                    ctx.lease = check
            done = [c for c in done if not c.lost]
        if any(c.writes for c in done):
            await self._project(done)
        await anyio.to_thread.run_sync(self._settle_sync, group)

    async def _project(self, done: list[Context]) -> None:
        writes = [w for c in done for w in c.writes]
        try:
            store = await anyio.to_thread.run_sync(self.w.projection_store)
            result = await anyio.to_thread.run_sync(store.apply, writes)
        except Exception as exc:  # outcome unknown: retry all; the fenced merge is idempotent
            log.warning("projection commit failed (%s: %s); retrying its %d jobs",
                        type(exc).__name__, exc, len(done))
            for c in done:
                c.outcome = Outcome("error", exc)
            return
        by_id = {c.job_id: c for c in done}
        for job_id, err in result.rejected.items():
            if job_id in by_id:
                by_id[job_id].outcome = Outcome("fail", str(err))
        for job_id, error in result.failed.items():
            if job_id in by_id:
                by_id[job_id].outcome = Outcome("error", error)
        self.counters.projected_rows += sum(result.tables.values())
        written = [t for t, n in result.tables.items() if n > 0]
        if written:
            self.w.note_commits(store, written)

    def _settle_sync(self, group: list[Context]) -> None:
        refused: WriteFailed | None = None
        completes: list[Context] = []
        fails: list[tuple[Context, object, bool, float | None]] = []
        releases: list[Context] = []
        for c in group:
            if c.lost:
                self.counters.lease_lost += 1
                log.warning("discarding the result of job %s: its lease (token %d) was lost",
                            c.job_id, c.token, extra={"job_id": c.job_id, "token": c.token})
                self._forget(c)
            elif c.outcome is None:
                releases.append(c)
            elif c.outcome.kind == "complete":
                completes.append(c)
            elif c.outcome.kind == "retry":
                r: Retry = c.outcome.value
                fails.append((c, self._failure(c, f"Retry: {r.reason}"), True, r.delay))
            elif c.outcome.kind == "fail":
                fails.append((c, self._failure(c, c.outcome.value), False, None))
            elif c.outcome.kind == "interrupted":
                fails.append((c, self._failure(c, "interrupted: the worker shut down while "
                                                  "this job ran", interrupted=True), True, None))
            elif c.outcome.kind == "raised":  # the handler's own exception: its policy decides
                exc = c.outcome.value
                fails.append((c, self._failure(c, exc), self.w.retries(c.job.kind, exc), None))
            else:
                fails.append((c, self._failure(c, c.outcome.value), True, None))
        if completes:
            results = self.spool.complete_many([(c.lease, c.outcome.value) for c in completes
                                                if c.outcome is not None])
            for c, res in zip(completes, results, strict=True):
                if isinstance(res, LeaseLost):
                    self._count_lost(c, res)
                elif isinstance(res, WriteFailed):
                    refused = refused or res  # still leased: released below, or it expires
                    continue
                elif isinstance(res, JobspoolError):
                    # The result cannot be stored (not JSON, too large): that will not change.
                    fails.append((c, self._failure(c, f"handler result refused: {res}"),
                                  False, None))
                    continue
                else:
                    self.counters.completed += 1
                    log.info("job %s (%s) completed", c.job_id, c.job.kind,
                             extra={"job_id": c.job_id, "kind": c.job.kind, "token": c.token,
                                    "state": "completed"})
                self._forget(c)
        if fails:
            results = self.spool.fail_many([(c.lease, err, retry, delay)
                                            for c, err, retry, delay in fails])
            for (c, *_), res in zip(fails, results, strict=True):
                if isinstance(res, LeaseLost):
                    self._count_lost(c, res)
                elif isinstance(res, WriteFailed):
                    refused = refused or res
                    continue
                elif isinstance(res, JobspoolError):
                    log.error("could not record the failure of job %s: %s", c.job_id, res)
                elif res.state is JobState.READY:  # interrupted: back at once, attempt counted
                    self.counters.released += 1
                elif res.state is JobState.DEAD_LETTER:
                    self.counters.dead_lettered += 1
                    log.warning("job %s (%s) dead-lettered: %s", c.job_id, c.job.kind,
                                res.last_error, extra={"job_id": c.job_id, "kind": c.job.kind,
                                                       "state": "dead_letter"})
                else:
                    self.counters.retried += 1
                self._forget(c)
        for c in releases:
            self._release(c)
        if refused is not None:
            # The disk refused part of the settle: the loop releases what is unsettled and
            # backs off (WriteFailed says what to fix).
            raise refused

    def _failure(self, c: Context, error: object, *, interrupted: bool = False) -> Failure:
        """The failed run as the spool records it: message, traceback, the kind's policy."""
        kind = c.job.kind
        return Failure(error=clip_error(error), traceback=c.traceback,
                       policy=self.w.retry_policy(kind), max_attempts=self.w.max_attempts_for(kind),
                       interrupted=interrupted)

    def _forget(self, c: Context) -> None:
        c.drop_progress()  # settled, and its progress file (if any) gone
        self.in_hand.pop(c.job_id, None)
        if c.started and c.hung:  # the others were cleared when their handlers returned
            self.spool.note_running([c.token], started=False)

    def _count_lost(self, c: Context, err: LeaseLost) -> None:
        self.counters.lease_lost += 1
        log.warning("lease lost on job %s (token %d) before settling: %s; result discarded",
                    c.job_id, c.token, err.reason, extra={"job_id": c.job_id, "token": c.token})

    def _release(self, c: Context) -> None:
        try:
            self.spool.release(c.lease)
            self.counters.released += 1
        except LeaseLost:
            self.counters.lease_lost += 1
        self._forget(c)

    def _release_unsettled(self, group: list[Context]) -> None:
        for c in group:
            if not c.settled:
                try:
                    if c.lost:
                        self._forget(c)
                    else:
                        self._release(c)
                except (OSError, JobspoolError) as exc:
                    log.warning("could not release job %s: %s", c.job_id, exc)
                    self._forget(c)

    async def _give_back_everything(self) -> None:
        """On the way out (stop, crash, cancellation): settle what finished, release the rest.

        Runs still going are cancelled first and given a moment to record that
        they were cut off: those count the attempt, batch mates that never
        started are released uncounted.
        """
        if self.scopes:
            for scope in list(self.scopes):
                scope.cancel()
            with anyio.move_on_after(2.0):
                while self.scopes:
                    await anyio.sleep(0.01)
        if self.done:
            group, self.done = self.done, []
            try:
                await self._settle(group)
            except Exception as exc:
                log.warning("settling on the way out failed (%s); releasing", exc)
                await anyio.to_thread.run_sync(self._release_unsettled, group)
        rest = [c for c in self.in_hand.values() if not c.settled]
        if rest:
            for scope in list(self.scopes):
                scope.cancel()
            await anyio.to_thread.run_sync(self._release_unsettled, rest)
