"""`Worker`: runs handlers over a spool under heartbeated, fenced leases.

The worker is the entry points (`run_until_idle`, `arun_until_idle`,
`run_forever`, `stop`), signal handling and metrics, over four parts it
builds once at construction and hands to each run's `Pipeline` (the loop
itself — claim, run, beat, settle):

- `config` (`WorkerConfig`, `config.py`): handlers, kinds, sizes, lease and
  grace seconds, per-kind policies — validated here, then frozen;
- `supervisor` (`Supervisor`, `supervisor.py`): the backoff and the crash
  count after a failure of our own machinery, and when to give up;
- `sink` (`LanceSink`, `sink.py`): the projection the runs write through,
  and its maintenance beat;
- itself, as the run's `Lifecycle` (`host.py`): stop flags, the notes a
  process pool listens to, published counters.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from jobspool.errors import ConfigError, InvalidJob, JobspoolError, RunningLoopError
from jobspool.errors import WorkerCrashed as WorkerCrashed
from jobspool.policy import Policy
from jobspool.queue import signalhub
from jobspool.queue.arguments import check_flag
from jobspool.queue.config import Handler as Handler
from jobspool.queue.config import WorkerConfig
from jobspool.queue.context import Context as Context
from jobspool.queue.idle import MIN_POLL_SECONDS
from jobspool.queue.interrupts import stop_signals
from jobspool.queue.job import validate_int, validate_seconds
from jobspool.queue.layout import default_projection_of, projection_inside_spool
from jobspool.queue.pipeline import Pipeline
from jobspool.queue.report import Counters, FinishedRun
from jobspool.queue.report import RunReport as RunReport
from jobspool.queue.runchecks import check_run_options, in_event_loop
from jobspool.queue.runs import Runs
from jobspool.queue.sink import LanceSink
from jobspool.queue.supervisor import Supervisor

if TYPE_CHECKING:
    from jobspool.app import App
    from jobspool.async_spool import AsyncSpool
    from jobspool.projection.lance import ProjectionStore
    from jobspool.queue.api import SpoolAPI as Spool
    from jobspool.schedules import Schedule

log = logging.getLogger(__name__)
# The longest a run's end waits for projection maintenance in progress (`_maintenance_wait`).
MAINTENANCE_WAIT = 30.0


class Worker:
    """Runs handlers over a spool; see the module docstring for the batch cycle."""

    def __init__(
        self,
        spool: Spool | AsyncSpool,
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
        policies: Mapping[str, Policy] | None = None,
        schedules: Sequence[Schedule] | None = None,  # periodic jobs (jobspool.schedules)
        storage_options: Mapping[str, str] | None = None,  # object-storage projection settings
    ) -> None:
        from jobspool.app import App
        from jobspool.async_spool import AsyncSpool

        if isinstance(spool, AsyncSpool):  # the async facade: the worker drives its store
            spool = spool.spool
        if isinstance(handlers, App):
            app = handlers
            handlers = app.handlers
            projection = projection if projection is not None else app.projection
            keys = keys if keys is not None else app.keys
            policies = policies if policies is not None else app.policies
            schedules = schedules if schedules is not None else app.schedules
            storage_options = storage_options if storage_options is not None else app.storage_options
        if isinstance(spool, str | os.PathLike) or not hasattr(spool, "claim"):
            raise TypeError(f"Worker needs an open Spool, got {spool!r:.80}: "
                            "Worker(Spool(root), handlers)")
        if getattr(spool, "read_only", False) is True:
            # Every claim would be refused: it crash-looped five times, then WorkerCrashed.
            check = getattr(spool, "check_writable", None)
            if callable(check):
                check("run a worker")
        ensure_local_dir = getattr(spool, "ensure_local_dir", None)
        if ensure_local_dir is not None:  # a database's spool: its machine-local directory
            ensure_local_dir()
        if handlers is not None and not isinstance(handlers, Mapping):
            raise TypeError(f"handlers must map job kinds to functions (a dict or an App), "
                            f"got {type(handlers).__name__}: {{'kind': handler}}")
        check_flag("maintenance", maintenance)
        self.spool = spool
        self.config = WorkerConfig.create(
            handlers,
            owner=owner or f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:x}",
            lease_seconds=lease_seconds, default_lease_seconds=spool.lease_seconds,
            retry_base_seconds=spool.retry_base_seconds,
            retry_max_seconds=spool.retry_max_seconds,
            concurrency=concurrency, batch_size=batch_size, kinds=kinds,
            grace_seconds=grace_seconds, keys=keys, policies=policies)
        from jobspool.projection.objectstore import check_storage_options
        from jobspool.projection.spec import check_usable, keys_of

        options = check_storage_options(storage_options)
        check_usable(projection, self.config.keys, options)
        self.config = self.config.replace(keys=keys_of(projection, self.config.keys))
        if isinstance(projection, str | os.PathLike):
            inside = projection_inside_spool(spool.root, os.fspath(projection))
            if inside is not None:
                raise ConfigError(inside)

        self.sink = LanceSink(projection, default_uri=default_projection_of(spool),
                              keys=self.config.keys,
                              storage_options=options,
                              maintenance=maintenance, min_live_token=spool.min_live_token)
        # The spool's register of runs (`close` stops them first); a store of an earlier
        # shape has none.
        self._runs: Runs = getattr(spool, "runs", None) or Runs()
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self._stop_at: float | None = None  # when the standing stop was asked (monotonic)
        self._waker: Callable[[], None] | None = None  # wakes the running pipeline (on_stop)
        self._honored = False  # the standing stop()/hurry() has ended a run (see _begin_run)
        self.serving_daemon = False  # its run serves in a daemon thread (signalhub)
        self.supervisor = Supervisor(max_crashes=max_crashes,
                                     crash_window_seconds=crash_window_seconds,
                                     stopping=self._stop.is_set)
        # Hooks a process pool's child sets to tell its supervisor what runs (see pool.py).
        self.on_start: Callable[[Context], None] | None = None
        # Idle, take back the leases of dead worker processes (a pool's child leaves that
        # to its supervisor: `poolchild.attach_child`).
        self.reclaims_dead = True
        self.on_end: Callable[[Context], None] | None = None
        self.on_hung: Callable[[Context], None] | None = None
        # In a sync handler's thread as it returns: a pool child tells its supervisor at
        # once, whose time limit a loop held up would otherwise see run out.
        self.on_returned: Callable[[Context], None] | None = None
        self.on_began: Callable[[Context], None] | None = None  # ... as it begins (timed)
        self._live: Counters | None = None
        self._published = 0.0
        # Fired by run_forever (jobspool.schedules.serve_schedules), not by run_until_idle;
        # a schedule for a kind without a handler is refused here, at worker start.
        from jobspool.schedules import check_schedule_sizes, check_schedules

        self.schedules: tuple[Schedule, ...] = check_schedules(schedules or (), self.handlers,
                                                               where="worker")
        check_schedule_sizes(self.schedules, spool.settings.max_job_bytes)

    # ------------------------------------------------------------ configuration

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self.config.handlers

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds this worker claims."""
        return self.config.kinds

    @property
    def keys(self) -> Mapping[str, str]:
        return self.config.keys

    @property
    def policies(self) -> Mapping[str, Policy]:
        return self.config.policies

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def lease_seconds(self) -> float:
        return self.config.lease_seconds

    @property
    def grace_seconds(self) -> float:
        """How long running handlers get to finish after a stop (settable, e.g. `--grace`)."""
        return self.config.grace_seconds

    @grace_seconds.setter
    def grace_seconds(self, value: float) -> None:
        self.config = self.config.replace(grace_seconds=value)

    @property
    def owner(self) -> str:
        """The name this worker's leases carry (settable before a run)."""
        return self.config.owner

    @owner.setter
    def owner(self, value: str) -> None:
        self.config = self.config.replace(owner=value)

    @property
    def storage_options(self) -> dict[str, str] | None:
        return self.sink.storage_options

    def timeout_for(self, kind: str) -> float | None:
        """The time limit of one run of `kind`, if its policy sets one."""
        return self.config.timeout_for(kind)

    # ------------------------------------------------------------ public entry points

    def run_until_idle(self, max_jobs: int | None = None, *, wait_for_retries: float = 0.0,
                       progress: Callable[[RunReport], None] | None = None,
                       handle_signals: bool = False,
                       wait_for_store: float | None = None) -> RunReport:
        """Drain the due jobs this worker handles, then return (sync).

        A store outage (unreachable, its disk full) is waited out; with
        `wait_for_store`, one lasting that many seconds ends the run instead, its
        leases given back where the store takes them, raising `WorkerCrashed`.

        From inside a running event loop use `await worker.arun_until_idle()`:
        this one raises `RunningLoopError` (a `RuntimeError`) there instead of
        blocking the loop.
        """
        if in_event_loop():
            raise RunningLoopError("Worker.run_until_idle() was called inside a running event "
                                   "loop; use `await worker.arun_until_idle()` there")

        async def main() -> RunReport:
            return await self.arun_until_idle(max_jobs, wait_for_retries=wait_for_retries,
                                              progress=progress, handle_signals=handle_signals,
                                              wait_for_store=wait_for_store)
        return anyio.run(main)

    async def arun_until_idle(self, max_jobs: int | None = None, *, wait_for_retries: float = 0.0,
                              progress: Callable[[RunReport], None] | None = None,
                              handle_signals: bool = False,
                              wait_for_store: float | None = None) -> RunReport:
        """Drain due jobs; with `wait_for_retries` > 0, also wait for retries due within it
        (`wait_for_store`: see `run_until_idle`).

        With `handle_signals` (what the CLI does), SIGTERM/SIGINT stop it the
        way they stop `run_forever`: no new claims, running handlers get
        `grace_seconds`, the rest are released, and it returns normally.
        """
        check_run_options(progress, handle_signals)
        # Before any task group, so a refused endpoint is raised as itself (not in a group).
        await anyio.to_thread.run_sync(self.sink.before_claims, self.spool)
        if handle_signals and threading.current_thread() is threading.main_thread():
            result: RunReport | Exception | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_signals)
                try:
                    result = await self._drain(max_jobs, wait_for_retries, progress,
                                               wait_for_store)
                except Exception as exc:  # the run's verdict, or its `progress` raising
                    result = exc  # raised below as itself, outside the task group
                finally:
                    tg.cancel_scope.cancel()
            if isinstance(result, Exception):
                raise result
            assert result is not None
            return result
        return await self._drain(max_jobs, wait_for_retries, progress, wait_for_store)

    async def _drain(self, max_jobs: int | None, wait_for_retries: float,
                     progress: Callable[[RunReport], None] | None,
                     wait_for_store: float | None) -> RunReport:
        if max_jobs is not None:
            validate_int("max_jobs", max_jobs, minimum=0)
        wait_for_retries = validate_seconds("wait_for_retries", wait_for_retries)
        if wait_for_store is not None and wait_for_store != math.inf:
            wait_for_store = validate_seconds("wait_for_store", wait_for_store)
        else:
            wait_for_store = None  # waited out however long it lasts
        self._begin_run()
        counters = Counters()
        self._live = counters
        run = self._runs.begin(self)
        try:
            try:
                await Pipeline(self.spool, self.config, counters, self.sink, self.supervisor,
                               self, until_idle=True, max_jobs=max_jobs,
                               wait_for_retries=wait_for_retries,
                               wait_for_store=wait_for_store, progress=progress).run()
            finally:
                self.sink.close(wait=self._maintenance_wait(), give_up=self._hurry.is_set)
                self.publish(counters, final=True)  # a finished run is no stale worker
                self._live = None
                self._stop_honored()
            # Before the run ends: a close() waiting for it (or left to it) closes the spool.
            unhandled, waiting, next_due_in, due = await anyio.to_thread.run_sync(
                self._left_behind)
        finally:
            self._runs.end(run)
        return counters.freeze(unhandled, waiting, next_due_in, due)

    def run_forever(self, *, poll_seconds: float = 0.5, handle_signals: bool = True,
                    progress: Callable[[RunReport], None] | None = None) -> Any:
        """Serve until `stop()` or a signal (sync; see `arun_forever` for the behavior).

        Blocks and returns the `RunReport` when called without a running event
        loop. Inside one it returns the `arun_forever(...)` coroutine instead,
        so `await worker.run_forever()` (the form of earlier versions) still
        works; new async code should call `arun_forever` directly.
        """
        coro = self.arun_forever(poll_seconds=poll_seconds, handle_signals=handle_signals,
                                 progress=progress)
        if in_event_loop():
            return coro

        async def main() -> RunReport:
            return await coro
        # Awaitable too, so `asyncio.run(worker.run_forever())` (DESIGN §5's form) works.
        try:
            return FinishedRun.of(anyio.run(main))
        finally:
            # A Ctrl-C before the loop first ran `main` left `coro` unstarted: closed, it
            # adds no "coroutine ... was never awaited" warning to the one-line exit.
            coro.close()

    async def arun_forever(self, *, poll_seconds: float = 0.5, handle_signals: bool = True,
                           progress: Callable[[RunReport], None] | None = None) -> RunReport:
        """Serve until `stop()` or SIGTERM/SIGINT, then return the run's report.

        The first signal (or `stop()`) stops claiming and lets running handlers
        finish within `grace_seconds`; runs still going then are cut off: their
        leases are released with the attempt counted, and jobs that never
        started go back uncounted. A second signal (or `hurry()`) cuts off
        every run at once.
        """
        check_run_options(progress, handle_signals)
        poll_seconds = validate_seconds("poll_seconds", poll_seconds, positive=True)
        if poll_seconds < MIN_POLL_SECONDS:
            raise InvalidJob(f"poll_seconds must be at least {MIN_POLL_SECONDS:g} (a safety "
                             f"poll: new jobs wake an idle worker at once), got "
                             f"{poll_seconds!r}", field="poll_seconds")
        await anyio.to_thread.run_sync(self.sink.before_claims, self.spool)
        self._begin_run()
        counters = Counters()
        self._live = counters
        crashed: WorkerCrashed | None = None
        run = self._runs.begin(self)
        try:
            await self._serve(counters, poll_seconds, handle_signals, progress)
        except WorkerCrashed as gave_up:
            crashed = gave_up
        finally:
            self._stop_honored()
            self._runs.end(run)
        if crashed is not None:
            raise crashed
        return counters.freeze()

    async def _serve(self, counters: Counters, poll_seconds: float, handle_signals: bool,
                     progress: Callable[[RunReport], None] | None) -> None:
        crashed: Exception | None = None
        elsewhere = handle_signals and threading.current_thread() is not threading.main_thread()
        if elsewhere:
            self.serving_daemon = threading.current_thread().daemon
            signalhub.attach(self)  # only the main thread hears signals: stopped from there
        async with anyio.create_task_group() as tg:
            if handle_signals and not elsewhere:
                tg.start_soon(self._watch_signals)
            if self.schedules:  # periodic jobs: see jobspool.schedules
                from jobspool.schedules import serve_schedules

                tg.start_soon(serve_schedules, self)
            try:
                await Pipeline(self.spool, self.config, counters, self.sink, self.supervisor,
                               self, until_idle=False, poll_seconds=poll_seconds,
                               progress=progress).run()
            except Exception as exc:  # the run's verdict, or its `progress` raising
                crashed = exc  # raised below as itself, outside the task group
            finally:
                if elsewhere:
                    signalhub.detach(self)
                self.sink.close(wait=self._maintenance_wait(), give_up=self._hurry.is_set)
                self.publish(counters, final=True)
                self._live = None
                tg.cancel_scope.cancel()
        if crashed is not None:
            raise crashed

    def live_report(self) -> RunReport | None:
        """The counters of the run in progress (None between runs), for metrics."""
        live = self._live
        return None if live is None else live.freeze()

    def publish(self, counters: Counters, *, final: bool = False) -> None:
        """Every few seconds, leave our counters where `jobspool stats --prometheus` finds them."""
        from jobspool import metrics

        now = time.monotonic()
        try:
            if final:
                metrics.publish_worker_report(self.spool, self.owner, counters.freeze(),
                                              final=True)
            elif now - self._published >= 5.0:
                self._published = now
                metrics.publish_worker_report(self.spool, self.owner, counters.freeze())
        except OSError as exc:  # advisory data: never let it stop the worker
            log.debug("could not publish worker metrics: %s", exc)

    def stop(self) -> None:
        """Ask the worker to stop claiming; running handlers get `grace_seconds` to finish.

        Asked between runs, it stops the next run at once; a run begun after a
        stopped one serves normally."""
        self._honored = False
        if not self._stop.is_set():
            self._stop_at = time.monotonic()
        self._stop.set()
        self.spool.stop_retrying()
        self._wake_run()

    def on_stop(self, wake: Callable[[], None] | None) -> None:
        self._waker = wake

    def _wake_run(self) -> None:
        wake = self._waker
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: none to wake
                wake()

    def _stop_honored(self) -> None:
        # A run that ended has obeyed any stop()/hurry() asked before its end (one asked
        # before the run began stopped it at once, so a stop() racing a thread's start is
        # never lost). `stopping` stays true until the next run begins, which starts afresh:
        # a stop left standing would make every later run return without claiming.
        self._honored = self._stop.is_set()
        self.spool.stop_retrying(False)  # the run is over: other users of the spool retry

    def _begin_run(self) -> None:
        if self._honored:
            self._honored = False
            self._stop.clear()
            self._hurry.clear()
            self._stop_at = None
            self.spool.stop_retrying(False)

    def hurry(self) -> None:
        """Stop now: cut off every running handler and release its lease (a second signal)."""
        self._honored = False
        if not self._stop.is_set():
            self._stop_at = time.monotonic()
        self._stop.set()
        self._hurry.set()
        self.spool.stop_retrying()
        self._wake_run()

    def _maintenance_wait(self) -> float:
        """How long a run's end waits for projection maintenance in progress (a LanceDB
        compaction step): up to `MAINTENANCE_WAIT`, after a stop only what is left of its
        grace, after a hurry none. It waited 30 s past `--grace` whatever was asked; what
        it leaves is a step lance commits whole or not at all, retried by a later run."""
        if not self._stop.is_set():
            return MAINTENANCE_WAIT
        if self._hurry.is_set() or self._stop_at is None:
            return 0.0
        left = self.config.grace_seconds - (time.monotonic() - self._stop_at)
        return max(0.0, min(MAINTENANCE_WAIT, left))

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def hurrying(self) -> bool:
        return self._hurry.is_set()

    def note_start(self, ctx: Context) -> None:
        if self.on_start is not None:
            self.on_start(ctx)

    def note_end(self, ctx: Context) -> None:
        if self.on_end is not None:
            self.on_end(ctx)

    def note_began(self, ctx: Context) -> None:
        if self.on_began is not None:
            self.on_began(ctx)

    def note_returned(self, ctx: Context) -> None:
        if self.on_returned is not None:
            self.on_returned(ctx)

    def note_hung(self, ctx: Context) -> None:
        """A sync handler passed its time limit; its thread cannot be stopped. A store that
        can end what the thread holds open (PostgreSQL: a fenced block's transaction, whose
        row lock the failure's record would wait on for ever) is told."""
        abandon = getattr(self.spool, "abandon_blocks", None)
        if abandon is not None and ctx.thread_ident is not None:
            try:
                abandon(ctx.thread_ident)
            except (JobspoolError, OSError) as exc:
                log.warning("could not end the fenced block of job %s: %s", ctx.job_id, exc)
        if self.on_hung is not None:
            self.on_hung(ctx)

    # ------------------------------------------------------------ support

    async def _watch_signals(self) -> None:
        # Shared with every worker of the process that handles signals: one signal stops
        # them all, and the last to end puts back the process's own handlers (signalhub).
        signals = stop_signals()
        signalhub.enter(self, signals)
        try:
            with anyio.open_signal_receiver(*signals) as received:
                async for signum in received:
                    signalhub.deliver(signum, self)
        finally:
            signalhub.leave(self, signals)

    def _left_behind(self) -> tuple[dict[str, int], int, float | None, int]:
        """What an idle run left: due jobs of kinds this worker has no handler for (per
        kind), and jobs of its own kinds still to run (how many, seconds until the first is
        due: 0 for one that came due after the run's last claim, as a retry of a few ms'
        backoff does on PostgreSQL; it was counted nowhere, and the run said one job was
        left when two were)."""
        out: dict[str, int] = {}
        waiting, first, due_now = 0, None, 0
        now = self.spool.now()
        try:
            for kind, left in self.spool.waiting().items():
                if kind not in self.kinds:
                    if left.due:
                        out[kind] = left.due
                    continue
                waiting += left.due + left.later
                due_now += left.due
                at = now if left.due else left.next_at
                if at is not None:
                    first = at if first is None else min(first, at)
        except (JobspoolError, OSError) as exc:
            # A report's footnote: a store that went away must not turn a finished run
            # (or a clean stop) into a crash.
            log.warning("could not list the jobs left behind: %s", exc)
        return (out, waiting, None if first is None else round(max(0.0, first - now), 3),
                due_now)

    def projection_store(self) -> ProjectionStore:
        """The projection this worker writes through (opened on first use: lancedb is slow
        to import)."""
        return self.sink.store()
