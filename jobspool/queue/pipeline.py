"""One worker run: claim, run handlers, beat leases and settle, as a pipeline.

Jobs flow through three stages that overlap instead of taking turns:

- claim: whenever the jobs in hand still to run or running fall to half of
  `batch_size`, claim up to `batch_size` more in one batch (one lock hold,
  one shared flush); finished jobs waiting for their settle do not count,
  so the next claim's round trip overlaps the last handlers of a batch and
  its settle instead of following them;
- run: at most `concurrency` handlers at once (handlers without a time
  limit back to back on long-lived runners: sync ones in threads,
  `runners.py`, async ones in tasks on the loop, `async_runners.py`; the
  others, and rescued jobs that must run alone, each in a task of its
  own, sync ones in a worker thread: `handling.py`); one beat task
  extends every unsettled lease every `lease_seconds / 3` in one
  `heartbeat_many`;
- settle: finished jobs are settled as a group — when nothing else is
  running, when `batch_size` are waiting, or `settle_seconds` after the
  first of them finished — so a slow job never holds its quick batch mates
  (or the next claim) hostage, and a burst of quick jobs still shares one
  projection merge per table and one flush per outcome. On a store whose
  calls are round trips to a server (`overlap_settles`), a group settles
  beside the loop, one at a time, so the next claim's round trip overlaps
  the settle's instead of waiting for it.

A heartbeat or a pre-projection check that gets `LeaseLost` marks the job
lost: whatever its handler returns is discarded (counted, logged), and its
projection writes never reach a table.

A pipeline is handed what it runs with: the spool, the worker's frozen
`WorkerConfig`, the `ProjectionSink` its writes go to, the `Supervisor` that
decides what a failure of our own machinery costs, and the worker's
`Lifecycle` (stop flags, notes, metrics). Its idle waits are `idle.py`'s.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from jobspool.errors import (
    ProjectionUnusable,
    StoreUnavailable,
    WriteFailed,
)
from jobspool.queue.async_runners import AsyncRunners
from jobspool.queue.context import Context
from jobspool.queue.handling import HandlerRuns
from jobspool.queue.idle import NO_HINT, IdleWaits
from jobspool.queue.kindlimit import dead_letter_over_limit, give_back_strays, over_kind_limit
from jobspool.queue.monitor import Monitor
from jobspool.queue.report import Counters, RunReport
from jobspool.queue.runners import Runners, soon_from_thread
from jobspool.queue.settle import Settler
from jobspool.queue.slots import Slots
from jobspool.queue.takeover import TakeOvers
from jobspool.queue.wholecall import whole, whole_in_thread

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI
    from jobspool.queue.config import WorkerConfig
    from jobspool.queue.host import Lifecycle
    from jobspool.queue.job import Lease
    from jobspool.queue.sink import ProjectionSink
    from jobspool.queue.supervisor import Supervisor

log = logging.getLogger("jobspool.queue.worker")

# How long the first finished job of a group waits for its batch mates before settling.
SETTLE_SECONDS = 0.05
# On the way out, a settle refused (a full disk, an unreachable store) is tried again
# after these pauses before what it held is released.
_LAST_SETTLE_PAUSES = (0.2, 0.5, 1.0)


class Pipeline(IdleWaits, HandlerRuns):
    """The loop of one `run_until_idle` / `run_forever` call."""

    def __init__(self, spool: SpoolAPI, config: WorkerConfig, counters: Counters,
                 sink: ProjectionSink, supervisor: Supervisor, lifecycle: Lifecycle, *,
                 until_idle: bool, max_jobs: int | None = None, wait_for_retries: float = 0.0,
                 wait_for_store: float | None = None, poll_seconds: float = 0.5,
                 progress: Callable[[RunReport], None] | None = None) -> None:
        self.spool = spool
        self.config = config  # one value for the whole run: a change reaches the next run
        self.counters = counters
        self.sink = sink
        self.supervisor = supervisor
        self.life = lifecycle
        self.until_idle = until_idle
        self.max_jobs = max_jobs
        self.wait_for_retries = wait_for_retries
        self.wait_for_store = wait_for_store  # an outage longer than this ends the run
        self.poll_seconds = poll_seconds
        self.progress = progress
        self.cap = max(config.batch_size, config.concurrency)
        self.in_hand: dict[str, Context] = {}
        self.done: list[Context] = []
        self.refused_on_stop = False  # a settle refused while stopping: leave the loop
        self.first_done_at = 0.0
        self.wake = anyio.Event()
        self.slots = Slots(config.concurrency)
        self.threads = anyio.CapacityLimiter(config.concurrency)
        self.scopes: set[anyio.CancelScope] = set()
        # What ends the run, raised once it has given back its leases: a verdict of its own
        # (`WorkerCrashed`, `ProjectionUnusable`) or the caller's `progress` raising.
        self.crashed: Exception | None = None
        self.next_claim_at = 0.0
        self.next_dead_check = 0.0
        self._claim_seq = 0  # each claimed job's place in claim order (`Slots`)
        self._due_hint: Any = NO_HINT  # next_due_at, read beside the last empty claim
        self._strays: set[str] = set()  # given back for want of a handler: never claimed again
        self.idle = 0.01
        self.looked_past_claim = False  # idle.py `_wait_for_due`
        self.claim_dead_lettered = 0  # idle.py `_claim_or_due`
        self.arrived = anyio.Event()
        self.stop_poked = anyio.Event()  # set by `_poke`: a stop or hurry was asked
        self.monitor = Monitor(self.spool, lambda: list(self.in_hand.values()),
                               lease_seconds=config.lease_seconds)
        self.settler = Settler(spool, config, counters, sink, self.in_hand)
        self.runners: Runners | None = None  # made in run(): it needs the running loop
        self.async_runners = AsyncRunners(
            life=lifecycle, slots=self.slots, scopes=self.scopes, call=self._call,
            finished=self._finished)
        self._pokeless = True  # no way for a stop to wake the loop: idle sleeps poll
        self.settling = 0  # jobs of the group being settled (`_settle`), still in `in_hand`
        self.settles = 0  # groups settled so far
        self.settle_failing = False
        self.rescue_waiting = False  # a rescued job waits for the finished ones to settle
        self.rescued_in_hand: set[str] = set()  # rescued jobs not yet finished: no claims
        # A store written before this member existed settles in the loop, as it always did.
        self.overlap_settles = bool(getattr(spool, "overlap_settles", False))
        # Rescued jobs run alone and `run_started` notes each start before its handler:
        # a store that counts on that promise is told so (PgSpool.claim).
        self._claim_options: dict[str, Any] = (
            {"starts_noted": True} if getattr(spool, "notes_starts", False) else {})
        self.take_overs = TakeOvers(bool(getattr(spool, "lazy_take_over", False)))

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        # Before the first claim: this process reports its handlers' starts, so if it dies,
        # recovery charges only those and gives the rest back uncounted (liveness.py).
        self.spool.note_running((), started=True)
        soon = soon_from_thread()
        if soon is not None:
            # A stop asked from another thread (or a signal) wakes an idle loop at once:
            # it sleeps until then, or until a job arrives, without polling.
            on_stop = getattr(self.life, "on_stop", None)  # a Lifecycle of an earlier shape
            if on_stop is not None:
                on_stop(functools.partial(soon, self._poke))
                self._pokeless = False
            self.runners = Runners(
                life=self.life, slots=self.slots, threads=self.threads, scopes=self.scopes,
                handler_for=self.config.handlers.__getitem__, finished=self._ran, soon=soon)
            self.slots.on_wait = self.runners.nudge
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
                        await whole(self._give_back_everything)
                    tg.cancel_scope.cancel()
        finally:
            if not self._pokeless:
                self.life.on_stop(None)
            self.monitor.close()
        if self.crashed is not None:
            raise self.crashed

    async def _loop(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            # Idle or busy with long handlers, the metrics file stays fresh while this loop
            # turns (at most one write per 5 s): `health` reads a stale one as a stuck worker.
            self.life.publish(self.counters)
            if self.crashed is not None or self.refused_on_stop:
                return
            if self._settle_due():
                group, self.done = self.done, []
                self.settling += len(group)
                if self.overlap_settles:
                    tg.start_soon(self._settle, group)
                else:
                    await self._settle(group)
                continue
            tried_claim = False
            if self._may_claim():
                settles = self.settles
                try:
                    n = await self._claim(tg)
                except Exception as exc:
                    if not await self._supervise(exc):
                        return
                    continue
                self.supervisor.reached()
                # Empty, but a settle ran meanwhile: what it gave back (a retry due now, a
                # release) may not have been there to see; not a proof of idleness yet.
                tried_claim = not self.settling and settles == self.settles
                if n:
                    self.idle = 0.01
                    self.looked_past_claim = False
                    continue
                if self.take_overs.skipped:
                    continue  # no proof of idleness: claim again at once, looking
                self.next_claim_at = time.monotonic() + self.idle
                self.idle = min(self.poll_seconds, self.idle * 2)
                if not self.until_idle:
                    if await self._took_back_dead():
                        self.next_claim_at = 0.0
                        continue
                    await self._claim_when_due()
            if self.settling and len(self.in_hand) <= self.settling:
                # Only the group settling beside the loop is in hand (or a failed one is
                # being given back while the supervisor backs off): wait for it to land.
                await self._wait_for_progress()
                continue
            if not self.in_hand:
                if self.life.stopping:
                    return
                if self.until_idle:
                    if (self._budget_spent() or not self.config.kinds
                            or self.settler.outage_since is not None):
                        return
                    if tried_claim and not await self._wait_for_due():
                        if await self._took_back_dead(now_or_never=True):
                            self.next_claim_at = 0.0
                            continue  # jobs a dead worker held: drained too
                        return
                    if not tried_claim:
                        await self._sleep(max(0.0, self._claim_at() - time.monotonic()))
                    continue
                await self._sleep(max(0.0, self._claim_at() - time.monotonic()))
                continue
            await self._wait_for_progress()

    def _settle_due(self) -> bool:
        if not self.done or self.settling:
            return False
        if self.rescue_waiting:
            return True
        if len(self.done) == len(self.in_hand) or len(self.done) >= self.config.batch_size:
            return True
        return time.monotonic() - self.first_done_at >= SETTLE_SECONDS

    async def _settle(self, group: list[Context]) -> None:
        """Settle a group; beside the loop where the store says it pays (`overlap_settles`:
        the next claim's round trip overlaps this one's), else in it. One group at a time;
        the claim's `exclude` keeps these leases out of the next claim."""
        try:
            await self.settler.settle(group)
        except Exception as exc:  # our machinery: give the group back, carry on
            self.settle_failing = True  # no claims while the supervisor backs off
            try:
                if isinstance(exc, StoreUnavailable | WriteFailed):
                    # The store is away or refused the write (a full disk, a deleted tmp/):
                    # the results are kept, their leases still beaten, and settled again
                    # after the backoff (or on the way out, `_give_back_everything`), those
                    # whose leases still hold then. Releasing them threw finished work
                    # away: it ran again, or (the release refused too) its lease expired
                    # and the reclaim counted a succeeded run's attempt.
                    self._settle_later([c for c in group if not c.settled])
                    # Stopping: the way out tries them again (a bounded number of times);
                    # settled again here, in the loop, a lasting refusal never ended it.
                    self.refused_on_stop = self.life.stopping
                else:
                    await anyio.to_thread.run_sync(self.settler.release_unsettled, group)
                if isinstance(exc, ProjectionUnusable):
                    # Found at a first write (the endpoint was down when the run began): the
                    # refusal a run gets up front, not a failure to retry and charge jobs for.
                    self._stop_with(exc)
                    return
                await self._supervise(exc)
            finally:
                self.settle_failing = False
        finally:
            self.settling -= len(group)
            self.settles += 1
            # What it gave back (a retry due now, a release) is claimable at once, and a
            # claim that came back empty while it ran proved nothing: claim again now, not
            # after the idle backoff that empty claim set (10 ms at the end of every drain).
            self.next_claim_at = 0.0
            self._report_progress()
            self.wake.set()

    def _settle_later(self, group: list[Context]) -> None:
        if group:
            if not self.done:
                self.first_done_at = time.monotonic()
            self.done[:0] = group

    def _budget_spent(self) -> bool:
        return self.max_jobs is not None and self.counters.claimed >= self.max_jobs

    def _may_claim(self) -> bool:
        if self.life.stopping or not self.config.kinds or self._budget_spent():
            return False
        if self.settle_failing or self._unfinished() > self.cap // 2:
            return False
        if self.rescued_in_hand:
            # It runs alone: what this claim took would wait for it, leased, unstarted.
            return False
        if self.until_idle and self.settler.outage_since is not None:
            # The projection's storage fails: what a drain claimed now would only be given
            # back (a run of a script ends, saying what it deferred; a service waits).
            return False
        return time.monotonic() >= self._claim_at()

    def _claim_at(self) -> float:
        """When the next claim may go out (monotonic): the idle backoff's time, or the
        projection storage's pause when later. Kept apart, an arrival's wakeup (which
        clears `next_claim_at`) ran a handler into an outage, or spun the idle loop."""
        return max(self.next_claim_at, self.settler.claims_paused_until)

    def _unfinished(self) -> int:
        """Jobs in hand whose handlers have not finished (queued or running)."""
        return len(self.in_hand) - len(self.done) - self.settling

    async def _claim(self, tg: anyio.abc.TaskGroup) -> int:
        unfinished = self._unfinished()
        # Two sizes only, a full batch or the half that `_may_claim` leaves room for:
        # PostgreSQL keeps one generic plan per claim text (the limit is written into it),
        # and a limit that took every value from cap/2 to cap planned most claims afresh.
        # `unfinished` runs below zero while a settle beside the loop has forgotten part of
        # its group and not yet counted it out of `settling`: `cap - unfinished` then took
        # up to five batches in one claim, past the cap.
        want = self.cap if unfinished <= 0 else self.cap - self.cap // 2
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.counters.claimed)
        if want <= 0:
            return 0
        claim = functools.partial(
            self.spool.claim, kinds=self.config.kinds, limit=want, owner=self.config.owner,
            lease_seconds=self.config.lease_seconds,
            exclude=frozenset(self.in_hand) | self.settler.avoided() | self._strays,
            **self._claim_options, **(looks := self.take_overs.options()))
        # Whole, whatever cancels this run (see `wholecall`): leases that landed while it
        # was cancelled are taken into hand, to be given back uncounted on the way out.
        leases, self._due_hint = await whole_in_thread(
            functools.partial(self._claim_or_due, claim),
            landed=lambda got: self._hold(got[0]))
        self.counters.dead_lettered += self.claim_dead_lettered
        self.take_overs.claimed(looks, short=len(leases) < want)
        claimed = leases
        settled_here: set[str] = set()  # dead-lettered by this claim's own follow-up
        try:
            strays = 0
            if any(lease.job.kind not in self.config.handlers for lease in leases):
                kept = await whole_in_thread(functools.partial(
                    give_back_strays, self.spool, self.config, leases, self._strays))
                strays, leases = len(leases) - len(kept), kept
            if over := over_kind_limit(self.config, leases):
                leases = [lease for lease in leases if lease not in over]
                self.counters.dead_lettered += await whole_in_thread(
                    functools.partial(dead_letter_over_limit, self.spool, self.config, over),
                    landed=lambda _: settled_here.update(x.job_id for x in over))
        except BaseException:
            # Cancelled between the claim and its jobs reaching the hand (a cancel one loop
            # turn late): those not given back or dead-lettered yet are held, for the way
            # out to give back uncounted. Left here, they stayed leased, an attempt charged.
            self._hold([x for x in claimed if x.job_id not in self._strays
                        and x.job_id not in settled_here])
            raise
        self.counters.claimed += len(leases)
        queued: list[Context] = []
        awaited: list[Context] = []
        per_job: list[float] = []
        for lease in leases:
            ctx = Context(self.spool, lease, key_for=self.config.keys)
            ctx.seq, self._claim_seq = self._claim_seq, self._claim_seq + 1  # claim order
            self.in_hand[ctx.job_id] = ctx
            if lease.job.rescues:
                self.rescued_in_hand.add(ctx.job_id)
            if self._runs_queued(ctx):
                queued.append(ctx)
            elif self._runs_async_queued(ctx):
                awaited.append(ctx)
            else:
                per_job.append(ctx.seq)
                tg.start_soon(self._run_one, ctx)
        if bool(per_job) + bool(queued) + bool(awaited) > 1:  # runs of several kinds
            starting = per_job + [q[0].seq for q in (queued, awaited) if q]
            self.slots.expect(starting)
            tg.start_soon(self._forget_after_first_steps, starting)
        if self.runners is not None:
            self.runners.submit(tg, queued)
        self.async_runners.submit(tg, awaited)
        return len(leases) + strays  # strays count: claim again (without them), not idle

    async def _forget_after_first_steps(self, seqs: list[float]) -> None:
        """Started after a claim's runs: they take their first step (and wait for a slot)
        before this one's second."""
        try:
            await anyio.lowlevel.checkpoint()
        finally:
            self.slots.forget(seqs)

    def _hold(self, leases: list[Lease]) -> None:
        """Take claimed leases into hand unstarted (a cancellation came before they could
        run): the way out gives them back uncounted."""
        for lease in leases:
            if lease.job_id not in self.in_hand:
                self.in_hand[lease.job_id] = Context(self.spool, lease,
                                                     key_for=self.config.keys)

    def _runs_async_queued(self, ctx: Context) -> bool:
        """Whether an async runner (`async_runners.py`) takes this job: an async handler,
        no time limit, and not a rescued job (those run alone, after a settle:
        `_settle_before_rescue`)."""
        job = ctx.job
        return (self.config.is_async(job.kind) and job.timeout is None
                and self.config.timeout_for(job.kind) is None and job.rescues == 0)

    def _runs_queued(self, ctx: Context) -> bool:
        """Whether a runner (`runners.py`) takes this job: a sync handler, no time limit,
        and not a rescued job (those run alone, after a settle: `_settle_before_rescue`)."""
        job = ctx.job
        return (self.runners is not None and not self.config.is_async(job.kind)
                and job.timeout is None and self.config.timeout_for(job.kind) is None
                and job.rescues == 0)

    async def _wait_for_progress(self) -> None:
        """Until a handler finishes, a settle timer runs out, or a claim comes due."""
        timeout = 0.05
        if self.done and not self.settling:  # while one settles, the next group waits for it
            timeout = max(0.0, self.first_done_at + SETTLE_SECONDS - time.monotonic())
        with anyio.move_on_after(timeout):
            await self.wake.wait()
        if self.wake.is_set():
            self.wake = anyio.Event()

    async def _supervise(self, exc: BaseException) -> bool:
        """Our own machinery failed: the supervisor logs and backs off; False when it gives
        up (then this run stops, gives back its leases and raises its verdict)."""
        gave_up = await self.supervisor.failed(exc, self.counters, self.wait_for_store)
        if gave_up is None:
            return True
        self._stop_with(gave_up)
        return False

    def _stop_with(self, verdict: Exception) -> None:
        """Stop this run: it gives back its leases and raises `verdict`."""
        self.crashed = verdict
        self.life.stop()
        for scope in list(self.scopes):
            scope.cancel()

    def _report_progress(self) -> None:
        if self.progress is not None and self.crashed is None:
            try:
                self.progress(self.counters.freeze())
            except Exception as exc:
                # Raised here, it came out of the run's task group in an ExceptionGroup
                # (`except ValueError` missed it) with the run's leases left to its way out.
                self._stop_with(exc)
        self.life.publish(self.counters)

    # ------------------------------------------------------------ giving back

    async def _give_back_everything(self) -> None:
        """On the way out (stop, crash, cancellation): settle what finished, release the rest.

        Runs still going are cancelled first and given a moment to record that
        they were cut off: those count the attempt, batch mates that never
        started are released uncounted.
        """
        if self.scopes:
            for scope in list(self.scopes):
                scope.cancel()
            # Cancelled, a parked runner leaves within a loop turn or two: a first wait of
            # 10 ms was most of a short `run_until_idle` (25 ms for one job).
            step = 0.0005
            with anyio.move_on_after(2.0):
                while self.scopes:
                    await anyio.sleep(step)
                    step = min(0.01, step * 2)
        while self.settling:  # the group settling beside the loop lands (or is given back)
            await anyio.sleep(0.005)
        if self.done:
            group, self.done = self.done, []
            for pause in (*_LAST_SETTLE_PAUSES, None):
                try:
                    await self.settler.settle([c for c in group if not c.settled])
                    break
                except Exception as exc:
                    if pause is not None and isinstance(exc, StoreUnavailable | WriteFailed):
                        # A moment's refusal (a full disk being freed, a deleted tmp/):
                        # released, a finished run ran again; unreleased, its lease
                        # expired and the reclaim charged it an attempt.
                        log.warning("settling on the way out failed (%s); trying again in "
                                    "%g s", exc, pause)
                        await anyio.sleep(pause)
                        continue
                    log.warning("settling on the way out failed (%s); releasing", exc)
                    await whole_in_thread(
                        functools.partial(self.settler.release_unsettled, group))
        rest = [c for c in self.in_hand.values() if not c.settled]
        if rest:
            for scope in list(self.scopes):
                scope.cancel()
            # Whole: a second cancel of the task (the first began this way out) ended the
            # run with these leases still held while their release went on in its thread.
            await whole_in_thread(functools.partial(self.settler.release_unsettled, rest))
