"""Calling one handler: its time limit, and how it ended, as `ctx.outcome`.

Whatever a handler does ends as one typed outcome (`context.py`) the
pipeline settles: `Completed(result)`, `Retried(retry)`, `Failed(reason)`,
`Raised(exc)` (its own exception, `TimeLimitExceeded` included: the kind's
policy decides whether it retries), `Errored(error)` (a mistake worth the
normal backoff), `Interrupted()` (cut off by our own cancellation: shutdown
past its grace), or `ctx.lost` (it found its lease gone). `SystemExit`,
`KeyboardInterrupt` and every other `BaseException` a handler raises are
its job's failure: only a real signal stops a worker.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.from_thread
import anyio.to_thread

from jobspool.errors import (
    FencedBlockBusy,
    JobspoolError,
    LeaseLost,
    ProjectionError,
    TimeLimitExceeded,
)
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
from jobspool.queue.job import clip_error, group_leaves, validate_delay
from jobspool.queue.jobsize import clip_traceback
from jobspool.queue.procid import current_pid
from jobspool.queue.runs import HANDLER_THREADS
from jobspool.queue.runtime import (
    ABANDON_SECONDS,
    Abandoned,
    Tracked,
    cancel_requested,
    format_traceback,
    in_own_task,
    on_trio,
    thread_stack,
)
from jobspool.queue.signals import Fail, Retry

if TYPE_CHECKING:
    from jobspool.queue.monitor import Monitor

log = logging.getLogger("jobspool.queue.worker")


async def invoke(ctx: Context, fn: Callable[..., Any], *, is_async: bool,
                 timeout: float | None, monitor: Monitor, threads: anyio.CapacityLimiter,
                 on_hung: Callable[[Context], None],
                 on_wait: Callable[[], None] | None = None,
                 on_began: Callable[[Context], None] | None = None,
                 on_returned: Callable[[Context], None] | None = None) -> None:
    """Run `fn(ctx.job, ctx)` within `timeout` and record how it ended in `ctx.outcome`.

    Raises only our own cancellation (after recording `interrupted`). A sync
    handler runs in a thread (from `threads`); past its time limit it is
    abandoned — a thread cannot be stopped — and `on_hung(ctx)` is told. `on_began(ctx)` and
    `on_returned(ctx)` are called in a sync handler's thread as the handler begins and as it
    returns, before the loop hears of either.
    """
    kind = ctx.job.kind
    tracked: Tracked | None = None
    gate = _StartGate(on_began, on_returned)
    try:
        limit: anyio.CancelScope | _NoLimit = (
            _NO_LIMIT if timeout is None else anyio.move_on_after(timeout))
        with limit:
            if is_async:
                tracked = Tracked(fn(ctx.job, ctx), monitor, functools.partial(
                    _label, kind, fn, ctx.job_id), on_wait=on_wait)
                if isinstance(limit, anyio.CancelScope):
                    tracked.limit_seconds = timeout
                    monitor.limits[tracked] = (limit, ctx)
                result = await in_own_task(tracked)
            else:
                result = await anyio.to_thread.run_sync(
                    gate.run, fn, ctx, limiter=threads, abandon_on_cancel=True)
                if isinstance(result, _HandedBack):
                    # A decorator's sync wrapper of an async handler: its coroutine gets what
                    # an async handler's gets (a task, the monitor, abandonment). Awaited
                    # bare, one that swallowed its cancellation held the worker for ever.
                    tracked = Tracked(_awaited(result.awaitable), monitor, functools.partial(
                        _label, kind, fn, ctx.job_id), on_wait=on_wait)
                    if isinstance(limit, anyio.CancelScope):
                        tracked.limit_seconds = timeout
                        monitor.limits[tracked] = (limit, ctx)
                    result = await in_own_task(tracked)
        in_time = False
        if is_async and timeout is not None and tracked is not None \
                and (limit.cancel_called or anyio.current_time() > limit.deadline):
            # Past the limit on the loop's clock: another handler blocking the loop may
            # have held this one back. Judged by its own run: one that returned within its
            # limit keeps its result; one that never began goes back uncounted. Before,
            # both were failed as having "blocked the event loop" and dead-lettered.
            if tracked.returned_within(timeout):
                ctx.outcome = Completed(tracked.value)
                return
            if tracked.started_at is None:
                log.warning("job %s (%s, token %d): its time limit of %g s passed before "
                            "its handler could start (was the event loop blocked?); given "
                            "back uncounted", ctx.job_id, kind, ctx.token, timeout,
                            extra={"job_id": ctx.job_id, "kind": kind, "token": ctx.token})
                ctx.outcome = None
                return
        if limit.cancel_called and not is_async:
            # An async handler blocking the event loop held this run back: the limit passed
            # on the loop's clock, not necessarily in the handler. Charged as "abandoned,
            # still running", a job whose handler never ran, or returned in time, was
            # failed, then dead-lettered.
            if gate.drop():
                log.warning("job %s (%s, token %d): its time limit of %g s passed before "
                            "its handler could start (was the event loop blocked?); given "
                            "back uncounted", ctx.job_id, kind, ctx.token, timeout or 0.0,
                            extra={"job_id": ctx.job_id, "kind": kind, "token": ctx.token})
                ctx.outcome = None
                return
            await gate.own_limit(timeout or 0.0)
            in_time = gate.ended_within(timeout or 0.0)
            if in_time:
                if gate.error is not None:
                    raise gate.error  # the handler's own failure, recorded below
                result = gate.result
        if in_time:
            ctx.outcome = Completed(result)
        elif limit.cancel_called and (tracked is None or tracked.returned_at is None):
            # The limit passed, even if the handler swallowed it (one that returned, on trio
            # leaving its task's nursery after its limit, is judged as returning late below).
            # A sync handler that returned an awaitable (a decorator's sync wrapper of an
            # async one) was past its thread: the await on the loop was cancelled, and no
            # thread is left running. Called hung, its process was replaced for nothing.
            in_thread = not is_async and not gate.handed_back_awaitable()
            _timed_out(ctx, timeout or 0.0, sync=in_thread,
                       stack=tracked.stack() if tracked is not None else None)
            if in_thread:
                gate.while_running(functools.partial(on_hung, ctx))
        elif is_async and timeout is not None and anyio.current_time() > limit.deadline:
            # It returned past its limit: before the cancellation could reach it (an async
            # handler that blocked the loop), or after catching it. Past the limit is past
            # it: its result is void.
            # Told apart where the loop can tell: asyncio throws the cancellation in
            # (`cancel_called` stays False while a blocking handler holds the loop); trio
            # cancels its own sleeps the same way, so there only a swallow seen over
            # several steps (`Tracked`) counts.
            swallowed = tracked is not None and (
                tracked.swallowed_at is not None or tracked.returned_on_cancel or (
                    not on_trio() and limit.cancel_called))
            _timed_out(ctx, timeout or 0.0, sync=False, late=True, swallowed=swallowed)
        else:
            ctx.outcome = Completed(result)
    except Abandoned:
        if limit.cancel_called:
            _timed_out(ctx, timeout or 0.0, sync=False, abandoned=True)
        else:  # a shutdown's cancellation, swallowed: the run was cut off all the same
            log.warning("job %s (%s, token %d): its handler went on through the shutdown's "
                        "cancellation for %g s; abandoned", ctx.job_id, ctx.job.kind,
                        ctx.token, ABANDON_SECONDS,
                        extra={"job_id": ctx.job_id, "kind": ctx.job.kind, "token": ctx.token})
            ctx.outcome = Interrupted()
    except _Raised as carried:
        _handler_raised(ctx, carried.exc)
    except anyio.get_cancelled_exc_class() as exc:
        if cancel_requested():  # ours: shutdown past its grace, or the worker gave up
            ctx.outcome = Interrupted()
            raise
        _handler_raised(ctx, exc)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included:
        # whatever a handler raises is its job's failure; only a real signal stops us.
        if tracked is not None and tracked.raised_on_cancel and timeout is not None \
                and limit.cancel_called:
            # Raised on (or after swallowing) its limit's cancellation: a `Retry` or a
            # ValueError from its cleanup stood in for the TimeLimitExceeded that
            # `retry_on` and the attempt count go by.
            _timed_out(ctx, timeout, sync=False, raised=exc)
        else:
            record_raised(ctx, exc)
    finally:
        ctx.thread_ident = None
        if tracked is not None:
            monitor.limits.pop(tracked, None)


# When a run refused a fenced block (another handler awaited inside its own on this loop)
# is due again: blocks are short, and the one that broke the rule fails as it ends.
BUSY_BLOCK_DELAY = 0.5
# The most exceptions of a group looked at to tell a refused block from a failure.
GROUP_LEAVES = 100


def call_sync(ctx: Context, fn: Callable[..., Any]) -> None:
    """In a worker thread: call a sync handler with no time limit (`runners.py`) and record
    how it ended in `ctx.outcome`, as `invoke` does."""
    ident = ctx.thread_ident = threading.get_ident()
    HANDLER_THREADS.add(ident)
    pid = current_pid()
    try:
        result = fn(ctx.job, ctx)
        _child_ends(pid)
        # (None, the common result, skips isawaitable's protocol checks: ~1 µs per job)
        if result is not None and inspect.isawaitable(result):
            result = anyio.from_thread.run(_awaited, result)
        ctx.outcome = Completed(result)
    except BaseException as exc:  # as in invoke: whatever it raises is its job's failure
        _child_ends(pid, exc)
        record_raised(ctx, exc)
    finally:
        HANDLER_THREADS.discard(ident)
        ctx.thread_ident = None


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def record_raised(ctx: Context, exc: BaseException) -> None:
    """What a handler's exception makes of its run."""
    if isinstance(exc, Retry):
        try:
            if exc.delay is not None:
                validate_delay(exc.delay, "Retry(delay=...)")
            ctx.outcome = Retried(exc)
        except JobspoolError as bad:
            ctx.outcome = Errored(bad)  # the handler's mistake: normal backoff
    elif isinstance(exc, Fail):
        ctx.outcome = Failed(exc.reason)
    elif isinstance(exc, ProjectionError):
        ctx.traceback = format_traceback(exc)
        ctx.outcome = Failed(str(exc))
    elif isinstance(exc, LeaseLost) and (exc.job_id, exc.token) == (ctx.job_id, ctx.token):
        ctx.lost = True
    # Any other LeaseLost is for a lease the handler took itself (a child job it settles):
    # this run's lease still holds, so it is the handler's failure like any exception.
    elif (busy := _busy_block(exc, ctx.job_id)) is not None:
        # Another handler awaited inside its block on this loop: nothing this job did.
        ctx.outcome = Deferred(str(busy), BUSY_BLOCK_DELAY)
    else:
        _handler_raised(ctx, exc)


def _busy_block(exc: BaseException, job_id: str) -> FencedBlockBusy | None:
    """This job's `FencedBlockBusy` when that is all `exc` is: itself, the only thing in a
    task group's exception group (a block opened in a task of the handler's: dead-lettered
    as an ExceptionGroup), or what the exception it raised was raised from."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, FencedBlockBusy):
            return exc if exc.job_id == job_id else None
        if isinstance(exc, BaseExceptionGroup):
            leaves, whole = group_leaves(exc, GROUP_LEAVES)
            if whole and leaves and all(isinstance(e, FencedBlockBusy) and e.job_id == job_id
                                        for e in leaves):
                return cast(FencedBlockBusy, leaves[0])
            return None
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def _handler_raised(ctx: Context, exc: BaseException) -> None:
    ctx.traceback = format_traceback(exc)
    ctx.outcome = Raised(exc)
    log.warning("job %s (%s, token %d, attempt %d) failed: %s\n%s", ctx.job_id,
                ctx.job.kind, ctx.token, ctx.job.attempts, clip_error(exc),
                # Bounded as stored: a 50 kB message made a 50 kB log line.
                (clip_traceback(ctx.traceback) or "").rstrip("\n"),
                extra={"job_id": ctx.job_id, "kind": ctx.job.kind, "token": ctx.token})


def _timed_out(ctx: Context, timeout: float, *, sync: bool, stack: str | None = None,
               late: bool = False, abandoned: bool = False, swallowed: bool = False,
               raised: BaseException | None = None) -> None:
    # Where it was: the thread's stack now, or the cancelled coroutine's frames.
    stack = thread_stack(ctx.thread_ident) if sync else stack
    if raised is not None:
        stack = format_traceback(raised)
    detail = (f"it caught its cancellation and raised {clip_error(raised)} instead"
              if raised is not None else
              "a sync handler's thread cannot be stopped: it is abandoned, still "
              "running (under `worker --processes`, its process is replaced, which "
              "stops it)" if sync else "it caught its cancellation and returned anyway; its "
              "result is discarded" if late and swallowed else "it returned only then, "
              "having blocked the event loop, so it could not be cancelled; its result is "
              "discarded" if late else
              f"the handler went on through its cancellation for {ABANDON_SECONDS:g} s "
              "and is no longer run" if abandoned else "the handler was cancelled")
    exc = TimeLimitExceeded(ctx.job_id, ctx.job.kind, timeout, detail)
    ctx.traceback = stack or format_traceback(exc)
    ctx.outcome = Raised(exc)
    ctx.hung = sync
    log.warning("job %s (%s, token %d) ran past its time limit of %g s: %s\n%s",
                ctx.job_id, ctx.job.kind, ctx.token, timeout, detail,
                ctx.traceback.rstrip("\n"),
                extra={"job_id": ctx.job_id, "kind": ctx.job.kind, "token": ctx.token})


class _Raised(Exception):
    """Carries a handler's non-`Exception` (SystemExit, GeneratorExit...) out of its thread:
    through an asyncio future those would stop the loop or break the awaiting coroutine."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


class _StartGate:
    """Decides, once, between a sync handler's thread starting it and the time limit
    dropping it first: a run dropped before it began must never begin afterwards (its job
    goes back to the queue, and another worker may take it)."""

    def __init__(self, on_began: Callable[[Context], None] | None = None,
                 on_returned: Callable[[Context], None] | None = None) -> None:
        self._on_began = on_began
        self._on_returned = on_returned
        self._lock = threading.Lock()
        self._started = False
        self._dropped = False
        self._began = self._ended = 0.0
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self, fn: Callable[..., Any], ctx: Context) -> Any:
        with self._lock:
            if self._dropped:
                return None
            self._started = True
            self._began = time.monotonic()  # with `_started`: `own_deadline` reads both
        ctx.in_thread = True
        if self._on_began is not None:
            try:
                self._on_began(ctx)
            except Exception as exc:  # advisory: the handler runs all the same
                log.warning("job %s: could not mark its handler's start: %s", ctx.job_id, exc)
        try:
            result = _in_thread(fn, ctx)
            # Boxed: trio refuses a thread's function that returns a coroutine ("appears
            # to be asynchronous"), and the job was dead-lettered with that TypeError.
            self.result = _HandedBack(result) if result is not None \
                and inspect.isawaitable(result) else result
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            with self._lock:  # after a `while_running` in progress, or it skips
                self._ended = time.monotonic()
            if isinstance(self.result, _HandedBack):
                ctx.in_thread = False  # the rest is awaited on the loop
            else:
                ctx.returned = True
            # A cut of this thread's fenced block asked past its time limit is void now:
            # left, it cut the next job's block that this pool thread ran.
            forget = getattr(ctx.spool, "forget_abandoned", None)
            if forget is not None:
                forget()
            if self._on_returned is not None and ctx.returned:
                try:
                    self._on_returned(ctx)
                except Exception as exc:  # advisory: the handler's outcome stands
                    log.warning("job %s: could not tell that its handler returned: %s",
                                ctx.job_id, exc)
        return self.result

    def while_running(self, call: Callable[[], None]) -> None:
        """`call()` unless the handler has returned: told it was hung once it had returned,
        the worker cut or marked the thread, which had gone on to other jobs."""
        with self._lock:
            if not self._ended:
                call()

    async def own_limit(self, timeout: float) -> None:
        """Wait, if the handler began and has not ended, until it ends or its own limit
        (`timeout` from its own start) passes. Its thread may have begun only as the loop's
        limit passed (a loop held up, a loaded machine): judged at once, a handler that
        returns at once was failed as "abandoned, still running" and dead-lettered."""
        with self._lock:
            if not self._started or self._ended:
                return
            deadline = self._began + timeout
        while not self._ended and time.monotonic() < deadline:
            await anyio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))

    def ended_within(self, timeout: float) -> bool:
        """Whether the handler returned (or raised) within `timeout` of its own start."""
        return bool(self._ended) and self._ended - self._began <= timeout \
            and not isinstance(self.result, _HandedBack)

    def handed_back_awaitable(self) -> bool:
        """Whether the thread's part returned an awaitable, awaited on the loop since."""
        return bool(self._ended) and isinstance(self.result, _HandedBack)

    def drop(self) -> bool:
        """True when the handler had not started (and now never will)."""
        with self._lock:
            if not self._started:
                self._dropped = True
            return self._dropped


class _HandedBack:
    """An awaitable a sync handler returned, carried out of its thread to be awaited."""

    def __init__(self, awaitable: Any) -> None:
        self.awaitable = awaitable


def _in_thread(fn: Callable[..., Any], ctx: Context) -> Any:
    """Call a sync handler in a worker thread, leaving where to find its stack."""
    ctx.thread_ident = threading.get_ident()
    HANDLER_THREADS.add(ctx.thread_ident)
    pid = current_pid()
    try:
        return fn(ctx.job, ctx)
    except Exception:
        _child_ends(pid)
        raise
    except BaseException as exc:
        _child_ends(pid, exc)
        raise _Raised(exc) from None
    finally:
        _child_ends(pid)
        HANDLER_THREADS.discard(threading.get_ident())


def _child_ends(pid: int, exc: BaseException | None = None) -> None:
    """A process the handler forked came back out of it (`sys.exit()` in the child, a
    return, an exception): it ends here. Caught as the job's failure, such a child went on
    running the worker's code — with a copy of its leases — and never exited."""
    if current_pid() == pid:
        return
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    elif sys.exc_info()[1] is not None:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class _NoLimit:
    """What `anyio.move_on_after(math.inf)` is to `invoke`, without a cancel scope to make
    and enter for each job of the many that have no time limit."""

    cancel_called = False
    deadline = math.inf

    def __enter__(self) -> _NoLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LIMIT = _NoLimit()


def _label(kind: str, fn: Callable[..., Any], job_id: str) -> str:
    return f"the handler of kind {kind!r} ({_name(fn)}, job {job_id})"


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
