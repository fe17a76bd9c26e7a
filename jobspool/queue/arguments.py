"""Argument rules every store applies the same way (the file spool and PostgreSQL):
conflict policies, unique states, time limits, `run_at`, `jobs(state=...)`, `wait`."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from jobspool.errors import (
    DuplicateJob,
    InvalidJob,
    InvalidType,
    JobNotFound,
    JobPruned,
    LeaseLost,
    UnreadableJob,
    WaitTimeout,
)
from jobspool.queue import machine
from jobspool.queue.ids import new_job_id, new_token_id
from jobspool.queue.job import (
    Job,
    Lease,
    Reservation,
    check_json,
    json_snapshot,
    validate_delay,
    validate_int,
    validate_job_id,
    validate_kind,
    validate_run_at,
    validate_seconds,
)
from jobspool.queue.payload import MIN_TIMEOUT
from jobspool.queue.states import ALL_STATES, JobState


def check_on_conflict(value: object) -> str:
    if value not in machine.ON_CONFLICT:
        raise InvalidJob(f"on_conflict {value!r} must be one of "
                         f"{', '.join(machine.ON_CONFLICT)}", field="on_conflict")
    return str(value)


def check_unique_states(states: Iterable[JobState | str] | None) -> frozenset[JobState] | None:
    if states is None:
        return None
    if isinstance(states, str):
        states = [states]
    if not isinstance(states, Iterable):
        raise InvalidType(f"unique_states must be a list of states, not a "
                          f"{type(states).__name__}", field="unique_states")
    out: set[JobState] = set()
    for s in states:
        try:
            out.add(JobState(s))
        except ValueError:
            raise InvalidJob(f"unique_states names {s!r}, not a state (one of "
                             f"{', '.join(x.value for x in JobState)})",
                             field="unique_states") from None
    return frozenset(out)


def check_timeout(timeout: object) -> float | None:
    """A per-job time limit: None, or a finite number of seconds from `MIN_TIMEOUT` on."""
    if timeout is None:
        return None
    limit = validate_seconds("timeout", timeout, positive=True)
    if limit < MIN_TIMEOUT:
        raise InvalidJob(f"timeout must be at least {MIN_TIMEOUT:g} s (a limit shorter than "
                         f"starting the handler takes never lets it run), got {timeout!r}",
                         field="timeout")
    return limit


def check_run_at(run_at: object, delay: float, now: float) -> float | None:
    if run_at is None:
        return None
    if delay:
        shown = run_at.isoformat() if isinstance(run_at, datetime) else run_at
        raise InvalidJob(f"give delay or run_at, not both (delay={delay!r}, run_at={shown!r})",
                         field="run_at")
    return validate_run_at(run_at, now)


def job_states(state: JobState | str | None) -> Sequence[JobState]:
    """The states `jobs(state=...)` walks, in order; `InvalidJob` naming a bad one."""
    if state is None:
        return ALL_STATES
    try:
        return (JobState(state),)
    except ValueError:
        raise InvalidJob(f"state {state!r} is not a job state (one of "
                         f"{', '.join(x.value for x in JobState)})", field="state") from None


def validate_wait(timeout: float | None, poll_seconds: float) -> tuple[float | None, float]:
    """`wait`'s arguments checked: a NaN deadline never passes, so it would wait forever.

    `timeout` None or +inf waits without a limit; otherwise it must be finite and >= 0.
    """
    if timeout is not None:
        timeout = None if timeout == math.inf else validate_seconds("timeout", timeout)
    return timeout, validate_seconds("poll_seconds", poll_seconds, positive=True)



@dataclass(frozen=True)
class Batch:
    """An enqueue call's arguments, checked, as fresh jobs (`new_batch`)."""

    fresh: list[Job]
    on_conflict: str
    unique_states: frozenset[JobState] | None
    delay: float
    run_at: float | None  # absolute, when given
    given_ids: bool  # the caller chose ids (they may exist): decide conflicts


def job_ids_for(n: int, job_ids: Sequence[str | None] | None) -> list[str]:
    """One id per payload: the caller's (checked) or a new time-ordered one."""
    if job_ids is None:
        return [new_job_id() for _ in range(n)]
    if not isinstance(job_ids, list | tuple):
        # A set pairs ids with payloads in hash order (a payload under another's key); a
        # str makes an id per character; a generator has no length to check.
        raise InvalidType(f"job_ids must be a list (one id or None per payload, in order), "
                          f"not a {type(job_ids).__name__}", field="job_ids")
    if len(job_ids) != n:
        raise InvalidJob(f"job_ids has {len(job_ids)} items for {n} payloads",
                         field="job_ids")
    return [new_job_id() if i is None else validate_job_id(i) for i in job_ids]



def list_payloads(payloads: Iterable[Any]) -> list[Any]:
    """The payloads of an `enqueue_many`, one per job, as a list (an iterator read once).
    A str, bytes or dict is refused: iterating it would make a job per character, byte or
    key, surely not what was meant."""
    if isinstance(payloads, str | bytes | bytearray | dict):
        raise InvalidType(f"payloads must be a list of payloads, one per job, not a "
                          f"{type(payloads).__name__}", field="payloads")
    return listed("payloads", payloads, "payloads, one per job")


class naming_item:  # lower case: used as the function it was, `with naming_item(i, n):`
    """An `InvalidJob` about one payload of a batch says which (a generated id the caller
    never saw, or "payload['a'] is nan", left them searching).

    A class, not a `contextlib.contextmanager`: entered twice per enqueued job, the
    generator-based form cost ~2 us a time on the one-job enqueue."""

    __slots__ = ("count", "index")

    def __init__(self, index: int, count: int) -> None:
        self.index, self.count = index, count

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if isinstance(exc, InvalidJob) and self.count > 1:
            exc.message = f"payload {self.index} of the batch of {self.count}: {exc.message}"
            exc.args = (exc.message,)
        # None: the exception, if any, goes on


def new_batch(kind: str, payloads: Iterable[Any], *, job_ids: Sequence[str | None] | None,
              delay: float, run_at: object, priority: int, max_attempts: int | None,
              on_conflict: str, unique_states: Iterable[JobState | str] | None,
              timeout: float | None, now: float, default_attempts: int) -> Batch:
    """Check an enqueue's arguments (`InvalidJob` naming the bad one, before anything is
    written) and make its fresh jobs; the same rules for every store."""
    validate_kind(kind)
    payload_list = list_payloads(payloads)
    ids = job_ids_for(len(payload_list), job_ids)
    for i, p in enumerate(payload_list):
        with naming_item(i, len(payload_list)):
            check_json(p, "payload")
        payload_list[i] = json_snapshot(p)
    policy = check_on_conflict(on_conflict)
    unique = check_unique_states(unique_states)
    delay = validate_delay(delay)
    validate_int("priority", priority)
    attempts = default_attempts if max_attempts is None else validate_int(
        "max_attempts", max_attempts, minimum=1)
    limit = check_timeout(timeout)
    at = check_run_at(run_at, delay, now)
    fresh = [machine.new_job(job_id=i, kind=kind, payload=p, now=now, delay=delay, run_at=at,
                             priority=priority, max_attempts=attempts, timeout=limit)
             for i, p in zip(ids, payload_list, strict=True)]
    given = job_ids is not None and any(i is not None for i in job_ids)
    if given:
        _one_job_per_id(fresh, policy)
    return Batch(fresh, policy, unique, delay, at, given)


def _one_job_per_id(fresh: list[Job], policy: str) -> None:
    """An id given twice in one batch names one job, as if enqueued one after the other:
    `keep` stores the first payload, `replace` the last, `error` refuses the whole batch
    with `DuplicateJob` (nothing written). The stores then store each id once, its repeats `existing`."""
    first: dict[str, int] = {}
    for i, job in enumerate(fresh):
        if job.id not in first:
            first[job.id] = i
        elif policy == "error":
            # As the second of two enqueues would be, but the id is not in the spool: no
            # state to name (it named the state the first would have had).
            raise DuplicateJob(job.id, None, "in one batch; on_conflict='error' refuses the "
                               "whole batch")
        elif policy == "replace":
            fresh[first[job.id]] = job


def new_reservation(kind: str, payload: Any, *, job_id: str | None, delay: float,
                    run_at: object, priority: int, max_attempts: int | None,
                    timeout: float | None, now: float, default_attempts: int) -> Job:
    """A `prepare` call's arguments, checked, as a prepared job holding one new reservation
    (its id is `job.reservations[0]`)."""
    validate_kind(kind)
    jid = new_job_id() if job_id is None else validate_job_id(job_id)
    delay = validate_delay(delay)
    validate_int("priority", priority)
    attempts = default_attempts if max_attempts is None else validate_int(
        "max_attempts", max_attempts, minimum=1)
    check_json(payload, "payload")
    at = check_run_at(run_at, delay, now)
    return machine.new_job(job_id=jid, kind=kind, payload=json_snapshot(payload), now=now,
                           delay=delay,
                           run_at=at, priority=priority, max_attempts=attempts,
                           state=JobState.PREPARED, reservations=(new_token_id(),),
                           timeout=check_timeout(timeout))


def wait_until_terminal(get: Callable[[str], Job], job_id: str, timeout: float | None,
                        poll_seconds: float,
                        bound: Callable[[float | None], AbstractContextManager[Any]] | None = None
                        ) -> Job:
    """`wait`, for any store: poll `get` with backoff (5 ms doubling up to four polls'
    worth) until the job is terminal; `WaitTimeout` once `timeout` seconds passed.
    `bound(deadline)` keeps one poll from outliving the deadline (a store waiting out an
    outage: `StoreUnavailable` at the deadline, not after the store's own patience)."""
    timeout, poll_seconds = validate_wait(timeout, poll_seconds)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.005
    seen = False
    while True:
        with contextlib.nullcontext() if bound is None else bound(deadline):
            try:
                job = get(job_id)
            except JobNotFound:
                # Seen unfinished, then gone: it finished and was pruned between two looks
                # (keep_terminal=0; more than keep_terminal finished meanwhile). Said as
                # such, not as a job that never existed.
                if seen:
                    raise JobPruned(job_id) from None
                raise
        seen = True
        if job.terminal:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(job_id, float(timeout or 0))
        sleep = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(sleep)
        delay = min(poll_seconds * 4, delay * 2)


# ---------------------------------------------------------------- objects handed back


def check_lease(value: object) -> None:
    """A settle or beat was handed something other than a `Lease`: say so in one line
    (it failed on a missing attribute, deep inside the store)."""
    if not isinstance(value, Lease):
        raise InvalidType(f"expected a Lease (as claim returns), got {_short(value)}",
                         field="lease")
    if type(value.token) is not int or not -(2**63) <= value.token < 2**63:
        # Built by hand (DESIGN §4) from a token read back as text or a float: the file
        # store failed comparing it (a raw TypeError), PostgreSQL settled with "1" or
        # refused "1.0" in SQL. The stores now answer alike, here.
        raise InvalidType(f"Lease.token must be the claim's token, a whole number, got "
                          f"{_short(value.token)}", field="lease")
    if not isinstance(value.job_id, str):
        raise InvalidType(f"Lease.job_id must be a job id (str), got {_short(value.job_id)}",
                          field="lease")
    if value.seconds is not None:
        # Its length extends it at a heartbeat: a hand-made inf or NaN wrote an expiry no
        # reader takes (file) or one that never passes (PostgreSQL).
        validate_seconds("Lease.seconds", value.seconds, positive=True)


def whole_lease(lease: Lease, get: Callable[[str], Job | None]) -> Lease:
    """A lease built by hand from its four fields (`Lease(job_id, token, owner,
    expires_at)`, as DESIGN §4 names it) with the job it names, read now; the store's own
    check then fences it like any other (a token not the job's current one: `LeaseLost`).
    It failed with AttributeError on both stores. The owner is one of the four: a lease
    of the current token under another owner (another spool's, whose tokens count apart)
    is not this job's."""
    if lease.job is not None:
        return lease
    try:
        job = get(lease.job_id)
    except JobNotFound:  # pruned ids too (`JobPruned` is one)
        job = None
    except UnreadableJob as exc:  # as for a claimed lease: the file, not the call, is bad
        raise LeaseLost(lease.job_id, lease.token, f"its file cannot be read ({exc})") from None
    if job is None:
        raise LeaseLost(lease.job_id, lease.token, "job not found")
    if job.lease is not None and job.lease.token == lease.token \
            and job.lease.owner != lease.owner:
        raise LeaseLost(lease.job_id, lease.token,
                        f"its lease is held by {job.lease.owner!r}, not {lease.owner!r} "
                        "(a lease of another spool?)")
    return replace(lease, job=job)


def each_whole(items: Sequence[Any], get: Callable[[str], Job | None],
               run: Callable[[Sequence[Any]], list[Any]], *, pairs: bool) -> list[Any]:
    """`run` a batch call (settle, beat, check) on its items, the hand-built leases among
    them made whole first (`whole_lease`); an item whose lease names no job it can hold
    gets its `LeaseLost` in its own slot, as a claimed lease of a gone job does, instead
    of failing the whole batch."""
    def lease_of(item: Any) -> Lease:
        return item[0] if pairs else item  # type: ignore[no-any-return]

    if all(lease_of(item).job is not None for item in items):
        return run(items)
    out: list[Any] = [None] * len(items)
    kept: list[Any] = []
    slots: list[int] = []
    for n, item in enumerate(items):
        try:
            lease = whole_lease(lease_of(item), get)
        except LeaseLost as exc:
            out[n] = exc
            continue
        kept.append((lease, *item[1:]) if pairs else lease)
        slots.append(n)
    for n, result in zip(slots, run(kept) if kept else [], strict=True):
        out[n] = result
    return out


def check_leases(items: Iterable[object], *, pairs: bool) -> None:
    """`check_lease` for each lease of a batch: the items themselves, or their first
    member when they are tuples (`complete_many`, `fail_many`)."""
    for item in items:
        if pairs:
            if not isinstance(item, tuple) or not item:
                raise InvalidType(f"expected (lease, ...) tuples, got {_short(item)}",
                                 field="items")
            item = item[0]
        check_lease(item)


def check_flag(name: str, value: object) -> bool:
    """A True/False option: any other value refused (`retryable="false"` is truthy, and the
    job was retried; `durable="false"` kept every flush)."""
    if not isinstance(value, bool):
        raise InvalidType(f"{name} must be True or False, got {_short(value)}", field=name)
    return value


def check_fail_items(items: Sequence[object]) -> None:
    """`fail_many` items: (lease, error, retryable, delay), `retryable` a real bool."""
    check_leases(items, pairs=True)
    for item in items:
        assert isinstance(item, tuple)
        if len(item) != 4:
            raise InvalidType(f"fail_many items are (lease, error, retryable, delay), got "
                              f"{_short(item)}", field="items")
        check_flag("retryable", item[2])


def listed(name: str, value: object, what: str) -> list[Any]:
    """An argument that takes a list (of kinds, states, ids): one line for a value that is
    not iterable (it raised "'int' object is not iterable" from deep inside)."""
    if isinstance(value, bytes | bytearray | dict) or not hasattr(value, "__iter__"):
        raise InvalidType(f"{name} must be a list of {what}, got {_short(value)}", field=name)
    return list(value)


def check_exclude(value: object) -> frozenset[str]:
    """A claim's `exclude`: job ids (strings). A None in it made PostgreSQL's `NOT IN` unknown
    for every row, so the claim took nothing, silently; a bare string was taken letter by
    letter."""
    if isinstance(value, str):
        raise InvalidType(f"exclude must be a list of job ids, got the string {_short(value)}",
                          field="exclude")
    ids = listed("exclude", value, "job ids")
    for job_id in ids:
        if not isinstance(job_id, str):
            raise InvalidType(f"exclude must hold job ids (strings), got {_short(job_id)}",
                              field="exclude")
    return frozenset(ids)


def check_reservation(value: object) -> None:
    if not isinstance(value, Reservation):
        raise InvalidType(f"expected a Reservation (as prepare returns), got {_short(value)}",
                         field="reservation")
    # An outbox keeps (job_id, reservation_id) in its own database and builds the
    # Reservation again later: a `../x` id from there opened paths outside the spool
    # (DESIGN §2: never touched), a NUL raised a bare ValueError.
    validate_job_id(value.job_id)
    if not isinstance(value.reservation_id, str):
        raise InvalidType("Reservation.reservation_id must be a str (as prepare returns), got "
                          f"{_short(value.reservation_id)}", field="reservation")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "Batch",
    "check_fail_items",
    "check_flag",
    "check_lease",
    "check_leases",
    "check_on_conflict",
    "check_reservation",
    "check_run_at",
    "check_timeout",
    "check_unique_states",
    "each_whole",
    "job_ids_for",
    "job_states",
    "list_payloads",
    "listed",
    "new_batch",
    "new_reservation",
    "validate_wait",
    "wait_until_terminal",
    "whole_lease",
]
