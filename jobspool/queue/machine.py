"""The state machine: pure functions that compute a job's next snapshot.

Nothing here touches the disk or reads a clock: `now` and the random source
are passed in, so every rule about leases, due-ness and backoff is a pure
function of the job and the time. The spool calls these under its lock and
hands the result to the store.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from jobspool.errors import DuplicateJob, InvalidTransition, JobTooLarge, LeaseLost
from jobspool.queue.job import (
    MAX_RUN_AT,
    Job,
    Lease,
    LeaseInfo,
    clip_error,
    evolve,
    new_job_snapshot,
    validate_delay,
)
from jobspool.queue.jobsize import clip_traceback, encode_admitted
from jobspool.queue.states import JobState, check_transition


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with "equal jitter", capped.

    The n-th retry waits a uniform random time in [d/2, d] where
    d = min(max_seconds, base_seconds * 2 ** (n - 1)): the floor keeps a
    storm of failures from retrying at once, the cap keeps a job from
    sleeping for days.
    """

    base_seconds: float = 1.0
    max_seconds: float = 300.0

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        n = max(1, attempts)
        # Cap the exponent before computing, so attempts in the thousands cannot overflow.
        d = min(self.max_seconds, self.base_seconds * (2.0 ** min(n - 1, 62)))
        r = (rng or random).random()
        return d / 2.0 + r * d / 2.0


def _due(now: float, wait: float) -> float:
    """When a retry comes due: never past the year 9999, beyond which no reader takes a
    job file (settings are checked against it, but against the machine's clock, not the
    spool's, and a backoff doubles from them)."""
    return min(now + wait, MAX_RUN_AT)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed run as the worker reports it to `Spool.fail` in place of a bare message.

    Carries what a plain string cannot: the run's traceback, the per-kind
    backoff and attempt limit (`Policy`), and how the run ended —
    `interrupted` (cut off by a shutdown: back to `ready`, the attempt
    counted) or `rescued` (its process died running it: a rescue counted too).
    """

    error: str
    traceback: str | None = None
    policy: RetryPolicy | None = None
    max_attempts: int | None = None
    interrupted: bool = False
    rescued: bool = False

    def __str__(self) -> str:
        return self.error


def _move(job: Job, action: str, dst: JobState, now: float, **changes: Any) -> Job:
    check_transition(job.id, action, job.state, dst)
    changes.setdefault("updated_at", now)
    return evolve(job, state=dst, revision=job.revision + 1, **changes)


def new_job(*, job_id: str, kind: str, payload: Any, now: float, delay: float, priority: int,
            max_attempts: int, state: JobState | None = None,
            reservations: tuple[str, ...] = (), run_at: float | None = None,
            timeout: float | None = None) -> Job:
    """A fresh job: due at `run_at` (absolute) or `now + delay`; parked in `retryable`
    (shown as "scheduled": no attempt yet) until then."""
    run_at = now + delay if run_at is None else run_at
    if state is None:
        state = JobState.RETRYABLE if run_at > now else JobState.READY
    # `Job(...)`, without the frozen `__init__`'s cost (one per enqueued job; job.py)
    return new_job_snapshot(id=job_id, kind=kind, payload=payload, state=state,
                            priority=priority, attempts=0, max_attempts=max_attempts,
                            revision=1, created_at=now, updated_at=now, run_at=run_at,
                            reservations=reservations, timeout=timeout)


def reopen(job: Job, *, kind: str, payload: Any, now: float, delay: float, priority: int,
           max_attempts: int, state: JobState | None = None,
           reservations: tuple[str, ...] = (), run_at: float | None = None) -> Job:
    """A canceled job enqueued again: new revision, attempts reset."""
    run_at = now + delay if run_at is None else run_at
    if state is None:
        state = JobState.RETRYABLE if run_at > now else JobState.READY
    return _move(job, "reopen", state, now, kind=kind, payload=payload, attempts=0,
                 priority=priority,
                 max_attempts=max_attempts, run_at=run_at, lease=None, last_error=None,
                 result=None, reservations=reservations, rescues=0, traceback=None)


# ---------------------------------------------------------------- enqueue decisions

ON_CONFLICT: tuple[str, ...] = ("keep", "replace", "error")


def decide_enqueue(existing: Job, fresh: Job, *, now: float, on_conflict: str,
                   unique_states: frozenset[JobState] | None,
                   reservation: str | None = None,
                   max_bytes: int | None = None) -> tuple[str, Job]:
    """What enqueueing `fresh` does to the `existing` job of the same id (DESIGN §9).

    Returns `(outcome, job)`: `"existing"` (nothing to write, `job` is `existing`),
    `"reopened"`, `"replaced"` or `"reserved"` (a new snapshot to write). Raises
    `DuplicateJob` when the policy refuses. An existing job conflicts when its state
    is in `unique_states` (all states when None); a running (leased) job always does,
    since a second run of one id cannot start beside it. A job that does not
    conflict is replaced, as with `on_conflict="replace"`.
    """
    state = existing.state
    conflicts = unique_states is None or state in unique_states or state is JobState.LEASED
    policy = on_conflict if conflicts else "replace"
    if policy == "keep":
        if state is JobState.CANCELED:
            # A producer that aborted (or an operator who canceled) may try again.
            return "reopened", evolve(reopen(
                existing, kind=fresh.kind, payload=fresh.payload, now=now,
                delay=max(0.0, fresh.run_at - now), priority=fresh.priority,
                max_attempts=fresh.max_attempts, run_at=fresh.run_at,
                state=fresh.state if reservation else None, reservations=fresh.reservations),
                timeout=fresh.timeout)
        if reservation is not None and (state is JobState.PREPARED or _undecided(existing)):
            new = add_reservation(existing, reservation, now=now)
            if max_bytes is not None:
                _check_reservation_fits(new, max_bytes)
            return "reserved", new
        return "existing", existing
    if policy == "error":
        raise DuplicateJob(existing.id, state.value, "on_conflict='error'")
    if state is JobState.LEASED:
        raise DuplicateJob(existing.id, state.value,
                           "it is running and cannot be replaced (cancel it first)")
    if reservation is not None:
        raise ValueError("prepare only keeps an existing job")  # never reached via Spool
    if state is JobState.PREPARED:
        # Its producers still hold reservations: new content, their commit publishes it.
        dst, reservations = JobState.PREPARED, existing.reservations
        if max_bytes is not None:
            # With every reservation it carries: checked alone, a payload near the limit
            # made a file over max_job_bytes ("written anyway").
            try:
                encode_admitted(evolve(existing, payload=fresh.payload), max_bytes=max_bytes)
            except JobTooLarge as exc:
                raise JobTooLarge(f"job {existing.id!r} is prepared by "
                                  f"{len(existing.reservations)} producer(s): with their "
                                  f"reservations the new payload makes it {exc.size} bytes, "
                                  f"over the {exc.limit} a job may use", size=exc.size,
                                  limit=exc.limit) from None
    else:
        dst = JobState.RETRYABLE if fresh.run_at > now else JobState.READY
        reservations = ()
    return "replaced", _move(existing, "replace", dst, now, kind=fresh.kind,
                             payload=fresh.payload, attempts=0, priority=fresh.priority,
                             max_attempts=fresh.max_attempts, run_at=fresh.run_at, lease=None,
                             last_error=None, result=None, reservations=reservations,
                             rescues=0, traceback=None, timeout=fresh.timeout)


def is_due(job: Job, now: float) -> bool:
    """Whether a claim may take this job now."""
    if job.state is JobState.READY:
        return True
    if job.state is JobState.RETRYABLE:
        return job.run_at <= now
    if job.state is JobState.LEASED:
        return job.lease is not None and job.lease.expires_at <= now
    return False


def lease_expired(job: Job, now: float) -> bool:
    return job.state is JobState.LEASED and job.lease is not None and job.lease.expires_at <= now


def claim(job: Job, *, token: int, owner: str, now: float, lease_seconds: float,
          proc: str | None = None, unstarted: bool = False) -> Job:
    """Lease a due job. Taking over an expired lease counts a rescue, unless `unstarted`:
    its holder is provably dead and never started its handler, so that attempt is given
    back instead (a batch mate of a job that killed its worker is not to blame)."""
    if job.state is JobState.LEASED and unstarted:
        rescued, attempts = 0, job.attempts
    else:
        rescued, attempts = (1 if job.state is JobState.LEASED else 0), job.attempts + 1
    # A lease is never handed out already expired, however short (float rounding included).
    expires = max(now + lease_seconds, math.nextafter(now, math.inf))
    lease = LeaseInfo(token=token, owner=owner, expires_at=expires, proc=proc)
    return _move(job, "claim", JobState.LEASED, now, attempts=attempts, lease=lease,
                 rescues=job.rescues + rescued)


def return_unstarted(job: Job, *, now: float) -> Job:
    """A lease whose holder died before starting the handler: back to ready, uncounted."""
    return _move(job, "release", JobState.READY, now, lease=None,
                 attempts=max(0, job.attempts - 1), run_at=now)


def take_back(job: Job, *, now: float, running: set[int] | None, policy: RetryPolicy,
              max_rescues: int | None, rng: random.Random | None = None) -> Job:
    """A lease taken from a holder that died or let it expire: back uncounted when the
    holder's liveness mark says its handler never started (`running`: the tokens it was
    running, None when unknown), else reclaimed, a rescue counted."""
    assert job.lease is not None
    if running is not None and job.lease.token not in running:
        return return_unstarted(job, now=now)
    return reclaim(job, now=now, policy=policy, max_rescues=max_rescues, rng=rng)


# Why a reclaimed job waits again (both stores: pg/sql.py writes the same words).
EXPIRED = "lease expired (worker died or stalled)"


def reclaim(job: Job, *, now: float, policy: RetryPolicy, max_rescues: int | None,
            rng: random.Random | None = None) -> Job:
    """An expired lease given back: retryable, or dead letter when attempts (or rescues) run out."""
    rescues = job.rescues + 1
    # This run's end, not an earlier run's error: a job requeued after a failure, or cut
    # off at a shutdown before, kept saying so when its next worker died. The earlier error
    # stays in a dead letter's message, where it may say why the runs kept dying.
    error = EXPIRED
    if job.attempts >= job.max_attempts:
        before = f"; before it: {job.last_error}" if job.last_error else ""
        return _move(job, "reclaim", JobState.DEAD_LETTER, now, lease=None, rescues=rescues,
                     last_error=clip_error(f"attempts exhausted; last: {error}{before}"))
    if max_rescues is not None and rescues > max_rescues:
        return _move(job, "reclaim", JobState.DEAD_LETTER, now, lease=None, rescues=rescues,
                     last_error=clip_error(f"poison pill: lease expired {rescues} times "
                                           f"(max_rescues={max_rescues})"))
    # Why it is waiting again, as the PostgreSQL store records it: a job reclaimed from a
    # dead worker showed no error at all.
    return _move(job, "reclaim", JobState.RETRYABLE, now, lease=None, rescues=rescues,
                 run_at=_due(now, policy.delay(job.attempts, rng)), last_error=clip_error(error))


def token_mismatch(current: int, held: int) -> str:
    """Why a lease of token `held` is not the job's current one (token `current`): a later
    claim took it, or the lease was never this job's (a token above every claim of it)."""
    if held > current:
        return f"its token is above the job's lease (token {current}): not a lease of this job"
    return f"job was claimed again (token {current})"


def check_lease(job: Job, lease: Lease, now: float) -> None:
    """Raise `LeaseLost` unless `lease` is the job's current, unexpired lease."""
    if job.state is not JobState.LEASED or job.lease is None:
        raise LeaseLost(lease.job_id, lease.token, f"job is {job.state.value}")
    if job.lease.token != lease.token:
        raise LeaseLost(lease.job_id, lease.token, token_mismatch(job.lease.token, lease.token))
    if lease.job.created_at != job.created_at:
        # Tokens are unique per spool only: another spool's lease on a job of the same id
        # (per-tenant spools, deterministic ids) can carry the very same token.
        raise LeaseLost(lease.job_id, lease.token, "the lease is for another job of this id "
                                                   "(issued by another spool?)")
    if job.lease.expires_at <= now:
        raise LeaseLost(lease.job_id, lease.token, "lease expired")


def heartbeat(job: Job, lease: Lease, *, now: float, lease_seconds: float,
              held: bool = False) -> Job:
    """Extend a lease. `held`: the caller held the job (the spool lock, a row lock) since it
    checked the lease, so it expiring meanwhile let nobody take it (`fenced`'s exit)."""
    check_lease(job, lease, -math.inf if held else now)
    assert job.lease is not None
    info = LeaseInfo(token=job.lease.token, owner=job.lease.owner,
                     expires_at=max(job.lease.expires_at, now + lease_seconds),
                     proc=job.lease.proc)
    # A heartbeat is lease bookkeeping, not a change of the job: `updated_at` stays (as on
    # PostgreSQL, where leaving it keeps the heartbeat a HOT update).
    return _move(job, "heartbeat", JobState.LEASED, now, lease=info,
                 updated_at=job.updated_at)


def complete(job: Job, lease: Lease, *, now: float, result: Any) -> Job:
    check_lease(job, lease, now)
    return _move(job, "complete", JobState.COMPLETED, now, lease=None, result=result)


def fail(job: Job, lease: Lease, *, now: float, error: object, retryable: bool,
         delay: float | None, policy: RetryPolicy, rng: random.Random | None = None) -> Job:
    """A failed run: retryable with backoff, or dead letter when permanent or exhausted.

    `error` is a message, an exception, or a `Failure` whose policy and attempt
    limit override the spool's and whose traceback is stored on the job.
    """
    check_lease(job, lease, now)
    tb: str | None = None
    limit = job.max_attempts
    rescues = job.rescues
    if isinstance(error, Failure):
        tb = clip_traceback(error.traceback)
        policy = error.policy or policy
        limit = error.max_attempts or limit
        rescues += 1 if error.rescued else 0
        if error.interrupted and retryable and job.attempts < limit:
            # Cut off by a shutdown: runnable again at once, but the attempt counts, so a
            # job that keeps taking its worker down cannot loop forever.
            return _move(job, "release", JobState.READY, now, lease=None, run_at=now,
                         last_error=clip_error(error.error), traceback=tb)
        error = error.error
    message = clip_error(error)
    # The limit applied is the one the job shows (a kind's Policy(max_attempts=2) over the
    # spool's 5 showed "attempts 2/5" on a job dead-lettered after 2).
    if not retryable or job.attempts >= limit:
        return _move(job, "fail", JobState.DEAD_LETTER, now, lease=None, last_error=message,
                     traceback=tb, rescues=rescues, max_attempts=limit)
    wait = policy.delay(job.attempts, rng) if delay is None else delay
    return _move(job, "fail", JobState.RETRYABLE, now, lease=None, last_error=message,
                 run_at=_due(now, wait), traceback=tb, rescues=rescues, max_attempts=limit)


def settle(job: Job, lease: Lease, action: str, arg: Any, *, now: float, policy: RetryPolicy,
           rng: random.Random | None = None) -> Job:
    """A batch item's settle: `("complete", result)`, `("fail", (error, retryable,
    delay))` or `("release", delay)`, the same for every store."""
    if action == "complete":
        return complete(job, lease, now=now, result=arg)
    if action == "release":
        delay, why = arg if isinstance(arg, tuple) else (arg, None)
        return release(job, lease, now=now, delay=delay, error=why)
    err, retryable, delay = arg
    if delay is not None:
        delay = validate_delay(delay)
    return fail(job, lease, now=now, error=err, retryable=retryable, delay=delay,
                policy=policy, rng=rng)


def result_refused(job: Job, lease: Lease, exc: JobTooLarge, *, now: float,
                   policy: RetryPolicy) -> tuple[Job, JobTooLarge]:
    """A completion whose result does not fit: the job is dead-lettered, alone (DESIGN §9,
    sizes: run again, it would only make the same result), and the caller is told so.
    Every store settles it this way; the Worker checks results earlier, before the
    projection merge (`Settler._refuse_unstorable`)."""
    dead = fail(job, lease, now=now, error=f"result refused: {exc.message}", retryable=False,
                delay=None, policy=policy)
    told = JobTooLarge(f"{exc.message}; job {job.id!r} was dead-lettered",
                       size=exc.size, limit=exc.limit, field="result")
    return dead, told


def release(job: Job, lease: Lease, *, now: float, delay: float,
            error: str | None = None) -> Job:
    """Give a job back without counting the attempt (shutdown, handler not ready); `error`
    says why it waits (a projection whose storage failed), else its last error stays."""
    check_lease(job, lease, now)
    dst = JobState.RETRYABLE if delay > 0 else JobState.READY
    extra = {} if error is None else {"last_error": clip_error(error)}
    return _move(job, "release", dst, now, lease=None, attempts=max(0, job.attempts - 1),
                 run_at=now + delay, **extra)


def cancel(job: Job, *, now: float) -> Job:
    return _move(job, "cancel", JobState.CANCELED, now, lease=None, reservations=())


def requeue(job: Job, *, now: float) -> Job:
    # A completed job's old result goes: it would read as this run's until it finishes.
    return _move(job, "requeue", JobState.READY, now, lease=None, attempts=0, run_at=now,
                 rescues=0, result=None, reservations=())


def commit(job: Job, *, now: float, why: str = "commit") -> Job:
    """Publish a prepared job: ready, or retryable until its `run_at` when it was delayed.

    A prepared job never ran: its attempts count only the replays that could not tell
    whether its producer committed ("unknown"). Published, it gets its full attempts to
    run: two "unknown" replays of a slow producer's job left it one run of three."""
    dst = JobState.RETRYABLE if job.run_at > now else JobState.READY
    if job.attempts:
        return _move(job, why, dst, now, reservations=(), attempts=0, last_error=None)
    return _move(job, why, dst, now, reservations=())


# How `replay` words the dead letter of a job whose hook never resolved it.
REPLAY_GAVE_UP = "replay unresolved after"


def commit_reserved(job: Job, reservation_id: str, *, now: float) -> Job:
    """What `commit(reservation)` makes of `job` (both stores): a prepared job published; a
    job recovery dead-lettered because its replay hook kept saying "unknown" published as
    well, its replays forgotten (its producer was slow, not dead, and now says its change
    happened: the job must run, not be handed back dead); a canceled one refused
    (`InvalidTransition`); any other returned as it is (a commit is idempotent)."""
    if job.state is JobState.PREPARED:
        if reservation_id not in job.reservations:
            raise _not_held(job, reservation_id)
        return commit(job, now=now)
    if job.state is JobState.CANCELED:
        raise InvalidTransition(job.id, job.state.value, "commit")
    if job.state is JobState.DEAD_LETTER and _replay_gave_up(job):
        if job.reservations and reservation_id not in job.reservations:
            # Its producer aborted it since (a dead letter of an older release holds none).
            raise _not_held(job, reservation_id)
        dst = JobState.RETRYABLE if job.run_at > now else JobState.READY
        return _move(job, "commit", dst, now, attempts=0, last_error=None, reservations=())
    return job


def _not_held(job: Job, reservation_id: str) -> InvalidTransition:
    """A commit with a reservation the job does not hold. The job cannot tell an aborted
    one from one never its own (a forged or mixed-up `Reservation`): "in state 'prepared
    (reservation released)'" sent the holder of an unknown one looking for an abort."""
    return InvalidTransition(
        job.id, f"{job.state.value} (reservation released)", "commit",
        f"cannot commit job {job.id!r}: it holds no reservation {reservation_id[:80]!r} "
        "(released by an abort, or never one of this job's)")


def _check_reservation_fits(job: Job, max_bytes: int) -> None:
    """Each producer's reservation grows the job: past what a new job may use, the next
    `prepare` is refused (`JobTooLarge`), never written beyond `max_job_bytes`."""
    try:
        encode_admitted(job, max_bytes=max_bytes)
    except JobTooLarge as exc:
        raise JobTooLarge(f"job {job.id!r} is prepared by {len(job.reservations) - 1} "
                          f"producer(s) already: one more reservation makes it {exc.size} "
                          f"bytes, over the {exc.limit} a job may use; commit or abort the "
                          "reservations held", size=exc.size, limit=exc.limit) from None


def add_reservation(job: Job, reservation_id: str, *, now: float) -> Job:
    return evolve(job, reservations=(*job.reservations, reservation_id),
                  revision=job.revision + 1, updated_at=now)


def abort(job: Job, reservation_id: str, *, now: float) -> Job:
    """Drop one producer's reservation; the last one out cancels the job."""
    left = tuple(r for r in job.reservations if r != reservation_id)
    if left:
        return _move(job, "abort", job.state, now, reservations=left)
    return _move(job, "abort", JobState.CANCELED, now, reservations=(),
                 last_error="aborted by its producer")


def abort_reserved(job: Job, reservation_id: str, *, now: float) -> Job:
    """What `abort(reservation)` makes of `job` (both stores): the reservation dropped
    from a prepared job, or from one recovery dead-lettered because its replay hook kept
    saying "unknown" (its producer was slow, not dead, and rolled its change back: as a
    late commit publishes such a job, a late abort cancels it once no producer holds
    it); any other job, or a reservation it no longer holds, returned as it is."""
    if reservation_id not in job.reservations:
        return job
    if job.state is JobState.PREPARED or (job.state is JobState.DEAD_LETTER
                                          and _replay_gave_up(job)):
        return abort(job, reservation_id, now=now)
    return job


def _replay_gave_up(job: Job) -> bool:
    return (job.last_error or "").startswith(REPLAY_GAVE_UP)


def _undecided(job: Job) -> bool:
    """A dead letter of a replay that never resolved, whose producers still hold their
    reservations: as good as prepared to a producer joining it. Handed a reservation the
    job did not record, the joiner's commit was refused as "reservation released" (a
    release it never made), where a prepared job's joiner publishes it."""
    return job.state is JobState.DEAD_LETTER and bool(job.reservations) and _replay_gave_up(job)


def replay(job: Job, outcome: str, *, now: float, error: str | None = None) -> Job:
    """Apply a replay hook's verdict to a prepared job left behind by a dead producer."""
    if outcome == "committed":
        # Published as its producer's commit would have: a delayed job waits for its time.
        return commit(job, now=now, why="replay")
    if outcome == "aborted":
        return _move(job, "replay", JobState.CANCELED, now, reservations=(),
                     last_error="aborted by replay")
    attempts = job.attempts + 1
    message = clip_error(error or "replay outcome unknown")
    if attempts >= job.max_attempts:
        # The reservations stay: a producer that was only slow may still commit or abort it.
        return _move(job, "replay", JobState.DEAD_LETTER, now, attempts=attempts,
                     last_error=clip_error(f"{REPLAY_GAVE_UP} {attempts} attempts; "
                                           f"last: {message}"))
    return _move(job, "replay", JobState.PREPARED, now, attempts=attempts, last_error=message)


def adds_to_backlog(old: Job | None, new: Job) -> bool:
    """Whether an enqueue's write adds a job to the backlog admission limits: a new job, a
    finished one reopened, or a waiting one a replace makes ready now (a retry backing off,
    a delayed job): those went past `max_due` unchecked."""
    return (old is None or old.terminal
            or (new.state is JobState.READY and old.state is not JobState.READY))
