"""The heartbeat and loop-watchdog thread of a worker run.

`Monitor` is a thread (not a task on the loop) that extends every live lease every
`lease_seconds / 3`, so an async handler that blocks the loop keeps its lease, and that
names the handler when the loop has not turned for a second. It stops extending the lease
of a run that is past its time limit by more than a beat: such a run is hung, and another
worker may take over. Handlers' steps reach it through `runtime.Tracked`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jobspool.errors import JobspoolError, LeaseLost
from jobspool.queue.jobprogress import join_pruning, prune_in_background

if TYPE_CHECKING:
    import anyio

    from jobspool.queue.api import SpoolAPI as Spool
    from jobspool.queue.context import Context
    from jobspool.queue.runtime import Tracked

log = logging.getLogger("jobspool.queue.worker")

# A loop that has not turned for this long is reported (once per stall).
BLOCKED_SECONDS = 1.0
# How long a stalled loop defers judging async runs past their time limits (`beat`).
STALL_JUDGE_SECONDS = 10.0
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
