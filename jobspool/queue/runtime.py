"""What keeps a worker's handlers contained on the event loop (`monitor.py` keeps their
leases alive beside it).

- `Tracked`: wraps an async handler's coroutine so the monitor knows which
  handler is on the loop at each step.
- Helpers to tell our own cancellation from a handler's exception, and to
  format a traceback, or the stack of a thread that ran out of time.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import anyio

log = logging.getLogger("jobspool.queue.worker")

# A handler's step on the loop longer than this may move the other async handlers' time
# limits (`Monitor.held_back`); shorter ones are a loop's normal sharing.
HELD_BACK_SECONDS = 0.02


class LoopWatch(Protocol):
    """What `Tracked` tells at each step (`monitor.Monitor`): whose code is on the loop, and
    that a long step held the other handlers' time limits back."""

    on_loop: Tracked | None
    limits: dict[Tracked, tuple[anyio.CancelScope, Any]]  # the scope, and its job's Context

    def held_back(self, by: Tracked, seconds: float) -> None: ...


def _internal_dirs() -> tuple[str, ...]:
    import os

    import anyio

    return (os.path.dirname(os.path.abspath(__file__)) + os.sep,
            os.path.dirname(os.path.abspath(anyio.__file__)) + os.sep)


_INTERNAL = _internal_dirs()


def format_traceback(exc: BaseException) -> str:
    """The exception's traceback as Python prints it, from the handler's frame down: the
    worker's and anyio's frames above it say nothing about the failure."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_INTERNAL):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def thread_stack(ident: int | None) -> str | None:
    """Where the thread `ident` is now, as a traceback-like text (None if it is gone)."""
    if ident is None:
        return None
    frame = sys._current_frames().get(ident)
    if frame is None:
        return None
    entries = traceback.extract_stack(frame)
    own = (*_INTERNAL, threading.__file__)
    start = next((i for i, e in enumerate(entries) if not e.filename.startswith(own)), 0)
    return "Stack of the handler's thread when its time limit passed:\n" + "".join(
        traceback.format_list(entries[start:]))


def cancel_requested() -> bool:
    """Whether the current task is being cancelled by a cancel scope (ours), as opposed to
    a handler raising a cancellation exception of its own."""
    task = _asyncio_task()
    # None: not on asyncio (trio), where a Cancelled is always the runtime's.
    return task is None or task.cancelling() > 0


# How long a handler may go on after swallowing a cancellation (a time limit's, or a
# shutdown's past its grace) before it is no longer driven: time to clean up, not forever.
ABANDON_SECONDS = 2.0


class Abandoned(Exception):
    """A handler kept running through its cancellation for `ABANDON_SECONDS`: no longer
    driven. Before, one that caught every cancellation in a loop held its job leased (and
    a core busy) for ever, past its time limit and both SIGTERMs."""


async def in_own_task(awaitable: Awaitable[Any]) -> Any:
    """Await `awaitable` in a task of its own (asyncio's, or trio's: `_in_trio_task`).

    A handler that cancels "its" task (`asyncio.current_task().cancel()`, a pattern of
    code written for a task of its own) cancelled the runner carrying it: the whole worker
    unwound as if shut down, batch mates charged, exit 0. In a task of its own it cancels
    only itself, and the runner sees a handler that raised a cancellation (a failure).
    Ours still reach it: cancelling a task that awaits another cancels that one. (On trio
    nothing can cancel a task from inside it that way; it gets a task for another reason.)

    Not inlined into the runner's task, though that cost less (client CPU per job of a
    no-op handler on PostgreSQL: 90 µs against 143 with the task): a cancel the handler
    left behind (requested and then raised past, or from a watchdog firing after
    it ended) reached the runner and stopped the worker or failed the next job, a
    handler's shielded scope held off the shutdown's cut-off past its grace, and state kept
    per task leaked from job to job (a probe of that change).
    """
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        # Awaited outside the `except`: inside it, every exception a handler raised carried
        # "RuntimeError: no running event loop" as its context, and each stored traceback
        # on trio began with an error that never happened.
        try:
            return await _in_trio_task(awaitable)
        except BaseException:
            _close_unstarted(awaitable)
            raise

    async def body() -> Any:
        try:
            return await awaitable
        except (Exception, asyncio.CancelledError):
            raise
        except BaseException as exc:
            # A task lets KeyboardInterrupt and SystemExit out of the event loop itself, and
            # a GeneratorExit out of a task ends its awaiter oddly: carried to the runner
            # instead, where each is the job's failure like any exception.
            return _Carried(exc)

    try:
        result = await loop.create_task(body())
    except BaseException:
        _close_unstarted(awaitable)
        raise
    if isinstance(result, _Carried):
        raise result.exc
    return result


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _close_unstarted(awaitable: Awaitable[Any]) -> None:
    """A handler's coroutine whose task was cancelled before its first step (a shutdown,
    the run's task cancelled) is closed: left to the collector, each one printed
    "RuntimeWarning: coroutine ... was never awaited" on the user's stderr."""
    if isinstance(awaitable, Tracked) and awaitable.started_at is None:
        awaitable.coro.close()


class _Carried:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _in_trio_task(awaitable: Awaitable[Any]) -> Any:
    """Await `awaitable` in a trio task of its own (a nursery's child, under the runner's
    cancel scopes as if inline): a handler that swallows `GeneratorExit` too (a bare
    `except:` in a loop) cannot be closed when it is abandoned, and the scope it sat in
    stays on its task's stack. In the runner's task, exiting the time limit's scope then
    failed the job with "Cancel scope stack corrupted" rather than as past its limit, and
    a shutdown past its grace ended the whole run in an exception group, the cut-off
    attempt not counted; left in a task of its own, that stack ends with the task. The
    nursery costs ~80 µs of CPU per job (a no-op handler: 340 -> 420 µs on a scratch file
    spool); asyncio, the default, is not affected."""
    import trio

    box: list[Any] = []

    async def body() -> None:
        try:
            box.append(await awaitable)
        except trio.Cancelled as exc:
            if _cancelled_here():
                raise  # the runner's scopes' own: they catch it where they were cancelled
            # A Cancelled of a scope the handler had left, raised by the handler itself: its
            # failure (as asyncio's CancelledError of its own is), not ours to catch.
            box.append(_Carried(RuntimeError(f"the handler raised a cancellation of its own "
                                             f"(trio.Cancelled: {exc})")))
        except BaseException as exc:
            box.append(_Carried(exc))  # raised in the runner's task, as if inline

    try:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(body)
        except BaseExceptionGroup as group:
            # A nursery wraps what leaves it in a group (trio's strict exception groups):
            # `body` lets out only the runner's own cancellations, raised bare again so
            # that the scope cancelled catches it. Wrapped, a shutdown's cut-off was
            # taken for the handler's failure ("BaseExceptionGroup: Exceptions from Trio
            # nursery"): the run charged as failed, not interrupted, and the runner went
            # on starting the jobs still queued into the cancellation.
            only, rest = group.split(trio.Cancelled)
            if rest is not None or only is None:
                raise
            raise _first_leaf(only) from None
    except trio.Cancelled:
        if not box:
            raise
        # The handler returned, and only then did leaving the nursery (a checkpoint) meet a
        # limit that passed while it blocked the loop: its return is what the caller judges
        # ("returned past its limit"), not a cancellation that never reached it.
    result = box[0]
    if isinstance(result, _Carried):
        raise result.exc
    return result


class Tracked:
    """Awaits a coroutine while telling the monitor whose code is on the loop at each step;
    stops driving it when it goes on past a swallowed cancellation (`Abandoned`)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], monitor: LoopWatch,
                 label: Callable[[], str], *, on_wait: Callable[[], None] | None = None
                 ) -> None:
        self.coro = coro
        self.on_wait = on_wait  # told once, when the handler first suspends
        self.monitor = monitor
        self._label = label  # built when read: a blocked loop or an abandonment, not per job
        # Its steps run in a copy of the runner's context variables, as in the task of its
        # own it gets on asyncio: on trio, where it runs in the runner's task, what one
        # job's handler set was seen by the next job's.
        self.context = contextvars.copy_context()
        self.raised: BaseException | None = None  # what left the handler, with its frames
        self.swallowed_at: float | None = None  # when it first went on past a cancellation
        # When its first step ran and when it returned (monotonic; None: not yet), and
        # what it returned: a run the loop held back may have ended before we noticed.
        self.started_at: float | None = None
        self.returned_at: float | None = None
        # It returned in the step its cancellation was delivered to (caught, then
        # returned): cut off, however short its own run.
        self.returned_on_cancel = False
        # ... or raised something else there, or after swallowing it: cut off all the same.
        self.raised_on_cancel = False
        self.value: Any = None
        # On asyncio, the task that awaits this handler's own one (`in_own_task`): ours (a
        # limit's or a shutdown's cancellation) reach the handler through it.
        self._outer = _asyncio_task()
        self.limit_moves = 0  # how often another's hold of the loop moved its limit
        self.limit_seconds: float | None = None  # its time limit, when it has one

    @property
    def label(self) -> str:
        return self._label()

    def returned_within(self, seconds: float) -> bool:
        """Whether the handler returned within `seconds` of its own start, of its own
        accord: in time, however late the loop (held by another handler blocking it) let
        its runner see it."""
        return (self.started_at is not None and self.returned_at is not None
                and not self.returned_on_cancel
                and self.returned_at - self.started_at <= seconds)

    def _ours_cancelling(self) -> bool:
        """asyncio: whether the task awaiting the handler's is being cancelled (a cancel
        scope of ours, its limit's or a shutdown's, is cancelled around it)."""
        outer = self._outer
        return outer is None or outer.cancelling() > 0

    def _past_limit(self) -> bool:
        """Whether its time limit's deadline (as moved for holds) has passed, on the loop's
        clock; read without asking the scope, which on trio would cancel it."""
        held = self.monitor.limits.get(self)
        if held is None:
            return False
        import anyio

        return anyio.current_time() >= held[0].deadline

    def stack(self) -> str | None:
        """Where the handler was when it was cancelled (its frames down to the await), or
        None when it did not end by raising (it swallowed the cancellation)."""
        tb = self.raised.__traceback__ if self.raised is not None else None
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_INTERNAL):
            tb = tb.tb_next
        entries = traceback.extract_tb(tb) if tb is not None else []
        while entries and entries[-1].filename.startswith(_INTERNAL):
            entries.pop()  # the cancellation's origin, in our own awaiting: noise
        if not entries:
            return None
        return "Stack of the handler when its time limit passed:\n" + "".join(
            traceback.format_list(entries))

    def __await__(self) -> Generator[Any, Any, Any]:
        it = self.coro.__await__()
        value: Any = None
        error: BaseException | None = None
        run = self.context.run
        trio = on_trio()
        while True:
            self.monitor.on_loop = self
            began = time.monotonic()
            first = self.started_at is None
            if first:
                self.started_at = began
            # Whether this step delivers the limit's cancellation. asyncio throws it in
            # (and the handler's own timeouts too: only past the limit is it ours). On trio
            # it is raised inside the handler's frames, at the trap it is parked in, so a
            # later step that begins past the limit is delivered it; a first step is not
            # parked anywhere, and one that returns without a checkpoint never saw it.
            # (Not `_cancelled_here()`: the handler's own expired sleep reads so too.)
            cancelling = ((error is not None and _is_cancel(error)) or (trio and not first)
                          ) and self._past_limit()
            try:
                step = run(it.send, value) if error is None else run(it.throw, error)
            except StopIteration as stop:
                self.returned_at, self.value = time.monotonic(), stop.value
                self.returned_on_cancel = cancelling
                return stop.value
            except BaseException as exc:
                self.raised = exc
                if (cancelling or self.swallowed_at is not None) and not _is_cancel(exc):
                    self.raised_on_cancel = True
                raise
            finally:
                self.monitor.on_loop = None
                held = time.monotonic() - began
                if held > HELD_BACK_SECONDS and self.monitor.limits:
                    self.monitor.held_back(self, held)
            if self.swallowed_at is None and (
                    (trio and _cancelled_here()) or (error is not None and _is_cancel(error)
                                                     and self._ours_cancelling())):
                # Trio raises its cancellation inside the handler's frames (the trap's
                # outcome), never through this generator: only the cancelled scope tells.
                # Unseen, a handler swallowing it in a loop spun trio's scheduler for ever.
                # On asyncio, a cancellation thrown in while ours is not under way (the
                # handler's own `move_on_after`, `asyncio.timeout`) was the handler's to
                # catch: taken for a swallow, the run was abandoned 2 s later as
                # "interrupted".
                self.swallowed_at = time.monotonic()
            if (self.swallowed_at is not None
                    and time.monotonic() - self.swallowed_at > ABANDON_SECONDS):
                # Its last step is never handed to the loop: nothing wakes it any more.
                with contextlib.suppress(BaseException):  # it may ignore GeneratorExit too
                    self.coro.close()
                raise Abandoned(self.label)
            if self.on_wait is not None:
                self.on_wait()
                self.on_wait = None
            try:
                value = yield step
                error = None
            except GeneratorExit:
                self.coro.close()
                raise
            except BaseException as exc:  # delivered into the handler, as await would
                value, error = None, exc


def _cancelled_here() -> bool:
    """Whether the running task sits in a cancelled scope (anyio: deadline -inf)."""
    import anyio

    try:
        return anyio.current_effective_deadline() == -math.inf
    except Exception:  # not in a task anyio knows
        return False


def on_trio() -> bool:
    """Whether the running loop is not asyncio's (trio): trio raises its cancellation
    inside the handler's frames, so only the scope tells that one arrived (asyncio throws
    it in through `Tracked`)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def _asyncio_task() -> Any:
    """The running asyncio task, or None (on trio)."""
    import asyncio

    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _is_cancel(exc: BaseException) -> bool:
    import anyio

    return isinstance(exc, anyio.get_cancelled_exc_class())
