"""Job states, their named sets, and the one transition table checked in one place."""

from __future__ import annotations

from enum import StrEnum

from jobspool.errors import InvalidTransition


class JobState(StrEnum):
    PREPARED = "prepared"
    READY = "ready"
    LEASED = "leased"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    DEAD_LETTER = "dead_letter"
    CANCELED = "canceled"


ALL_STATES: tuple[JobState, ...] = tuple(JobState)
TERMINAL: frozenset[JobState] = frozenset(
    {JobState.COMPLETED, JobState.DEAD_LETTER, JobState.CANCELED}
)
# States a claim may take a job from (leased only when its lease expired).
CLAIMABLE: frozenset[JobState] = frozenset({JobState.READY, JobState.RETRYABLE, JobState.LEASED})
CANCELABLE: frozenset[JobState] = frozenset(
    {JobState.PREPARED, JobState.READY, JobState.RETRYABLE, JobState.LEASED}
)
# DESIGN §3: "Completed and dead-lettered jobs run again only through `requeue`".
REQUEUEABLE: frozenset[JobState] = frozenset(
    {JobState.DEAD_LETTER, JobState.CANCELED, JobState.COMPLETED})

# Every allowed (action -> from-states -> to-states). Nothing else may move a job.
ALLOWED: dict[str, dict[JobState, frozenset[JobState]]] = {
    # A commit also publishes a job the replay dead-lettered unresolved: its producer was
    # late, not dead (`machine.commit_reserved`).
    "commit": {s: frozenset({JobState.READY, JobState.RETRYABLE})
               for s in (JobState.PREPARED, JobState.DEAD_LETTER)},
    # And cancels one it dead-lettered so, once the last producer holding it aborts (a
    # requeue would otherwise run a job whose producer rolled its change back).
    "abort": {JobState.PREPARED: frozenset({JobState.CANCELED, JobState.PREPARED}),
              JobState.DEAD_LETTER: frozenset({JobState.CANCELED, JobState.DEAD_LETTER})},
    "claim": {s: frozenset({JobState.LEASED}) for s in CLAIMABLE},
    "heartbeat": {JobState.LEASED: frozenset({JobState.LEASED})},
    "complete": {JobState.LEASED: frozenset({JobState.COMPLETED})},
    "fail": {JobState.LEASED: frozenset({JobState.RETRYABLE, JobState.DEAD_LETTER})},
    "release": {JobState.LEASED: frozenset({JobState.READY, JobState.RETRYABLE})},
    "cancel": {s: frozenset({JobState.CANCELED}) for s in CANCELABLE},
    "requeue": {s: frozenset({JobState.READY}) for s in REQUEUEABLE},
    "reopen": {JobState.CANCELED: frozenset({JobState.READY, JobState.RETRYABLE, JobState.PREPARED})},
    # enqueue(on_conflict="replace"): new content for a job not running (DESIGN §9).
    "replace": {
        JobState.PREPARED: frozenset({JobState.PREPARED}),
        **{s: frozenset({JobState.READY, JobState.RETRYABLE})
           for s in (JobState.READY, JobState.RETRYABLE, *TERMINAL)},
    },
    "reclaim": {JobState.LEASED: frozenset({JobState.RETRYABLE, JobState.DEAD_LETTER})},
    "replay": {
        JobState.PREPARED: frozenset({JobState.READY, JobState.RETRYABLE, JobState.CANCELED,
                                      JobState.PREPARED, JobState.DEAD_LETTER})
    },
}


def check_transition(job_id: str, action: str, src: JobState, dst: JobState) -> None:
    """Raise `InvalidTransition` unless `action` may move a job from `src` to `dst`."""
    targets = ALLOWED.get(action, {}).get(src)
    if targets is None or dst not in targets:
        raise InvalidTransition(job_id, str(src), action)


def check_source(job_id: str, action: str, src: JobState) -> None:
    """Raise `InvalidTransition` unless `action` is allowed at all from `src`."""
    if src not in ALLOWED.get(action, {}):
        raise InvalidTransition(job_id, str(src), action)
