"""Settling a group of finished runs: fenced projection, then one batch per outcome.

`Settler.settle(group)` takes the runs a pipeline collected (`pipeline.py`):

1. the completed runs that wrote rows have their leases checked (and
   extended when near expiry) first: a run whose lease is gone is marked
   lost, and its writes never reach a table;
2. the writes of the rest go to the `ProjectionSink` in one call (one merge
   per table); a job whose rows were rejected is failed for good, one whose
   commit failed is retried (the fenced merge makes the re-run idempotent);
3. every run is settled by its typed outcome (`context.py`): completes in one
   `complete_many`, failures and retries in one `fail_many`, runs that never
   started released uncounted, lost ones discarded (counted, logged).

A run once settled is forgotten: out of the pipeline's `in_hand`, its
progress file gone, no longer noted as running.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from jobspool.errors import (
    JobspoolError,
    JobTooLarge,
    LeaseLost,
    ProjectionUnusable,
    StoreUnavailable,
    WriteFailed,
)
from jobspool.projection.faults import one_line, plain, storage_fault
from jobspool.queue.context import (
    Completed,
    Context,
    Deferred,
    Errored,
    Failed,
    Interrupted,
    Raised,
    Retried,
)
from jobspool.queue.job import clip_error, evolve
from jobspool.queue.jobsize import encode_completed
from jobspool.queue.machine import Failure
from jobspool.queue.report import Counters
from jobspool.queue.runners import soon_from_thread
from jobspool.queue.states import JobState
from jobspool.queue.wholecall import whole_in_thread

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI
    from jobspool.queue.config import WorkerConfig
    from jobspool.queue.sink import ProjectionSink

log = logging.getLogger("jobspool.queue.worker")

# The longest a batch whose projection storage failed waits before it is due again.
DEFER_MAX_SECONDS = 60.0


# The longest a run leaves alone a job given back behind its back (`Settler._shun`).
SHUN_SECONDS = 5.0

# The longest a worker waits for one projection commit. LanceDB calls cannot be
# interrupted: an object store that accepts connections and never answers (a frozen host,
# a network dropping packets) held a worker in one call for as long as it lasted, its
# leases beaten, deaf to SIGTERM. Past this, the call is left running in its thread and
# its jobs go back uncounted, as for a storage fault; should it land later, its rows
# carry those leases' tokens, which the jobs' next runs outrank (the fenced merge).
PROJECTION_CALL_SECONDS = 300.0


class ProjectionTimeout(Exception):
    """A projection commit that did not return in time (left running in its thread)."""


class Settler:
    """Settles the finished runs of one pipeline; `in_hand` is the pipeline's own dict."""

    def __init__(self, spool: SpoolAPI, config: WorkerConfig, counters: Counters,
                 sink: ProjectionSink, in_hand: dict[str, Context]) -> None:
        self.spool = spool
        self.config = config
        self.counters = counters
        self.sink = sink
        self.in_hand = in_hand
        self.shunned: dict[str, float] = {}  # job id -> when this run may claim it again
        self.storage_faults = 0  # projection storage failures in a row (`_defer`)
        self.outage_since: float | None = None  # monotonic: this run of failures' first
        self.claims_paused_until = 0.0  # monotonic: no claim before (the pipeline reads it)
        self._outage_logged_at = 0.0
        # The waits on projection commits in flight: cancelled (the call abandoned) when a
        # stop's grace runs out (`cut_off`), and every later one given up at once.
        self.commit_scopes: set[anyio.CancelScope] = set()
        self.cut = False

    def cut_off(self) -> None:
        """A stop's grace ran out: stop waiting for projection commits in flight, and start
        none (a commit begun after the cut waited its whole deadline, 300 s past grace)."""
        self.cut = True
        for scope in list(self.commit_scopes):
            scope.cancel()

    async def _apply_bounded(self, writes: list[Any]) -> Any:
        """`sink.apply(writes)` in a daemon thread of its own, waited for at most
        `PROJECTION_CALL_SECONDS` and not past a stop's grace: `ProjectionTimeout` then,
        the call left running. Not an anyio worker thread: one abandoned in a hung call
        held the interpreter's exit (those are joined) for as long as the call lasted."""
        if self.cut:
            raise ProjectionTimeout("the worker is stopping: the projection commit was not "
                                    "started, its jobs given back")
        soon = soon_from_thread()
        if soon is None:  # not asyncio nor trio: the plain way, not abandoned on exit
            return await anyio.to_thread.run_sync(self.sink.apply, writes,
                                                  abandon_on_cancel=True)
        finished = anyio.Event()
        box: list[tuple[bool, Any]] = []

        def call() -> None:
            try:
                box.append((True, self.sink.apply(writes)))
            except BaseException as exc:  # handed to the loop, never lost in the thread
                box.append((False, exc))
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is gone: no one waits
                    soon(finished.set)

        threading.Thread(target=call, name="jobspool-projection-commit", daemon=True).start()
        with anyio.CancelScope() as scope:
            self.commit_scopes.add(scope)
            try:
                with anyio.move_on_after(PROJECTION_CALL_SECONDS):
                    await finished.wait()
            finally:
                self.commit_scopes.discard(scope)
        if box:
            ok, value = box[0]
            if ok:
                return value
            raise value
        cut = "the worker is stopping" if scope.cancel_called else \
            f"no answer within {PROJECTION_CALL_SECONDS:g} s"
        raise ProjectionTimeout(f"the projection commit did not return ({cut}; its storage "
                                "is not answering?): left running, its jobs given back")

    async def settle(self, group: list[Context]) -> None:
        """Project the group's writes (fenced), then settle every run in it."""
        for c in group:
            c.settling = True
        done = [c for c in group if isinstance(c.outcome, Completed) and not c.lost]
        if any(c.writes for c in done):
            done = self._refuse_unstorable(done)
        if any(c.writes for c in done):
            # Drop the runs whose lease is gone before their writes reach a table: a
            # canceled job has no newer write to fence it out, so the merge's (version,
            # fence) rule alone would not stop it. Leases near expiry are extended here,
            # so none can lapse while the merge runs.
            checks = await whole_in_thread(functools.partial(
                self.spool.check_leases, [c.lease for c in done],
                margin=self.config.lease_seconds / 3.0, lease_seconds=self.config.lease_seconds))
            for ctx, check in zip(done, checks, strict=True):
                if isinstance(check, LeaseLost):
                    ctx.lost = True
                else:
                    ctx.set_lease(check)
            done = [c for c in done if not c.lost]
        if any(c.writes for c in done):
            await self._project(done)
        # Whole, whatever cancels this run (see `wholecall`): cut short, the way out
        # released the jobs it was completing, and each finished handler ran again.
        await whole_in_thread(functools.partial(self._settle_sync, group))

    def _refuse_unstorable(self, done: list[Context]) -> list[Context]:
        """Fail for good, before their rows reach a table, the runs whose result the spool
        would refuse (not JSON, too large): found at the complete, after the merge, they
        were dead-lettered with their rows published. What is left goes on."""
        limit = self.spool.settings.max_job_bytes
        kept = []
        for c in done:
            assert isinstance(c.outcome, Completed)
            if c.writes and c.outcome.result is not None:  # (None always fits: admitted)
                completed = evolve(c.lease.job, state=JobState.COMPLETED, lease=None,
                                   result=c.outcome.result)
                try:
                    encode_completed(completed, max_bytes=limit)
                except JobspoolError as exc:
                    c.outcome = Failed(f"handler result refused: {exc}")
                    continue
            kept.append(c)
        return kept

    async def _project(self, done: list[Context]) -> None:
        writes = [w for c in done for w in c.writes]
        try:
            result = await self._apply_bounded(writes)
        except ProjectionTimeout as exc:
            if self.cut:
                # No fault of the storage's to report: the worker is on its way out.
                log.warning("stopping: %d jobs whose projection commit did not return within "
                            "the grace go back uncounted (%s)", len(done), exc)
                self.counters.deferred += len(done)
                self.counters.deferred_jobs.update(c.job_id for c in done)
                for c in done:
                    c.outcome = Deferred(clip_error(str(exc)), 0.0)
                return
            self._defer(done, exc)
            return
        except ProjectionUnusable:
            raise  # a verdict on its configuration, no job's fault: the worker stops (pipeline.py)
        except Exception as exc:  # outcome unknown: retry all; the fenced merge is idempotent
            if storage_fault(exc):
                self._defer(done, exc)
                return
            log.warning("projection commit failed (%s: %s); retrying its %d jobs",
                        type(exc).__name__, plain(str(exc)), len(done))
            for c in done:
                c.outcome = Errored(exc)
            return
        by_id = {c.job_id: c for c in done}
        for job_id, err in result.rejected.items():
            if job_id in by_id:
                by_id[job_id].outcome = Failed(str(err))
        faulty = {job_id: e for job_id, e in result.failed.items() if storage_fault(e)}
        for job_id, error in result.failed.items():
            if job_id in by_id and job_id not in faulty:
                by_id[job_id].outcome = Errored(plain(f"{type(error).__name__}: {error}"))
        if faulty:
            self._defer([by_id[j] for j in faulty if j in by_id], next(iter(faulty.values())))
        else:
            if self.outage_since is not None:
                log.warning("the projection's storage answers again (it first failed %.0f s "
                            "ago)", time.monotonic() - self.outage_since)
            self.storage_faults = self.counters.projection_failing = 0
            self.outage_since = None
            self.claims_paused_until = 0.0  # a write landed: claims need not wait it out
        self.counters.projected_rows += sum(result.tables.values())

    def _defer(self, runs: list[Context], exc: BaseException) -> None:
        """The projection's storage failed: give the runs back uncounted, due after as long
        as the failures have lasted so far (1 s to a minute), claim nothing meanwhile, and
        say so in one line (again each minute it lasts).

        By time, not per failed batch: a worker claiming batch after batch into an outage
        doubled the delay per batch, pushed a whole backlog a minute out within a second
        of an 8 s outage, and logged an error line per batch."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
        self.storage_faults += 1
        self.counters.projection_failing = self.storage_faults
        delay = min(DEFER_MAX_SECONDS, max(1.0, now - self.outage_since))
        self.claims_paused_until = now + delay
        error = one_line(f"{type(exc).__name__}: {exc}")
        if self.storage_faults == 1 or now - self._outage_logged_at >= DEFER_MAX_SECONDS:
            self._outage_logged_at = now
            # A fault that knows its remedy (`keying.UnkeyableTable`) says it alone.
            remedy = getattr(exc, "remedy", None) or (
                "fix its storage (space, permissions; a damaged table, which `jobspool "
                "maintain` names: restore it from a backup)")
            log.error("the projection could not be written, for its storage (%s): %d jobs "
                      "given back uncounted, due again in %g s (no claim meanwhile; the "
                      "delay grows with the outage, to a minute); %s, nothing is lost "
                      "meanwhile", error, len(runs), delay, remedy)
        else:
            log.debug("the projection's storage still fails: %d jobs given back, due again "
                      "in %g s", len(runs), delay)
        self.counters.deferred += len(runs)
        self.counters.deferred_jobs.update(c.job_id for c in runs)
        for c in runs:
            c.outcome = Deferred(clip_error(error), delay)

    def _settle_sync(self, group: list[Context]) -> None:
        refused: WriteFailed | StoreUnavailable | None = None
        completes: list[tuple[Context, Any]] = []
        fails: list[tuple[Context, Failure, bool, float | None]] = []
        releases: list[Context] = []
        deferred: list[tuple[Context, float, str]] = []
        for c in group:
            if c.lost:
                self.counters.lease_lost += 1
                if c.started:  # else `Context.runnable` said why it never started
                    log.warning("discarding the result of job %s: its lease (token %d) was "
                                "lost", c.job_id, c.token,
                                extra={"job_id": c.job_id, "token": c.token})
                self._forget(c)
                continue
            match c.outcome:
                case None:  # never started, or cut off before it could: back uncounted
                    releases.append(c)
                case Completed(result=result):
                    completes.append((c, result))
                case Retried(retry=r):
                    fails.append((c, self._failure(c, f"Retry: {r.reason}"), True, r.delay))
                case Failed(reason=reason):
                    fails.append((c, self._failure(c, reason), False, None))
                case Interrupted():
                    fails.append((c, self._failure(c, "interrupted: the worker shut down while "
                                                      "this job ran", interrupted=True), True, None))
                case Raised(exc=exc):  # the handler's own exception: its policy decides
                    fails.append((c, self._failure(c, exc), self.config.retries(c.job.kind, exc),
                                  None))
                case Errored(error=error):
                    fails.append((c, self._failure(c, error), True, None))
                case Deferred(error=why, delay=delay):
                    deferred.append((c, delay, f"deferred: {why}"))
        if completes:
            info = log.isEnabledFor(logging.INFO)
            results = self.spool.complete_many([(c.lease, result) for c, result in completes])
            for (c, _), res in zip(completes, results, strict=True):
                if isinstance(res, LeaseLost):
                    self._count_lost(c, res)
                elif isinstance(res, WriteFailed | StoreUnavailable):
                    # Still leased, its result kept and settled again after the backoff. A
                    # read of its file refused for a moment (EMFILE, EIO) is no verdict on
                    # the result: taken as one, a job that succeeded was dead-lettered.
                    refused = refused or res
                    continue
                elif isinstance(res, JobTooLarge):
                    # Dead-lettered by the store itself: its result does not fit (DESIGN §9).
                    self.counters.dead_lettered += 1
                    log.warning("job %s (%s) dead-lettered: %s", c.job_id, c.job.kind, res,
                                extra={"job_id": c.job_id, "kind": c.job.kind,
                                       "state": "dead_letter"})
                elif isinstance(res, JobspoolError):
                    # The result cannot be stored (not JSON): that will not change.
                    fails.append((c, self._failure(c, f"handler result refused: {res}"),
                                  False, None))
                    continue
                else:
                    self.counters.completed += 1
                    if info:  # checked once per group: the record's `extra` costs per job
                        log.info("job %s (%s) completed", c.job_id, c.job.kind,
                                 extra={"job_id": c.job_id, "kind": c.job.kind,
                                        "token": c.token, "state": "completed"})
                self._forget(c)
        if fails:
            refused = self._record_failures(fails, refused)
        for c in releases:
            self._release(c)
        for c, delay, why in deferred:
            self._release(c, delay=delay, reason=why)
        if refused is not None:
            # The disk refused part of the settle: the loop releases what is unsettled and
            # backs off (WriteFailed says what to fix).
            raise refused

    def _record_failures(self, fails: list[tuple[Context, Failure, bool, float | None]],
                         refused: WriteFailed | StoreUnavailable | None, *,
                         first: bool = True) -> WriteFailed | StoreUnavailable | None:
        """`fail_many` and its counting. A failure the store refuses as given (a delay
        it cannot take) is recorded again plainly, with why, on the normal backoff:
        left alone, the job sat leased until its lease expired, its error unrecorded."""
        results = self.spool.fail_many([(c.lease, err, retry, delay)
                                        for c, err, retry, delay in fails])
        again: list[tuple[Context, Failure, bool, float | None]] = []
        for (c, err, retry, _), res in zip(fails, results, strict=True):
            if isinstance(res, LeaseLost):
                self._count_lost(c, res)
            elif isinstance(res, WriteFailed | StoreUnavailable):
                refused = refused or res
                continue
            elif isinstance(res, JobspoolError):
                if first:
                    again.append((c, self._failure(c, f"{err.error} (recorded without its "
                                                      f"retry delay, refused: {res})"),
                                  retry, None))
                    continue
                log.error("could not record the failure of job %s: %s", c.job_id, res)
            elif res.state is JobState.READY:  # interrupted: back at once, attempt counted
                self.counters.interrupted += 1
            elif res.state is JobState.DEAD_LETTER:
                self.counters.dead_lettered += 1
                log.warning("job %s (%s) dead-lettered: %s", c.job_id, c.job.kind,
                            res.last_error, extra={"job_id": c.job_id, "kind": c.job.kind,
                                                   "state": "dead_letter"})
            else:
                self.counters.retried += 1
            self._forget(c)
        if again:
            refused = self._record_failures(again, refused, first=False)
        return refused

    def _failure(self, c: Context, error: object, *, interrupted: bool = False) -> Failure:
        """The failed run as the spool records it: message, traceback, the kind's policy."""
        kind = c.job.kind
        return Failure(error=clip_error(error), traceback=c.traceback,
                       policy=self.config.retry_policy(kind), max_attempts=self.config.max_attempts_for(kind),
                       interrupted=interrupted)

    def _forget(self, c: Context) -> None:
        c.drop_progress()  # settled, and its progress file (if any) gone
        if not isinstance(c.outcome, Deferred):
            # Deferred earlier in this run, it ran again to an outcome of its own.
            self.counters.deferred_jobs.discard(c.job_id)
        self.in_hand.pop(c.job_id, None)
        if c.started and c.mark_kept:  # the others were cleared when their handlers returned
            self.spool.note_running([c.token], started=False)

    def _count_lost(self, c: Context, err: LeaseLost) -> None:
        self.counters.lease_lost += 1
        if err.reason.startswith(("job is ready", "job is retryable")):
            self._shun(c)  # given back behind our back (its own handler released it)
        log.warning("lease lost on job %s (token %d) before settling: %s; result discarded",
                    c.job_id, c.token, err.reason, extra={"job_id": c.job_id, "token": c.token})

    def _shun(self, c: Context) -> None:
        """Leave a job given back behind this run's back alone for a lease's time, at most
        `SHUN_SECONDS`: a handler that released its own job made the run claim it again at
        once, for ever (no attempt counted) — `run_until_idle` never returned, at full CPU.
        Bounded, because an operator's cancel then requeue of the running job looks the
        same: with a 60 s lease it sat due and unclaimed for a minute, unexplained. A lease
        that merely lapsed is not shunned: its job's next claim counts an attempt."""
        self.shunned[c.job_id] = time.monotonic() + min(self.config.lease_seconds,
                                                        SHUN_SECONDS)

    def avoided(self) -> frozenset[str]:
        """The jobs the next claim leaves alone (`_shun`); forgets the ones whose time is up."""
        if not self.shunned:
            return frozenset()
        now = time.monotonic()
        for job_id in [j for j, until in self.shunned.items() if until <= now]:
            del self.shunned[job_id]
        return frozenset(self.shunned)

    def _release(self, c: Context, *, delay: float = 0.0, reason: str | None = None) -> None:
        try:
            self.spool.release(c.lease, delay=delay, reason=reason)
            self.counters.released += 1
        except LeaseLost:
            self.counters.lease_lost += 1
        self._forget(c)

    def release_unsettled(self, group: list[Context]) -> None:
        """Give back what a failed settle left: release the leases, forget the lost runs."""
        for c in group:
            if not c.settled:
                try:
                    if c.lost:
                        self._forget(c)
                    else:
                        self._release(c)
                except (OSError, JobspoolError) as exc:
                    log.warning("could not release job %s: %s", c.job_id, exc)
                    self.counters.unreleased += 1
                    self._forget(c)
