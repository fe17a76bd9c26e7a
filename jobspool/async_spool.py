"""`AsyncSpool`: the producer side of a spool for async code (anyio: asyncio and trio).

Every method is a coroutine that runs the matching `Spool` method in a worker
thread (`anyio.to_thread`), so a slow disk or a contended spool lock never
blocks the event loop, and nobody has to write `to_thread` themselves. One
`AsyncSpool` is safe to share across tasks: `Spool` is safe across threads
(its lock is a re-entrant thread lock plus the spool's file lock), so
concurrent calls simply queue for the lock like calls from threads do.

`wait` polls from the event loop (`anyio.sleep`), not from a parked thread, so
thousands of tasks can await results without using up the thread pool.

Cancellation: a call that was cancelled while its thread ran finishes that
operation (a job half-enqueued is not a state that exists) and then raises the
cancellation; the caller can `get` the job to learn what happened.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, ParamSpec, Self, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from jobspool.errors import JobFailed, JobNotFound, JobPruned, WaitTimeout
from jobspool.queue.api import SpoolAPI
from jobspool.queue.arguments import list_payloads, validate_wait
from jobspool.queue.job import EnqueueResult, Job, Reservation
from jobspool.queue.spool import Spool
from jobspool.queue.states import JobState
from jobspool.queue.stats import Stats
from jobspool.queue.wholecall import whole_in_thread

P = ParamSpec("P")
T = TypeVar("T")


class AsyncSpool:
    """Coroutine forms of the producer and reader operations of a `Spool`.

    `AsyncSpool(root, **options)` opens the spool like `Spool(root, **options)`
    (creating it by default); `AsyncSpool(spool)` wraps an open `Spool`.
    Use it as `async with AsyncSpool(root) as spool:` or call `close()`.
    """

    def __init__(self, root: str | os.PathLike[str] | SpoolAPI, **options: Any) -> None:
        self.spool: SpoolAPI
        if isinstance(root, SpoolAPI):  # either store (a file Spool or a PgSpool)
            if options:
                raise TypeError("AsyncSpool(spool) takes no options: the spool is open already")
            self.spool = root
            self._owned = False
        else:
            self.spool = Spool(root, **options)
            self._owned = True
        # Held by a scan's own thread: it bounds the scans still running for callers that
        # left. Per spool: process-wide, four health checks timing out on a database that
        # was down held every slot, and a healthy file spool's stats() waited on them.
        self._scans = threading.BoundedSemaphore(SCAN_THREADS)
        self._scan_limiter: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = \
            anyio.lowlevel.RunVar(f"jobspool_scans_{id(self):x}")  # one per loop, as `_readers`

    @classmethod
    async def open(cls, root: str | os.PathLike[str], **options: Any) -> Self:
        """`AsyncSpool(root, **options)` with the opening itself in a worker thread.

        The constructor opens the spool on the calling thread: on a database URL that is
        a connection (up to its connect timeout when the server is slow or away), on a
        directory a few files, and every other task on the event loop waits meanwhile.
        Errors are those of `Spool(root, **options)`."""
        spool = await anyio.to_thread.run_sync(partial(Spool, root, **options))
        made = cls(spool)
        made._owned = True  # opened here: `close()` and `async with` close it
        return made

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._in_thread(partial(fn, *args, **kwargs), None)

    async def _in_thread(self, call: Callable[[], T],
                         limiter: anyio.CapacityLimiter | None) -> T:
        await _wait_out_block()
        self._refuse_inside_fenced_block()
        # Done whole or not begun, whatever cancels the caller (the module docstring's
        # promise): see `wholecall`.
        got: list[T] = []
        try:
            return await whole_in_thread(call, limiter=limiter, landed=got.append)
        except anyio.get_cancelled_exc_class() as exc:
            if got and (what := _landed(got[0])) is not None:
                # "`get` the id to see it": an enqueue without `job_id` left the caller
                # no id to get, and a retry enqueued the job twice.
                name = getattr(getattr(call, "func", None), "__name__", "the call")
                exc.add_note(f"jobspool: {name} landed before the cancellation: {what}")
            raise

    def _refuse_inside_fenced_block(self) -> None:
        """Refuse a call awaited inside a fenced block open on this (the loop's) thread.
        The call runs on another thread: on the file spool it waited for the spool lock
        the block holds, for ever (a handler's time limit cannot end it, `wholecall`); on
        PostgreSQL it ran outside the block's transaction, unfenced (a lock-order probe)."""
        from jobspool.queue.context import open_fenced_block

        job_id = open_fenced_block()
        journal = getattr(self.spool, "journal", None)  # the file spool's
        db = getattr(self.spool, "db", None)  # PostgreSQL's
        if job_id is None and not (journal is not None and journal.lock.held) \
                and not (db is not None and db.pinned_here()):
            return
        inside = f"the fenced block of job {job_id!r}" if job_id else "a fenced block"
        raise RuntimeError(f"an AsyncSpool call awaited inside {inside}: it runs on another "
                           "thread, outside the block (on the file spool it waits for the "
                           "block's lock for ever); call the Spool itself inside the block "
                           "(ctx.spool), or await after it")

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the spool if this object opened it."""
        if self._owned:
            self.spool.close()

    async def aclose(self) -> None:
        """`close()` in a worker thread, for coroutines (`contextlib.aclosing`): closing
        waits for a call still in flight, which froze the event loop when called there."""
        await anyio.to_thread.run_sync(self.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # In a thread: closing waits for a call still in flight (one queued for a lock held
        # elsewhere), and a lifespan handler's exit froze every request on the loop meanwhile.
        await self.aclose()

    def __repr__(self) -> str:
        # A database by its URL (password hidden), not the local state directory it keeps.
        where = getattr(self.spool, "display", None) or str(self.spool.root)
        return f"AsyncSpool({where!r})"

    # ------------------------------------------------------------ producing

    async def enqueue(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                      delay: float = 0.0, run_at: float | datetime | None = None,
                      priority: int = 0, max_attempts: int | None = None,
                      on_conflict: str = "keep",
                      unique_states: Iterable[JobState | str] | None = None,
                      timeout: float | None = None) -> Job:
        """`Spool.enqueue` (see there for `on_conflict`, `unique_states` and `timeout`)."""
        return await self._run(self.spool.enqueue, kind, payload, job_id=job_id, delay=delay,
                               run_at=run_at, priority=priority, max_attempts=max_attempts,
                               on_conflict=on_conflict, unique_states=unique_states,
                               timeout=timeout)

    async def enqueue_result(self, kind: str, payload: Any = None, *,
                             job_id: str | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> EnqueueResult:
        """`Spool.enqueue_result`: the job and whether this call created it."""
        return await self._run(self.spool.enqueue_result, kind, payload, job_id=job_id,
                               delay=delay, run_at=run_at, priority=priority,
                               max_attempts=max_attempts, on_conflict=on_conflict,
                               unique_states=unique_states, timeout=timeout)

    async def enqueue_many(self, kind: str, payloads: Iterable[Any], *,
                           job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                           run_at: float | datetime | None = None, priority: int = 0,
                           max_attempts: int | None = None, on_conflict: str = "keep",
                           unique_states: Iterable[JobState | str] | None = None,
                           timeout: float | None = None) -> list[Job]:
        """`Spool.enqueue_many`: one lock hold and one flush for the whole batch."""
        return await self._run(self.spool.enqueue_many, kind, list_payloads(payloads), job_ids=job_ids,
                               delay=delay, run_at=run_at, priority=priority,
                               max_attempts=max_attempts, on_conflict=on_conflict,
                               unique_states=unique_states, timeout=timeout)

    async def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                                   job_ids: Sequence[str | None] | None = None,
                                   delay: float = 0.0, run_at: float | datetime | None = None,
                                   priority: int = 0, max_attempts: int | None = None,
                                   on_conflict: str = "keep",
                                   unique_states: Iterable[JobState | str] | None = None,
                                   timeout: float | None = None) -> list[EnqueueResult]:
        """`Spool.enqueue_many_results`: each job and whether this call created it."""
        return await self._run(self.spool.enqueue_many_results, kind, list_payloads(payloads),
                               job_ids=job_ids, delay=delay, run_at=run_at, priority=priority,
                               max_attempts=max_attempts, on_conflict=on_conflict,
                               unique_states=unique_states, timeout=timeout)

    async def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                      delay: float = 0.0, run_at: float | datetime | None = None,
                      priority: int = 0, max_attempts: int | None = None,
                      timeout: float | None = None) -> Reservation:
        """`Spool.prepare` (outbox step 1)."""
        return await self._run(self.spool.prepare, kind, payload, job_id=job_id, delay=delay,
                               run_at=run_at, priority=priority, max_attempts=max_attempts,
                               timeout=timeout)

    async def commit(self, reservation: Reservation) -> Job:
        """`Spool.commit` (outbox step 3)."""
        return await self._run(self.spool.commit, reservation)

    async def abort(self, reservation: Reservation) -> Job | None:
        """`Spool.abort`: release one reservation."""
        return await self._run(self.spool.abort, reservation)

    # ------------------------------------------------------------ administration and reads

    async def cancel(self, job_id: str) -> Job:
        """`Spool.cancel`."""
        return await self._run(self.spool.cancel, job_id)

    async def requeue(self, job_id: str) -> Job:
        """`Spool.requeue`."""
        return await self._run(self.spool.requeue, job_id)

    async def get(self, job_id: str) -> Job:
        """`Spool.get` (`JobNotFound`)."""
        return await self._read(partial(self.spool.get, job_id))

    async def _read(self, call: Callable[[], T]) -> T:
        await _wait_out_block()  # as every call does (`_in_thread`)
        self._refuse_inside_fenced_block()
        # Readers have threads of their own: with anyio's 40 all taken by enqueues queued
        # for a lock held elsewhere, `wait(timeout=0.5)` returned after 2.9 s. A read
        # changes nothing, so a cancelled caller leaves at once and its thread finishes
        # alone (a read waiting out a database outage held a 1 s scope for 30 s; on trio
        # the scope was not honoured at all).
        result = await anyio.to_thread.run_sync(call, limiter=_readers(),
                                                abandon_on_cancel=True)
        await anyio.lowlevel.checkpoint()
        return result

    def _get_until(self, job_id: str, deadline: float | None) -> Job:
        """`get`, waiting out a database outage only until `deadline` (PostgreSQL)."""
        db = getattr(self.spool, "db", None)  # the PostgreSQL store's connection pool
        if db is None or deadline is None:
            return self.spool.get(job_id)
        with db.patience(deadline):
            return self.spool.get(job_id)

    async def stats(self, *, by_kind: bool = False) -> Stats:
        """`Spool.stats` (a scan: a cancelled caller leaves at once, see `_scan`)."""
        return await self._scan(lambda stop: self.spool.stats(by_kind=by_kind))

    async def jobs(self, state: JobState | str | None = None,
                   kind: str | None = None) -> list[Job]:
        """`Spool.jobs`, collected into a list (a scan, as `stats`)."""
        def collect(stop: threading.Event) -> list[Job]:
            out = []
            for job in self.spool.jobs(state=state, kind=kind):
                if stop.is_set():
                    break  # its caller left: the rest of the listing is for nobody
                out.append(job)
            return out

        return await self._scan(collect)

    async def _scan(self, call: Callable[[threading.Event], T]) -> T:
        # A health check's `with fail_after(1): await spool.stats()` was held ~27 s by a
        # database outage when it waited for its thread; on trio it then raised
        # StoreUnavailable instead of the timeout. So a cancelled scan is left to finish
        # alone, but bounded: at most SCAN_THREADS run at once for this spool (asyncio
        # gives a cancelled call's limiter slot back at once: 40 timed-out listings of a
        # 40,000-job spool ran 30 at a time), one whose caller left before it started
        # never starts, and `jobs` stops at its next job. Scans have threads of their own,
        # so that abandoned ones never keep `get` and `wait` waiting.
        # Both bounds are this AsyncSpool's: one store's outage never holds another's scans.
        await _wait_out_block()  # as every call does (`_in_thread`)
        self._refuse_inside_fenced_block()
        stop = threading.Event()

        def run() -> T | None:
            with self._scans:
                return None if stop.is_set() else call(stop)

        try:
            result = await anyio.to_thread.run_sync(
                run, limiter=_loop_limiter(self._scan_limiter, SCAN_THREADS),
                abandon_on_cancel=True)
        finally:
            stop.set()
        await anyio.lowlevel.checkpoint()
        return cast(T, result)

    async def wait(self, job_id: str, timeout: float | None = None, *,
                   poll_seconds: float = 0.05) -> Job:
        """Until the job is terminal (completed, dead letter, canceled); `WaitTimeout` after
        `timeout` seconds. Polls with backoff up to `poll_seconds * 4` between looks."""
        timeout, poll_seconds = validate_wait(timeout, poll_seconds)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        seen = False
        while True:
            try:
                job = await self._read(partial(self._get_until, job_id, deadline))
            except JobNotFound:
                if seen:  # as `Spool.wait`: it finished and was pruned between two looks
                    raise JobPruned(job_id) from None
                raise
            seen = True
            if job.terminal:
                return job
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(job_id, float(timeout or 0))
            await anyio.sleep(delay if left is None else min(delay, left))
            delay = min(poll_seconds * 4, delay * 2)

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job and return its result; `jobspool.errors.JobFailed` when it ended
        dead-lettered or canceled, `WaitTimeout` after `timeout` seconds."""
        job = await self.wait(job_id, timeout)
        if job.state is not JobState.COMPLETED:
            raise JobFailed(job.id, job.state.value, job.last_error)
        return job.result


__all__ = ["AsyncSpool"]


_READERS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("jobspool_readers")
READER_THREADS = 8
SCAN_THREADS = 4
def _readers() -> anyio.CapacityLimiter:
    """This event loop's limiter for reads (`get`, `wait`'s polls), apart from the
    default one every `to_thread` call shares."""
    return _loop_limiter(_READERS, READER_THREADS)


def _loop_limiter(slot: anyio.lowlevel.RunVar[anyio.CapacityLimiter],
                  threads: int) -> anyio.CapacityLimiter:
    try:
        return slot.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(threads)
        slot.set(limiter)
        return limiter


def _landed(result: object) -> str | None:
    """What a write whose caller was cancelled left, for the cancellation's note."""
    if isinstance(result, EnqueueResult):
        job = result.job
        return f"job {job.id!r} ({job.kind}, {result.outcome}, now {job.state.value})"
    if isinstance(result, Job):
        return f"job {result.id!r} ({result.kind}, now {result.state.value})"
    if isinstance(result, Reservation):
        return f"job {result.job_id!r} prepared (reservation {result.reservation_id!r})"
    if isinstance(result, list) and result:
        jobs = [r.job if isinstance(r, EnqueueResult) else r for r in result]
        if all(isinstance(j, Job) for j in jobs):
            ids = ", ".join(repr(j.id) for j in jobs[:3]) + (", ..." if len(jobs) > 3 else "")
            return f"{len(jobs)} job(s): {ids}"
    return None


async def _wait_out_block() -> None:
    """Another task's fenced block open on this loop's thread (its handler awaited inside
    it): wait on the loop for it to end, up to `HANDED_WAIT_SECONDS`, then refuse. Such a
    call was refused as "awaited inside the fenced block" from a task with no block; sent
    to its thread at once, one from a task the block itself awaits (started before it)
    waited for the block's lock for ever, and the block for it."""
    from jobspool.queue.context import block_of_another_task, open_fenced_block
    from jobspool.queue.fencedmark import HANDED_WAIT_SECONDS

    if not block_of_another_task():
        return
    deadline = time.monotonic() + HANDED_WAIT_SECONDS
    while block_of_another_task():
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"an AsyncSpool call waited {HANDED_WAIT_SECONDS:g} s for the fenced block of "
                f"job {open_fenced_block()!r}, open on this event loop's thread while its "
                "handler awaited inside it; refused (a block that awaits this call would "
                "wait for it for ever): await after the block, never inside it")
        await anyio.sleep(0.005)

