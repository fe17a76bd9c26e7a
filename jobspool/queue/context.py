"""`Context`: what a handler gets beside its job — its lease, heartbeats, fencing, writes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from jobspool.errors import FencedBlockBusy, JobspoolError, LeaseLost
from jobspool.queue import fencedmark
from jobspool.queue.job import Job, Lease, evolve
from jobspool.queue.jobprogress import Progress, make_progress, remove_progress, write_progress
from jobspool.queue.payload import json_snapshot
from jobspool.queue.signals import Retry

log = logging.getLogger("jobspool.queue.worker")

# A job that waited in hand longer than this since its lease was last confirmed (its claim,
# a heartbeat) is asked about before its handler starts: a cancel meanwhile stops it. At
# 1 s, a chaos run saw 5 of 1,223 cancels followed by a start (claimed 0.3-0.8 s before);
# at 0.1 s a job costs a store read only behind handlers slow enough to dwarf it.
RECHECK_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler returned: `result` is stored on the job."""

    result: Any = None


@dataclass(frozen=True, slots=True)
class Retried:
    """The handler raised `Retry`: retry after its delay (or the normal backoff)."""

    retry: Retry


@dataclass(frozen=True, slots=True)
class Failed:
    """Dead letter now: the handler raised `Fail`, or its rows can never be projected."""

    reason: str


@dataclass(frozen=True, slots=True)
class Errored:
    """A mistake of the handler's (a bad `Retry`) or the batch's projection commit failing:
    the normal backoff, whatever the kind's policy says."""

    error: BaseException | str


@dataclass(frozen=True, slots=True)
class Deferred:
    """The projection's storage refused the batch's rows (read-only, full, not permitted,
    damaged, unreachable): nothing the job did. Given back uncounted, due after `delay`."""

    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class Raised:
    """The handler's own exception (`TimeLimitExceeded` included): its kind's policy decides
    whether it is retried."""

    exc: BaseException


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Cut off by our own shutdown while it ran: back to ready, the attempt counted."""


# How one run ended, as the pipeline settles it; `None` on a `Context` means it never
# started (or was cut off before it could), and its lease is released uncounted.
Outcome: TypeAlias = Completed | Retried | Failed | Errored | Raised | Interrupted | Deferred

if TYPE_CHECKING:
    from jobspool.projection.handler import PendingWrite
    from jobspool.queue.api import SpoolAPI as Spool


# The `ctx.fenced()` blocks open on this thread: job id -> [its Context, blocks open].
# Counted per job, not saved and restored: blocks of one job opened by two of its tasks
# on one event loop can end in either order, and a restore out of order left a job marked
# open on the thread for good (every other job's block refused from then on).
_FENCED = threading.local()


def _thread_blocks() -> dict[str, list[Any]]:
    blocks: dict[str, list[Any]] | None = getattr(_FENCED, "blocks", None)
    if blocks is None:
        blocks = _FENCED.blocks = {}
    return blocks


def open_fenced_block() -> str | None:
    """The id of a job whose `ctx.fenced()` block is open on this thread, or in the code
    that called this one (a coroutine a handler inside its block waits on), if any."""
    blocks = _thread_blocks()
    return next(iter(blocks)) if blocks else fencedmark.handed_from()


def block_of_another_task() -> bool:
    """Whether a fenced block open on this thread belongs to another task than the running
    code (an async handler awaited inside its block, and this task runs meanwhile on the
    same event loop). Such code may be one the block awaits (a task started before it), so
    it must not wait for the block on the loop's thread, nor take its lock elsewhere
    unbounded (`AsyncSpool._wait_out_block`)."""
    return bool(_thread_blocks()) and fencedmark.handed_from() is None


class Context:
    """One job run's context: `ctx.token`, `ctx.heartbeat()`, `ctx.fenced()`, `ctx.upsert()`,
    `ctx.progress()`.

    Projection writes are buffered here and applied by the worker with the
    rest of the batch (one merge per table), only if the job's lease is
    still current when the batch settles; a run whose lease was lost has its
    writes discarded — and even a write that slipped through is fenced by
    its token inside the merge.
    """

    def __init__(self, spool: Spool, lease: Lease, *, key_for: Mapping[str, str] | None = None
                 ) -> None:
        self.spool = spool
        # Read-only to handlers (`lease`, `job_id`, `token`): a handler that set `ctx.lease`
        # to another job's lease hung the run for ever (its run was filed under one id and
        # taken out under another) and settled that job with its own result; one that set a
        # forged token for an upsert and put the real lease back wrote a row fenced at 1e9.
        self._lease = lease
        self._job_id, self._token = lease.job_id, lease.token
        self.job: Job = _handlers_copy(lease.job)
        self.writes: list[PendingWrite] = []
        self.lost = False
        self.outcome: Outcome | None = None
        self.settled = False
        # Handed to the settle, whose moves may take the job out of `leased/` before
        # `settled` is set: a heartbeat then finds it gone, which is no lost lease.
        self.settling = False
        self.finished = False  # its run ended (or never started): handed to the settler
        # The run's runtime state, shared with the heartbeat thread (plain attribute writes).
        self.started = False  # the handler was called: a cut-off run counts as an attempt
        self.deadline: float | None = None  # monotonic time its time limit passes
        self.hung = False  # past its time limit and still running: no longer beaten
        self.mark_kept = False  # still marked running after its run ended (`run_ended`)
        self.mark_cleared = False  # ... cleared by its thread as it returned (`run_returned`)
        self.start_in_thread = False  # its start is marked by its thread (`run_began`)
        self.seq = 0  # its place in its run's claim order: who gets a handler slot first
        self.traceback: str | None = None  # the failed run's, kept on the job
        self.thread_ident: int | None = None  # a sync handler's thread, while it runs
        # Set by a sync handler's own thread (`invoke._StartGate`): its end is known off
        # the loop, so the heartbeat thread can judge its time limit while the loop stalls.
        self.in_thread = False
        self.returned = False  # ... and it returned (or raised)
        self._progress: Progress | None = None
        self._progress_dirty = False
        self._progress_file = False
        # Read-only views (a worker config's), not copied: a `StoreKeys` answers every table.
        self._key_for: Mapping[str, str] = key_for if key_for is not None else {}
        self._mutex = threading.Lock()
        self._open_blocks: dict[int, int] = {}  # thread ident -> fenced blocks open there
        self.confirmed = time.monotonic()  # when the store last said the lease holds
        # Set when another task was refused a block while this run's own block was open on
        # their shared event loop thread (it awaited inside it): the block fails as it ends.
        self.awaited_in_block = False

    @property
    def lease(self) -> Lease:
        """This run's lease, as last extended (the worker keeps it: `set_lease`)."""
        return self._lease

    @property
    def token(self) -> int:
        """The fencing token of this run's lease (strictly larger than any earlier run's)."""
        return self._token

    @property
    def job_id(self) -> str:
        return self._job_id

    def heartbeat(self) -> Lease:
        """Extend the lease now (`LeaseLost` if it is gone); the worker also beats on its own."""
        lease = self.spool.heartbeat(self.lease)
        self.set_lease(lease)
        return lease

    def runnable(self) -> bool:
        """Whether its handler may start: not lost, and its lease not run out while it
        waited (a worker paused past it, by SIGSTOP, swap or a long stall, resumes with
        leases another worker may have taken and finished meanwhile; running them would
        only repeat side effects outside the projection). A lapsed one is marked lost."""
        if self.lost:
            return False
        if self.lease.expires_at <= self.spool.now():
            self.lost = True
            log.warning("not starting job %s: its lease (token %d) ran out before its "
                        "handler could start; it goes to whoever claims it next", self.job_id,
                        self.token, extra={"job_id": self.job_id, "token": self.token})
            return False
        return True

    def set_lease(self, lease: Lease) -> None:
        """Adopt an extended lease (from the heartbeat thread or the handler's own beat)."""
        if lease.job_id != self._job_id or lease.token != self._token:
            return  # not this run's (a handler's own beat of another lease): never adopted
        with self._mutex:
            self.confirmed = time.monotonic()
            if lease.expires_at >= self._lease.expires_at:
                self._lease = lease

    def unconfirmed(self) -> bool:
        """Whether it waited long enough since its lease was last confirmed to be asked
        about before it starts (`confirm`): the jobs of a quick batch are not asked."""
        return not self.lost and time.monotonic() - self.confirmed > RECHECK_SECONDS

    def confirm(self) -> None:
        """Before a handler starts after a wait: ask the store whether the lease still
        holds. A job canceled (or requeued, or taken over) while it waited in this worker's
        hand is marked lost and never started: before, its handler ran anyway (its side
        effects with it) and only its result was discarded. The store out of reach says
        nothing: the lease's own expiry still decides (`runnable`)."""
        try:
            [found] = self.spool.check_leases([self.lease])
        except (OSError, JobspoolError):
            return
        if isinstance(found, LeaseLost):
            self.lost = True
            log.warning("not starting job %s: %s", self.job_id, found.reason,
                        extra={"job_id": self.job_id, "token": self.token})
        else:
            self.set_lease(found)

    def progress(self, done: float, total: float | None = None, note: str | None = None
                 ) -> None:
        """Say how far this run got (`jobspool show` and `list` print it while it runs).

        Cheap: only remembered here; the worker writes it out at most every
        half second. `done` and `total` are non-negative numbers in any unit.
        """
        p = make_progress(self.token, done, total, note)
        with self._mutex:
            self._progress = p
            self._progress_dirty = True

    def flush_progress(self) -> None:
        """Write the last reported progress if it changed (the heartbeat thread calls this)."""
        with self._mutex:
            if not self._progress_dirty or self._progress is None or self.settled:
                return
            self._progress_dirty = False
            self._progress_file = True
            write_progress(self.spool.root, self.job_id, self._progress,
                           getattr(getattr(self.spool, "store", None), "file_mode", 0o600))

    def finish(self) -> None:
        """Its run ended (on the loop, handed to the settler). A fenced block still open on
        another thread (one the handler started and did not wait for) is ended, as for a
        handler abandoned past its time limit: it held the spool lock, the settle waited
        on it, and a worker stopped with `--grace 2` exited when the block ended, 56 s on."""
        abandon: Callable[[int], None] = getattr(self.spool, "abandon_blocks", _no_blocks)
        # Under the mutex, so that a block closing meanwhile (`_close_block`) is not cut
        # after it closed: that left a mark on its thread, which cut the next block a pool
        # thread ran, another job's.
        with self._mutex:
            self.finished = True
            me = threading.get_ident()
            for ident in [t for t in self._open_blocks if t != me]:
                try:
                    abandon(ident)
                except (JobspoolError, OSError) as exc:
                    log.warning("could not end a fenced block of job %s left open by its "
                                "handler: %s", self.job_id, exc)

    def _ended_how(self) -> str:
        # A write from a handler abandoned past its time limit was told "the handler returned".
        return ("the handler ran past its time limit and was given up on" if self.hung
                else "the handler returned")

    def _close_block(self, ident: int) -> None:
        with self._mutex:
            left = self._open_blocks.pop(ident) - 1
            if left:
                self._open_blocks[ident] = left
            stray = self.finished
        forget = getattr(self.spool, "forget_abandoned", None) if stray and not left else None
        if forget is not None:
            forget()  # the end of a stray block: a cut asked of its thread is spent

    def drop_progress(self) -> None:
        """Remove the progress file once the run is settled (called by the worker)."""
        with self._mutex:
            self.settled = True
            if self._progress_file:
                self._progress_file = False
                remove_progress(self.spool.root, self.job_id, self.token)

    @contextmanager
    def fenced(self) -> Iterator[Lease]:
        """A block run under the spool lock only while this run's lease is current.

        Blocks every other spool operation while it runs: keep it short, and never
        `await` inside it (an async handler's block runs on the event loop's thread).
        """
        # The spool lock is re-entrant per thread (and PostgreSQL's block pins its
        # connection per thread): another async handler's block, entered while this one
        # awaited, ran beside it instead of after it. Refused, naming the cause.
        blocks = _thread_blocks()
        open_for = next((j for j in blocks if j != self.job_id), None)
        if open_for is not None:
            owner: Context = blocks[open_for][0]
            if fencedmark.handed_from() is None:
                # Another task on this loop's thread: the block's own handler awaited inside
                # it. Refused with a RuntimeError charged to this job, the innocent one was
                # dead-lettered and the one that broke the rule completed: this run goes back
                # uncounted (`invoke.record_raised`), and that block fails as it ends.
                owner.awaited_in_block = True
                raise FencedBlockBusy(self.job_id, open_for)
            raise RuntimeError(f"ctx.fenced() for job {self.job_id!r}: the fenced block of "
                               f"job {open_for!r} is still open on this thread; an async "
                               "handler must not await inside a fenced block")
        ident = threading.get_ident()
        with self._mutex:
            if self.finished or self.settled:
                raise LeaseLost(self.job_id, self.token, f"its run has ended ({self._ended_how()}"
                                "): a fenced block opened after that is refused")
            self._open_blocks[ident] = self._open_blocks.get(ident, 0) + 1
        mine = blocks.setdefault(self.job_id, [self, 0])
        outermost = mine[1] == 0
        mine[1] += 1
        if outermost:
            self.awaited_in_block = False
        caller, before = [(self.job_id, ident)], fencedmark.FENCED_CALLER.get()
        try:
            with self.spool.fenced(self.lease) as lease:
                # Marked once inside: set while the block waited for the lock, it refused
                # the block's own acquire as "handed from" itself.
                fencedmark.FENCED_CALLER.set(caller)
                yield lease
        except Exception as exc:
            if outermost and self.awaited_in_block:
                # Ended by its own exception, the block was never charged: a handler that
                # caught it completed (cancellations and exits pass through untouched).
                self.awaited_in_block = False
                raise RuntimeError(self._awaited_inside()) from exc
            raise
        finally:
            self._close_block(ident)
            mine[1] -= 1
            if mine[1] <= 0:
                blocks.pop(self.job_id, None)
            caller.clear()
            fencedmark.FENCED_CALLER.set(before)
        if outermost and self.awaited_in_block:
            self.awaited_in_block = False
            raise RuntimeError(self._awaited_inside())

    def _awaited_inside(self) -> str:
        return (f"job {self.job_id!r}: its handler awaited inside its fenced block, and the "
                "blocks of other jobs on its event loop were refused meanwhile (given back "
                "to run again); await after the block, never inside it")

    def upsert(self, table: str, rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
               version: float | None = None) -> None:
        """Write rows into a projection table when the batch commits (fenced by version, token)."""
        from jobspool.projection.handler import make_upsert

        write = make_upsert(self.job_id, table, rows, version, self.token,
                            key=self._key_for.get(table, "id"))
        self._add(write)

    def delete(self, table: str, ids: str | Iterable[str], version: float | None = None) -> None:
        """Delete rows (as fenced tombstones) when the batch commits."""
        from jobspool.projection.handler import make_delete

        write = make_delete(self.job_id, table, ids, version, self.token,
                            key=self._key_for.get(table, "id"))
        self._add(write)

    def _add(self, write: PendingWrite) -> None:
        with self._mutex:
            if self.finished or self.settled:
                # A ctx kept past its run (handed to a thread that outlived the handler):
                # its writes were taken when the run settled; this one would be dropped.
                raise LeaseLost(self.job_id, self.token, f"its run has ended ({self._ended_how()}"
                                "): a write after that is never applied")
            self.writes.append(write)

    def __repr__(self) -> str:
        return f"Context(job_id={self.job_id!r}, token={self.token})"


def _no_blocks(thread_ident: int) -> None:
    """A store without blocks to end (the worker's tests' stand-ins)."""


def _handlers_copy(job: Job) -> Job:
    """The job as its handler gets it: a payload of its own when the payload can change
    (a dict or a list). A handler that added to its payload (an embedding beside each row,
    a common pattern) changed the lease's job, which the settle encodes: on PostgreSQL the
    job stayed leased, its failure not recordable, and ran again at every expiry; with
    projection writes it was dead-lettered, "handler result refused" blaming its result."""
    try:
        own = json_snapshot(job.payload)  # a scalar is its own
    except (TypeError, ValueError):
        # A row edited by hand past orjson's depth for writing (it reads deeper): such a
        # payload stays shared, as before, rather than fail the whole claim it came in.
        return job
    return job if own is job.payload else evolve(job, payload=own)
