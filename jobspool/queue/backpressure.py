"""Writer backpressure: refuse `enqueue`/`prepare` while the due backlog is over a limit.

Off by default. `Spool(max_due=N)` bounds the number of jobs waiting in
`ready/`; `Spool(max_lag_seconds=S)` bounds how long the oldest of them has
waited. While a bound is exceeded, `enqueue`, `enqueue_many` and `prepare`
raise `Backpressure` (retryable: nothing was written) naming the limit and
the value that tripped it. Thresholds, with hysteresis so producers do not
flap at the edge:

- refused when admitting the batch would leave more than `max_due` ready
  jobs (`due + n > max_due`), or when the oldest ready job has waited more
  than `max_lag_seconds`; a batch larger than `max_due` is still admitted
  into an empty backlog, or it could never be admitted at all;
- once refused, admitted again only when the backlog is *under half* of
  each limit (`due < max_due / 2` and `lag < max_lag_seconds / 2`).

What is measured, and what it costs (this runs under the spool lock on
every enqueue):

- `due` is one `os.listdir` of `ready/` (a count of names, no file reads).
  Jobs in `retryable/` whose backoff ended are not counted: finding them
  means reading every retryable file. Delayed jobs and prepared jobs are not
  backlog either.
- `lag` is how long the ready job with the smallest id has waited (since its
  `run_at`, or since it arrived in `ready/` when later: `waiting_since`),
  one file read. Generated ids are time-ordered, so that is the oldest job;
  with caller-given ids it is an approximation (the lexicographically first
  id), while `max_due` stays exact.
- The measurement is cached per spool object for `CACHE_SECONDS` of the
  spool's clock, and this process's own admissions are added to the cached
  count meanwhile. The trade-off: within that window jobs added by other
  processes are not seen, so the backlog can overshoot `max_due` by what
  other producers enqueue in a quarter second; in exchange a burst of
  enqueues costs one listing per window instead of one per job. A refusal,
  and a release from the refused state, are always decided on a fresh
  measurement — a stale cache can admit a little late or a little too much,
  never refuse wrongly.

The on/off state is per `Spool` object (per producer process), kept here,
because a call that raises cannot hand a new state back to its caller.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jobspool.errors import Backpressure
from jobspool.queue.states import JobState
from jobspool.queue.store import JOB_SUFFIX, ignored_name

if TYPE_CHECKING:
    from jobspool.queue.journal import Journal

CACHE_SECONDS = 0.25
# How long a refusal counted with writes in flight waits for them before deciding again.
IN_FLIGHT_WAIT = 1.0


@dataclass(slots=True)
class Backlog:
    """One measurement of the due backlog: ready jobs, and `run_at` of the oldest one."""

    due: int
    oldest_run_at: float | None
    measured_at: float

    def lag(self, now: float) -> float:
        return 0.0 if self.oldest_run_at is None else max(0.0, now - self.oldest_run_at)


@dataclass(slots=True)
class _State:
    on: bool = False
    backlog: Backlog | None = None
    admitted_since: int = 0  # jobs this process admitted since `backlog` was measured
    # Admitted and not yet written (`landed`): a store whose writes are not under the
    # admission's lock (PostgreSQL). A measurement cannot see them yet, so they stay in
    # the estimate when it is measured again: reset with `admitted_since`, they were lost
    # to it, and 8 threads of one producer took `max_due=100` to 150.
    in_flight: int = 0
    landing: threading.Condition = field(default_factory=threading.Condition)


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def waiting_since(run_at: float, updated_at: float) -> float:
    """When a ready job started waiting: when it came due, or arrived in `ready/` if later.
    A job enqueued with a `run_at` an hour back (a backfill) has waited no time at all;
    measured from `run_at`, it refused every producer under `max_lag_seconds`."""
    return max(run_at, updated_at)


def measure(spool: Journal) -> Backlog:
    """Count `ready/` (one listing) and read the job with the smallest id (one file read)."""
    now = spool.now()
    names = [n for n in os.listdir(spool.root / JobState.READY.value)
             if n.endswith(JOB_SUFFIX) and not ignored_name(n)]
    oldest: float | None = None
    # A job claimed between the listing and the read is simply gone: try the next one.
    for name in sorted(names)[:4]:
        job = spool.read_job(JobState.READY, name[: -len(JOB_SUFFIX)])
        if job is not None:
            oldest = waiting_since(job.run_at, job.updated_at)
            break
    return Backlog(due=len(names), oldest_run_at=oldest, measured_at=now)


class Limited(Protocol):
    """What admission needs of a spool (either store): its limits and its clock."""

    @property
    def max_due(self) -> int | None: ...

    @property
    def max_lag_seconds(self) -> float | None: ...

    def now(self) -> float: ...


def _over(spool: Limited, backlog: Backlog, n: int, now: float) -> tuple[Any, ...] | None:
    """The limit the admission of `n` jobs would break, as (name, value, limit), or None."""
    if spool.max_due is not None and backlog.due > 0 and backlog.due + n > spool.max_due:
        return ("max_due", float(backlog.due), float(spool.max_due), n)
    lag = backlog.lag(now)
    if spool.max_lag_seconds is not None and lag > spool.max_lag_seconds:
        return ("max_lag_seconds", lag, spool.max_lag_seconds)
    return None


def _still_high(spool: Limited, backlog: Backlog, now: float) -> tuple[str, float, float] | None:
    """While refusing: the limit whose half the backlog has not yet dropped under, or None."""
    if spool.max_due is not None and backlog.due >= spool.max_due / 2:
        return ("max_due", float(backlog.due), float(spool.max_due))
    lag = backlog.lag(now)
    if spool.max_lag_seconds is not None and lag >= spool.max_lag_seconds / 2:
        return ("max_lag_seconds", lag, spool.max_lag_seconds)
    return None


def _refuse(limit: tuple[Any, ...], *, releasing: bool) -> Backpressure:
    name, value, bound = limit[:3]
    if name == "max_due":
        adding = limit[3] if len(limit) > 3 else 0
        # `due + n > max_due` refuses at the limit: "4 ready jobs, over max_due=4" read wrong.
        what = f"{int(value)} ready jobs" + (f" and {adding} more" if adding else "")
        shown = f"max_due={int(bound)}"
        # In whole jobs: "under 1.5 ready jobs" for max_due=3.
        below = math.ceil(bound / 2)
        back = f"under {below} ready job{'s' if below != 1 else ''}"
    else:
        what = f"the oldest ready job has waited {value:.1f} s"
        shown = f"max_lag_seconds={bound:g}"
        back = f"under {bound / 2:g} s of lag"
    state = "not yet under half of" if releasing else (
        "would be over" if name == "max_due" else "over")
    return Backpressure(f"backpressure: {what}, {state} the limit {shown}; nothing was "
                        f"written, retry later (enqueues are admitted again {back})",
                        limit=name, value=value)


def admit(spool: Any, n: int, measure_fn: Callable[[], Backlog] | None = None, *,
          in_flight: bool = False) -> None:
    """Admit `n` new jobs or raise `Backpressure`.

    Call under the spool lock, before writing. Whether this spool object is
    refusing already is kept here, per spool (see the module docstring).
    `measure_fn` measures the backlog of a store other than the file spool
    (the PostgreSQL store counts its rows). `in_flight`: the jobs are written
    after this returns, outside any lock of the spool's; `landed` says when.
    """
    if measure_fn is None:
        def measure_fn() -> Backlog:
            return measure(spool)

    st = _STATES.get(spool)
    if st is None:
        st = _STATES.setdefault(spool, _State())
    with st.landing:
        was_on = st.on
        try:
            _admit(spool, st, n, measure_fn, in_flight)
        except Backpressure:
            if st.in_flight == 0:
                raise
            # Counted with jobs admitted and not yet known written, some of which may be
            # committed and in the fresh count already: counted twice, a batch that fitted
            # was refused (and latched the producer). Decided again once they landed.
            st.landing.wait_for(lambda: st.in_flight == 0, timeout=IN_FLIGHT_WAIT)
            st.on, st.backlog = was_on, None
            _admit(spool, st, n, measure_fn, in_flight)


def landed(spool: Any, n: int, written: bool) -> None:
    """`n` jobs admitted `in_flight` were written (or not, the write failed)."""
    st = _STATES.get(spool)
    if st is None or n == 0:
        return
    with st.landing:
        st.in_flight = max(0, st.in_flight - n)
        if written:
            st.admitted_since += n
        st.landing.notify_all()


def _admit(spool: Any, st: _State, n: int, measure_fn: Callable[[], Backlog],
           in_flight: bool) -> None:
    now = spool.now()
    on = st.on
    fresh = False
    if on or st.backlog is None or now - st.backlog.measured_at >= CACHE_SECONDS or \
            now < st.backlog.measured_at:
        st.backlog, st.admitted_since, fresh = measure_fn(), 0, True
    backlog = st.backlog
    estimate = Backlog(backlog.due + st.admitted_since + st.in_flight, backlog.oldest_run_at,
                       backlog.measured_at)
    if on:
        high = _still_high(spool, estimate, now)
        if high is not None:
            st.on = True
            raise _refuse(high, releasing=True)
    limit = _over(spool, estimate, n, now)
    if limit is not None and not fresh:
        # Never refuse on a cached figure: others may have drained the queue since.
        st.backlog, st.admitted_since = measure_fn(), 0
        fresh_estimate = Backlog(st.backlog.due + st.in_flight, st.backlog.oldest_run_at,
                                 st.backlog.measured_at)
        limit = _over(spool, fresh_estimate, n, now)
    if limit is not None:
        # Refusing from now on (until under half) only when the backlog itself is at the
        # limit: a batch too large for the room left is refused alone. Latched by it, a
        # process refused every single job that fitted until the backlog fell under half.
        at_limit = Backlog(st.backlog.due + st.admitted_since + st.in_flight,
                           st.backlog.oldest_run_at, st.backlog.measured_at)
        st.on = _over(spool, at_limit, 1, now) is not None
        raise _refuse(limit, releasing=False)
    st.on = False
    if in_flight:
        st.in_flight += n
    else:
        st.admitted_since += n



def is_on(spool: Any) -> bool:
    """Whether this spool object is currently refusing enqueues (for stats and tests)."""
    st = _STATES.get(spool)
    return st is not None and st.on


__all__ = ["CACHE_SECONDS", "Backlog", "admit", "is_on", "measure"]
