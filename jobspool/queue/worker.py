"""`Worker`: claims batches, runs handlers under heartbeated leases, settles them together.

One batch goes through four steps:
1. claim up to `batch_size` jobs of the kinds this worker handles (one lock
   hold, one shared flush);
2. run their handlers, at most `concurrency` at once (sync handlers in
   worker threads, async ones on the loop), while one beat task extends
   every unsettled lease of the batch every `lease_seconds / 3`;
3. apply the projection writes of the jobs that succeeded as one merge per
   table (group commit); a table whose commit fails fails its jobs
   (retryable), rows that do not fit dead-letter their own job;
4. settle: complete the successes and fail the failures in one batch each.

A heartbeat refused with `LeaseLost` marks the job lost: whatever its
handler returns later is discarded (counted, logged), never written.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from jobspool.errors import JobspoolError, LeaseLost, ProjectionError
from jobspool.queue.context import Context as Context
from jobspool.queue.job import Job, validate_int, validate_kind, validate_seconds
from jobspool.queue.signals import Fail, Retry
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.app import App
    from jobspool.projection.lance import ProjectionStore
    from jobspool.queue.spool import Spool

log = logging.getLogger(__name__)

Handler = Callable[[Job, Context], Any]


class WorkerCrashed(JobspoolError):
    """Raised when the worker's own machinery failed repeatedly in a short time."""


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a worker run did."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0
    released: int = 0
    duration: float = 0.0
    projected_rows: int = 0
    crashes: int = 0
    unhandled: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Settled jobs per second."""
        settled = self.completed + self.retried + self.dead_lettered
        return settled / self.duration if self.duration > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate"] = round(self.rate, 2)
        return d


@dataclass
class _Counters:
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0
    released: int = 0
    projected_rows: int = 0
    crashes: int = 0
    started: float = field(default_factory=time.monotonic)

    def freeze(self, unhandled: dict[str, int] | None = None) -> RunReport:
        return RunReport(self.claimed, self.completed, self.retried, self.dead_lettered,
                         self.lease_lost, self.released, time.monotonic() - self.started,
                         self.projected_rows, self.crashes, dict(unhandled or {}))


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 - async callable objects


class Worker:
    """Runs handlers over a spool; see the module docstring for the batch cycle."""

    def __init__(
        self,
        spool: Spool,
        handlers: Mapping[str, Handler] | App | None = None,
        *,
        concurrency: int = 4,
        batch_size: int = 50,
        projection: Any = None,
        kinds: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        owner: str | None = None,
        grace_seconds: float = 30.0,
        maintenance: bool = True,
        keys: Mapping[str, str] | None = None,
        max_crashes: int = 5,
        crash_window_seconds: float = 60.0,
    ) -> None:
        from jobspool.app import App

        if isinstance(handlers, App):
            app = handlers
            handlers = app.handlers
            projection = projection if projection is not None else app.projection
            keys = keys if keys is not None else app.keys
        if not handlers:
            raise JobspoolError("a worker needs at least one handler (kind -> function)")
        for kind, fn in handlers.items():
            validate_kind(kind)
            if not callable(fn):
                raise JobspoolError(f"handler for kind {kind!r} is not callable: {fn!r}")
        self.spool = spool
        self.handlers: dict[str, Handler] = dict(handlers)
        self.concurrency = validate_int("concurrency", concurrency, minimum=1)
        self.batch_size = validate_int("batch_size", batch_size, minimum=1)
        self.lease_seconds = spool.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        self.grace_seconds = validate_seconds("grace_seconds", grace_seconds)
        wanted = set(self.handlers) if kinds is None else set(kinds) & set(self.handlers)
        self.kinds = frozenset(wanted)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:x}"
        self._projection_spec = projection
        self._projection: ProjectionStore | None = None
        self._keys = dict(keys or {})
        self._maintenance_enabled = maintenance
        self._beat: Any = None
        self._stop = threading.Event()
        self._max_crashes = max_crashes
        self._crash_window = crash_window_seconds
        self._crash_times: list[float] = []
        self._async = {k: _is_async(fn) for k, fn in self.handlers.items()}
        self._live: _Counters | None = None
        self._published = 0.0

    # ------------------------------------------------------------ public entry points

    def run_until_idle(self, max_jobs: int | None = None, *, wait_for_retries: float = 0.0,
                       progress: Callable[[RunReport], None] | None = None,
                       handle_signals: bool = False) -> RunReport:
        """Drain the due jobs this worker handles, then return (sync)."""
        async def main() -> RunReport:
            return await self.arun_until_idle(max_jobs, wait_for_retries=wait_for_retries,
                                              progress=progress, handle_signals=handle_signals)
        return anyio.run(main)

    async def arun_until_idle(self, max_jobs: int | None = None, *, wait_for_retries: float = 0.0,
                              progress: Callable[[RunReport], None] | None = None,
                              handle_signals: bool = False) -> RunReport:
        """Drain due jobs; with `wait_for_retries` > 0, also wait for retries due within it.

        With `handle_signals` (what the CLI does), SIGTERM/SIGINT stop it the
        way they stop `run_forever`: no new claims, running handlers get
        `grace_seconds`, the rest are released, and it returns normally.
        """
        if handle_signals and threading.current_thread() is threading.main_thread():
            result: RunReport | WorkerCrashed | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_signals)
                try:
                    result = await self._drain(max_jobs, wait_for_retries, progress)
                except WorkerCrashed as exc:
                    result = exc  # raised below, outside the task group
                finally:
                    tg.cancel_scope.cancel()
            if isinstance(result, WorkerCrashed):
                raise result
            assert result is not None
            return result
        return await self._drain(max_jobs, wait_for_retries, progress)

    async def _drain(self, max_jobs: int | None, wait_for_retries: float,
                     progress: Callable[[RunReport], None] | None) -> RunReport:
        if max_jobs is not None:
            validate_int("max_jobs", max_jobs, minimum=0)
        wait_for_retries = validate_seconds("wait_for_retries", wait_for_retries)
        counters = _Counters()
        self._live = counters
        try:
            while not self._stop.is_set():
                want = self.batch_size if max_jobs is None else min(
                    self.batch_size, max_jobs - counters.claimed)
                if want <= 0:
                    break
                try:
                    n = await self._cycle(want, counters)
                except Exception as exc:  # our machinery, never a handler (those are caught)
                    await self._supervise(exc, counters)
                    continue
                if progress is not None:
                    progress(counters.freeze())
                if n:
                    continue
                if not await self._wait_for_due(wait_for_retries):
                    break
        finally:
            self._close_beat()
            self._live = None
        return counters.freeze(await anyio.to_thread.run_sync(self._unhandled))

    async def run_forever(self, *, poll_seconds: float = 0.5, handle_signals: bool = True,
                          progress: Callable[[RunReport], None] | None = None) -> RunReport:
        """Serve until `stop()` or SIGTERM/SIGINT: stop claiming, let running handlers finish
        within `grace_seconds`, release the leases of those that did not, return."""
        counters = _Counters()
        self._live = counters
        idle = 0.01
        crashed: WorkerCrashed | None = None
        async with anyio.create_task_group() as tg:
            if handle_signals and threading.current_thread() is threading.main_thread():
                tg.start_soon(self._watch_signals)
            try:
                while not self._stop.is_set():
                    try:
                        n = await self._cycle(self.batch_size, counters)
                    except Exception as exc:  # our machinery, never a handler (those are caught)
                        try:
                            await self._supervise(exc, counters)
                        except WorkerCrashed as gave_up:
                            crashed = gave_up  # raised below, outside the task group
                            break
                        continue
                    if progress is not None:
                        progress(counters.freeze())
                    self._publish(counters)
                    if n:
                        idle = 0.01
                        continue
                    await self._sleep_unless_stopped(idle)
                    idle = min(poll_seconds, idle * 2)
            finally:
                self._close_beat()
                self._publish(counters, final=True)
                self._live = None
                tg.cancel_scope.cancel()
        if crashed is not None:
            raise crashed
        return counters.freeze()

    def live_report(self) -> RunReport | None:
        """The counters of the run in progress (None between runs), for metrics."""
        live = self._live
        return None if live is None else live.freeze()

    def _publish(self, counters: _Counters, *, final: bool = False) -> None:
        """Every few seconds, leave our counters where `jobspool stats --prometheus` finds them."""
        from jobspool import metrics

        now = time.monotonic()
        try:
            if final:
                metrics.remove_worker_report(self.spool, self.owner)
            elif now - self._published >= 5.0:
                self._published = now
                metrics.publish_worker_report(self.spool, self.owner, counters.freeze())
        except OSError as exc:  # advisory data: never let it stop the worker
            log.debug("could not publish worker metrics: %s", exc)

    def stop(self) -> None:
        """Ask the worker to stop claiming; running handlers get `grace_seconds` to finish."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------ the batch cycle

    async def _cycle(self, want: int, counters: _Counters) -> int:
        if not self.kinds:
            return 0
        leases = await anyio.to_thread.run_sync(
            lambda: self.spool.claim(kinds=self.kinds, limit=want, owner=self.owner,
                                     lease_seconds=self.lease_seconds))
        if not leases:
            return 0
        counters.claimed += len(leases)
        ctxs = [Context(self.spool, lease, key_for=self._keys) for lease in leases]
        try:
            await self._run_batch(ctxs, counters)
        except BaseException:
            # Our machinery failed mid-batch: give back what was not settled, best effort,
            # so the jobs do not wait for their leases to expire.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._release_unsettled, ctxs, counters)
            raise
        return len(leases)

    async def _run_batch(self, ctxs: list[Context], counters: _Counters) -> None:
        limiter = anyio.CapacityLimiter(self.concurrency)
        threads = anyio.CapacityLimiter(self.concurrency)
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._beat_leases, ctxs)
            with anyio.CancelScope() as handlers_scope:
                outer.start_soon(self._cut_off_after_grace, handlers_scope)
                async with anyio.create_task_group() as tg:
                    for ctx in ctxs:
                        tg.start_soon(self._run_one, ctx, limiter, threads)
            await self._settle(ctxs, counters)
            outer.cancel_scope.cancel()

    async def _run_one(self, ctx: Context, limiter: anyio.CapacityLimiter,
                       threads: anyio.CapacityLimiter) -> None:
        async with limiter:
            if ctx.lost or self._stop.is_set():
                return  # not started: released at settle time
            fn = self.handlers[ctx.job.kind]
            try:
                if self._async[ctx.job.kind]:
                    result = await fn(ctx.job, ctx)
                else:
                    result = await anyio.to_thread.run_sync(fn, ctx.job, ctx, limiter=threads,
                                                            abandon_on_cancel=True)
                    if inspect.isawaitable(result):
                        result = await result
                ctx.outcome = ("complete", result)
            except Retry as r:
                try:
                    if r.delay is not None:
                        validate_seconds("Retry(delay=...)", r.delay)
                    ctx.outcome = ("retry", r)
                except JobspoolError as bad:
                    # The handler's mistake: retry with the normal backoff and say why.
                    ctx.outcome = ("error", bad)
            except Fail as f:
                ctx.outcome = ("fail", f.reason)
            except ProjectionError as e:
                ctx.outcome = ("fail", str(e))
            except LeaseLost:
                ctx.lost = True
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:  # a handler's fault, not ours: retry with backoff
                log.info("handler for job %s (%s) raised %s: %s", ctx.job_id, ctx.job.kind,
                         type(exc).__name__, exc, extra={"job_id": ctx.job_id, "kind": ctx.job.kind,
                                                         "token": ctx.token})
                ctx.outcome = ("error", exc)

    async def _beat_leases(self, ctxs: list[Context]) -> None:
        interval = self.lease_seconds / 3.0
        while True:
            await anyio.sleep(interval)
            live = [c for c in ctxs if not c.settled and not c.lost]
            if not live:
                continue
            try:
                results = await anyio.to_thread.run_sync(functools.partial(
                    self.spool.heartbeat_many, [c.lease for c in live],
                    lease_seconds=self.lease_seconds))
            except (OSError, JobspoolError) as exc:
                # A failed beat is not a lost lease: the leases still run for a while, and
                # the next beat (or the check before settling) finds out which survived.
                log.warning("heartbeat of %d leases failed (%s); retrying at the next beat",
                            len(live), exc)
                continue
            for ctx, res in zip(live, results, strict=True):
                if isinstance(res, LeaseLost):
                    ctx.lost = True
                    log.warning("lease lost on job %s (token %d): %s; its result will be "
                                "discarded", ctx.job_id, ctx.token, res.reason,
                                extra={"job_id": ctx.job_id, "token": ctx.token})
                else:
                    ctx.lease = res

    async def _cut_off_after_grace(self, scope: anyio.CancelScope) -> None:
        while not self._stop.is_set():
            await anyio.sleep(0.05)
        await anyio.sleep(self.grace_seconds)
        scope.cancel()

    async def _settle(self, ctxs: list[Context], counters: _Counters) -> None:
        done = [c for c in ctxs if c.outcome is not None and c.outcome[0] == "complete"
                and not c.lost]
        if any(c.writes for c in done):
            # Drop the runs whose lease is gone before their writes reach a table: a
            # canceled job has no newer write to fence it out, so the merge's (version,
            # fence) rule alone would not stop it. Leases near expiry are extended here,
            # so none can lapse while the merge runs.
            checks = await anyio.to_thread.run_sync(functools.partial(
                self.spool.check_leases, [c.lease for c in done],
                margin=self.lease_seconds / 3.0, lease_seconds=self.lease_seconds))
            for ctx, check in zip(done, checks, strict=True):
                if isinstance(check, LeaseLost):
                    ctx.lost = True
                else:
                    ctx.lease = check
            done = [c for c in done if not c.lost]
        if any(c.writes for c in done):
            await self._project(done, counters)
        await anyio.to_thread.run_sync(self._settle_sync, ctxs, counters)

    async def _project(self, done: list[Context], counters: _Counters) -> None:
        writes = [w for c in done for w in c.writes]
        try:
            store = await anyio.to_thread.run_sync(self._projection_store)
            result = await anyio.to_thread.run_sync(store.apply, writes)
        except Exception as exc:  # outcome unknown: retry all; the fenced merge is idempotent
            log.warning("projection commit failed (%s: %s); retrying its %d jobs",
                        type(exc).__name__, exc, len(done))
            for c in done:
                c.outcome = ("error", exc)
            return
        by_id = {c.job_id: c for c in done}
        for job_id, err in result.rejected.items():
            if job_id in by_id:
                by_id[job_id].outcome = ("fail", str(err))
        for job_id, error in result.failed.items():
            if job_id in by_id:
                by_id[job_id].outcome = ("error", error)
        counters.projected_rows += sum(result.tables.values())
        written = [t for t, n in result.tables.items() if n > 0]
        if self._maintenance_enabled and written:
            self._maintenance_beat(store, written)

    def _settle_sync(self, ctxs: list[Context], counters: _Counters) -> None:
        completes: list[Context] = []
        fails: list[tuple[Context, object, bool, float | None]] = []
        releases: list[Context] = []
        for c in ctxs:
            if c.lost:
                counters.lease_lost += 1
                log.warning("discarding the result of job %s: its lease (token %d) was lost",
                            c.job_id, c.token, extra={"job_id": c.job_id, "token": c.token})
                c.settled = True
            elif c.outcome is None:
                releases.append(c)
            elif c.outcome[0] == "complete":
                completes.append(c)
            elif c.outcome[0] == "retry":
                r: Retry = c.outcome[1]
                fails.append((c, f"Retry: {r.reason}", True, r.delay))
            elif c.outcome[0] == "fail":
                fails.append((c, c.outcome[1], False, None))
            else:
                fails.append((c, c.outcome[1], True, None))
        if completes:
            results = self.spool.complete_many([(c.lease, c.outcome[1]) for c in completes
                                                if c.outcome is not None])
            for c, res in zip(completes, results, strict=True):
                c.settled = True
                if isinstance(res, LeaseLost):
                    self._count_lost(c, res, counters)
                elif isinstance(res, JobspoolError):
                    # The result cannot be stored (not JSON, too large): that will not change.
                    fails.append((c, f"handler result refused: {res}", False, None))
                    c.settled = False
                else:
                    counters.completed += 1
        if fails:
            results = self.spool.fail_many([(c.lease, err, retry, delay)
                                            for c, err, retry, delay in fails])
            for (c, *_), res in zip(fails, results, strict=True):
                c.settled = True
                if isinstance(res, LeaseLost):
                    self._count_lost(c, res, counters)
                elif isinstance(res, JobspoolError):
                    log.error("could not record the failure of job %s: %s", c.job_id, res)
                elif res.state is JobState.DEAD_LETTER:
                    counters.dead_lettered += 1
                    log.warning("job %s (%s) dead-lettered: %s", c.job_id, c.job.kind,
                                res.last_error, extra={"job_id": c.job_id, "kind": c.job.kind,
                                                       "state": "dead_letter"})
                else:
                    counters.retried += 1
        for c in releases:
            self._release(c, counters)

    def _count_lost(self, c: Context, err: LeaseLost, counters: _Counters) -> None:
        counters.lease_lost += 1
        log.warning("lease lost on job %s (token %d) before settling: %s; result discarded",
                    c.job_id, c.token, err.reason, extra={"job_id": c.job_id, "token": c.token})

    def _release(self, c: Context, counters: _Counters) -> None:
        try:
            self.spool.release(c.lease)
            counters.released += 1
        except LeaseLost:
            counters.lease_lost += 1
        c.settled = True

    def _release_unsettled(self, ctxs: list[Context], counters: _Counters) -> None:
        for c in ctxs:
            if not c.settled and not c.lost:
                try:
                    self._release(c, counters)
                except (OSError, JobspoolError) as exc:
                    log.warning("could not release job %s: %s", c.job_id, exc)

    # ------------------------------------------------------------ support

    async def _supervise(self, exc: BaseException, counters: _Counters) -> None:
        """Log a failure of our own machinery, back off, and give up if it keeps failing."""
        counters.crashes += 1
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < self._crash_window]
        self._crash_times.append(now)
        log.error("worker loop failed (%s: %s); restarting", type(exc).__name__, exc,
                  exc_info=exc)
        if len(self._crash_times) >= self._max_crashes:
            raise WorkerCrashed(f"worker loop failed {len(self._crash_times)} times within "
                                f"{self._crash_window:.0f} s; last: {type(exc).__name__}: {exc}")
        await self._sleep_unless_stopped(min(5.0, 0.1 * 2 ** (len(self._crash_times) - 1)))

    async def _wait_for_due(self, bound: float) -> bool:
        """Sleep until the next retry becomes due if that is within `bound` seconds."""
        if bound <= 0:
            return False
        nxt = await anyio.to_thread.run_sync(self.spool.next_due_at, self.kinds)
        if nxt is None:
            return False
        wait = nxt - self.spool.now()
        if wait > bound:
            return False
        await self._sleep_unless_stopped(max(0.0, wait) + 0.01)
        return not self._stop.is_set()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(left, 0.05))

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.warning("received %s: no new claims; running handlers get %g s",
                            signal.Signals(signum).name, self.grace_seconds)
                self.stop()

    def _unhandled(self) -> dict[str, int]:
        """Due jobs left behind because this worker has no handler for their kind."""
        out: dict[str, int] = {}
        now = self.spool.now()
        for state in (JobState.READY, JobState.RETRYABLE):
            for job in self.spool.jobs(state=state):
                if job.kind not in self.kinds and (state is JobState.READY or job.run_at <= now):
                    out[job.kind] = out.get(job.kind, 0) + 1
        return out

    def _projection_store(self) -> ProjectionStore:
        if self._projection is None:
            from jobspool.projection.lance import ProjectionStore

            spec = self._projection_spec
            if isinstance(spec, ProjectionStore):
                self._projection = spec
            else:
                self._projection = ProjectionStore(
                    spec if spec is not None else default_projection_uri(self.spool.root))
        return self._projection

    def _maintenance_beat(self, store: ProjectionStore, tables: list[str]) -> None:
        try:
            from jobspool.projection.maintenance import MaintenanceBeat
        except ImportError:
            return
        if self._beat is None:
            self._beat = MaintenanceBeat(store, min_live_token=self.spool.min_live_token)
        for t in tables:
            self._beat.note_commit(t)
        self._beat.maybe_run()

    def _close_beat(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None


def default_projection_uri(root: Path) -> str:
    """Where a worker with no projection configured keeps its LanceDB tables: `<root>/index`."""
    return str(Path(root) / "index")

