"""What keeps a worker's leases alive and its handlers contained, beside the event loop.

- `Monitor`: a thread (not a task on the loop) that extends every live lease
  every `lease_seconds / 3`, so an async handler that blocks the loop keeps
  its lease, and that names the handler when the loop has not turned for a
  second. It stops extending the lease of a run that is past its time limit
  by more than a beat: such a run is hung, and another worker may take over.
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
from typing import TYPE_CHECKING, Any

from jobspool.errors import JobspoolError, LeaseLost
from jobspool.queue.jobprogress import join_pruning, prune_in_background

if TYPE_CHECKING:
    import anyio

    from jobspool.queue.api import SpoolAPI as Spool
    from jobspool.queue.context import Context

log = logging.getLogger("jobspool.queue.worker")

# A loop that has not turned for this long is reported (once per stall).
BLOCKED_SECONDS = 1.0
# How long a stalled loop defers judging async runs past their time limits (`beat`).
STALL_JUDGE_SECONDS = 10.0
# A handler's step on the loop longer than this may move the other async handlers' time
# limits (`Monitor.held_back`); shorter ones are a loop's normal sharing.
HELD_BACK_SECONDS = 0.02
# A limit that passed while another handler held the loop moves this far past the hold (the
# held handler's ready step runs first), at most `MAX_HOLD_MOVES` times in one run.
HOLD_GRACE_SECONDS = 0.1
MAX_HOLD_MOVES = 3
# How often the loop proves it turns and the heartbeat thread looks (beats themselves are
# on time: the thread wakes for them). 0.1 s made 20 wakeups a second of an idle worker.
_TICK = 0.25
_IDLE_TICK = 1.0  # nothing in hand: no beat, progress or handler to watch between beats
_PROGRESS_EVERY = 0.5  # at most one progress write per job this often
# How often a running worker also removes the progress files of runs that died: at its
# start only, a file of a worker killed while this one ran (its lease then still live)
# stayed until the restart after next (a soak probe).
_PRUNE_PROGRESS_EVERY = 300.0


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
    import asyncio

    try:
        task = asyncio.current_task()
    except RuntimeError:
        return True  # not on asyncio (trio): a Cancelled is always the runtime's
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

    def __init__(self, coro: Coroutine[Any, Any, Any], monitor: Monitor,
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


class Monitor:
    """The heartbeat and loop-watchdog thread of one pipeline run."""

    def __init__(self, spool: Spool, contexts: Callable[[], list[Context]], *,
                 lease_seconds: float) -> None:
        self.spool = spool
        self.contexts = contexts
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3.0
        self._progress_next = 0  # where `_flush_progress` goes on next turn
        self.tick = time.monotonic()
        self.on_loop: Tracked | None = None
        # The time limits of async handlers running now (`invoke`), by their Tracked: one
        # handler's step that holds the loop pushes the others' limits back (`held_back`).
        self.limits: dict[Tracked, tuple[anyio.CancelScope, Context]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobspool-heartbeat", daemon=True)
        self._blocked_since: float | None = None

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        join_pruning(self.spool, 1.0)  # a short run's own prune done; a long one goes on

    def held_back(self, by: Tracked, seconds: float) -> None:
        """`by`'s step held the loop for `seconds`, until now. An async handler whose time
        limit passed meanwhile was held back by no doing of its own: its limit moves to just
        past the hold, so that a step it was ready to take runs before its cancellation (a
        handler awaiting a 0.1 s sleep under a 0.5 s limit was cancelled when the loop came
        back from another's 1.5 s block, and dead-lettered as past its limit).

        Only those, and only `MAX_HOLD_MOVES` times a run: every limit moved back by every
        hold, a handler hung in a 3,600 s sleep under a 0.5 s limit was cancelled after
        7 s, when a neighbour doing CPU work in 50 ms slices ended (never, had it gone on),
        and its lease was extended all along."""
        import anyio

        now = anyio.current_time()  # the clock of the scopes' deadlines (trio has its own)
        for tracked, (scope, ctx) in self.limits.items():
            # Not `scope.cancel_called`: on trio, asking cancels a scope whose deadline
            # passed (the very one to move). A cancelled scope stays cancelled.
            if tracked is by or tracked.limit_moves >= MAX_HOLD_MOVES:
                continue
            if not now - seconds < scope.deadline <= now + HOLD_GRACE_SECONDS:
                continue  # still ahead (it lost no chance to run), or passed before the hold
            # One that had not begun gets its whole limit from now (it was cut 0.1 s into
            # its own run, and its attempt counted); one already running, a step's grace.
            ahead = tracked.limit_seconds if tracked.started_at is None else None
            moved = now + (ahead or HOLD_GRACE_SECONDS) - scope.deadline
            tracked.limit_moves += 1
            scope.deadline += moved
            if ctx.deadline is not None:
                ctx.deadline += moved

    async def ticker(self) -> None:
        """On the loop: prove every `_TICK` that it still turns."""
        import anyio

        while True:
            self.tick = time.monotonic()
            await anyio.sleep(_TICK)

    def _run(self) -> None:
        prune_in_background(self.spool)  # files of runs that died
        next_beat = time.monotonic() + self.interval
        next_progress = 0.0
        next_prune = time.monotonic() + _PRUNE_PROGRESS_EVERY
        while True:
            wait = min(_TICK if self.contexts() else _IDLE_TICK,
                       max(0.005, next_beat - time.monotonic()))
            asleep = time.monotonic()
            if self._stop.wait(wait):
                break
            now = time.monotonic()
            self._watch_process(now - asleep - wait, now)
            self._watch_loop(now)
            # The beat first: what else this thread does (progress files) may be slow
            # on a bad disk, and must never cost a lease.
            if now >= next_beat:
                next_beat = now + self.interval
                try:
                    self.beat(now)
                except Exception as exc:  # a beat failing must never end the heartbeats
                    log.warning("heartbeat failed (%s: %s); retrying at the next beat",
                                type(exc).__name__, exc)
            if now >= next_progress:
                next_progress = now + _PROGRESS_EVERY
                self._flush_progress(deadline=next_beat)
            if now >= next_prune:
                next_prune = now + _PRUNE_PROGRESS_EVERY
                prune_in_background(self.spool)  # files of runs that died

    def _watch_process(self, late: float, now: float) -> None:
        """This thread woke `late` seconds past its wait: when the loop stalled as long, the
        whole process stood still (SIGSTOP, a suspended machine, swapping), not the loop
        alone, and its leases may have run out meanwhile. Said so, not blamed on the loop
        (the next turn of which takes the stall as its own)."""
        if late > BLOCKED_SECONDS:
            log.warning("this worker process did not run for %.1f s (stopped, suspended, "
                        "swapping, or native code holding the GIL): leases that ran out "
                        "meanwhile are lost, and their jobs go to other workers", late)
            self.tick = max(self.tick, now)

    def _watch_loop(self, now: float) -> None:
        stalled = now - self.tick
        if stalled > BLOCKED_SECONDS + _TICK:
            if self._blocked_since is None:
                self._blocked_since = self.tick
                on_loop = self.on_loop
                who = (on_loop.label if on_loop is not None
                       else "no async handler (the worker's own code)")
                log.warning("event loop blocked for %.1f s by %s: async handlers must not "
                            "block (use anyio.to_thread.run_sync or a sync handler); leases "
                            "are still extended from the heartbeat thread", stalled, who)
        elif self._blocked_since is not None:
            log.info("event loop ran again after %.1f s", now - self._blocked_since)
            self._blocked_since = None

    def _flush_progress(self, *, deadline: float) -> None:
        """Write changed progress files until `deadline` (the next beat's time): the rest
        wait for the next turn. Written one after another before the beat, 0.5 s each on
        a slow disk cost four jobs their leases (a probe)."""
        contexts = self.contexts()
        # Starting where the last turn stopped: from the front each time, the jobs at the
        # end of the list never had their progress written on a slow disk.
        start = self._progress_next % len(contexts) if contexts else 0
        for i in range(len(contexts)):
            if time.monotonic() >= deadline:
                self._progress_next = start + i
                return
            c = contexts[(start + i) % len(contexts)]
            try:
                c.flush_progress()
            except Exception as exc:  # advisory: never let it stop the heartbeats
                log.debug("could not write the progress of job %s: %s", c.job_id, exc)
        self._progress_next = start

    def beat(self, now: float) -> None:
        """Extend every live lease in one `heartbeat_many` (one lock hold, one flush)."""
        live = []
        # While the loop stands still (a handler blocking it, the worker's own slow code),
        # an async run's end is not seen (`finished` is set on the loop) and a held-back
        # handler's limit not yet moved (`held_back`): such runs are judged past their
        # limits only once the stall passes STALL_JUDGE_SECONDS (a loop blocked for good
        # must not keep their leases for ever). Judged at once, a run done in time lost its
        # lease, ran again, and was dead-lettered (a probe). A sync run's thread says
        # itself whether it returned (`returned`): judged as usual.
        stall = now - self.tick
        defer_async = 2 * _TICK < stall < STALL_JUDGE_SECONDS
        for c in self.contexts():
            if c.settled or c.lost or c.hung:
                continue
            # Only a run still going can be past its time limit: one that returned in time
            # and waits for its settle (a slow projection commit) lost its lease here, ran
            # again and again, and was dead-lettered having succeeded every time.
            if c.deadline is not None and not c.finished and not c.returned \
                    and not (defer_async and not c.in_thread) \
                    and now > c.deadline + self.interval:
                if not c.hung:
                    c.hung = True
                    log.warning("job %s (%s, token %d) is past its time limit and still "
                                "running; its lease is no longer extended", c.job_id,
                                c.job.kind, c.token, extra={"job_id": c.job_id,
                                                            "kind": c.job.kind,
                                                            "token": c.token})
                continue
            live.append(c)
        if not live:
            return
        try:
            results = self.spool.heartbeat_many([c.lease for c in live],
                                                lease_seconds=self.lease_seconds)
        except (OSError, JobspoolError) as exc:
            # A failed beat is not a lost lease: the leases still run for a while, and the
            # next beat (or the check before settling) finds out which survived.
            log.warning("heartbeat of %d leases failed (%s); retrying at the next beat",
                        len(live), exc)
            return
        for ctx, res in zip(live, results, strict=True):
            if isinstance(res, LeaseLost):
                # Settled (or settling) meanwhile: gone from `leased/` by our own settle,
                # which knows whether the lease held; a warning here was a false alarm.
                if not (ctx.settled or ctx.settling):
                    ctx.lost = True
                    log.warning("lease lost on job %s (token %d): %s; its result will be "
                                "discarded", ctx.job_id, ctx.token, res.reason,
                                extra={"job_id": ctx.job_id, "token": ctx.token})
            else:
                ctx.set_lease(res)
