"""Argument rules every store applies the same way (the file spool and PostgreSQL):
conflict policies, unique states, time limits, `run_at`, `jobs(state=...)`, `wait`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from jobspool.errors import InvalidJob
from jobspool.queue import machine
from jobspool.queue.job import validate_run_at, validate_seconds
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
    """A per-job time limit: None, or a positive finite number of seconds."""
    return None if timeout is None else validate_seconds("timeout", timeout, positive=True)


def check_run_at(run_at: object, delay: float, now: float) -> float | None:
    if run_at is None:
        return None
    if delay:
        raise InvalidJob(f"give delay or run_at, not both (delay={delay!r}, run_at={run_at!r})",
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


__all__ = ["check_on_conflict", "check_run_at", "check_timeout", "check_unique_states", "job_states",
           "validate_wait"]
