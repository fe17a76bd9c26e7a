"""The dashboard's actions: each one call (or one loop) over the public `Spool` API.

Every function returns a short sentence for the notice shown after the
redirect; refusals (a job in the wrong state, gone, an unknown quarantine
entry) are `ActionError` with a sentence for the operator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobspool.errors import InvalidTransition, JobNotFound, JobspoolError
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool


class ActionError(Exception):
    """An action that could not be carried out; the message is shown to the operator."""


# How long an action waits for the spool lock before it is refused, nothing done: as long
# as `health` waits (`HEALTH_LOCK_WAIT`). Waiting for good, a request hung for as long as a
# stopped process held the lock, and so did the dashboard's stop.
ACTION_LOCK_WAIT = 5.0


def lock_within_reach(spool: Spool) -> None:
    """Refuse (`ActionError`) when the file spool's lock stays held `ACTION_LOCK_WAIT` s."""
    from jobspool.queue import lockwait

    if lockwait.held_too_long(spool, ACTION_LOCK_WAIT) is not None:
        raise ActionError(f"nothing was done: the spool lock has been held for over "
                          f"{ACTION_LOCK_WAIT:g} s by another process (a long fenced block, or "
                          "a stopped or stuck process); try again, and see `jobspool health`")


def requeue(spool: Spool, job_id: str) -> str:
    """Run a dead-lettered or canceled job again (`Spool.requeue`)."""
    try:
        spool.requeue(job_id)
    except JobNotFound:
        raise ActionError(f"job {job_id} does not exist (pruned?)") from None
    except InvalidTransition as exc:
        raise ActionError(f"cannot requeue {job_id}: {exc}") from None
    return f"requeued {job_id}"


def cancel(spool: Spool, job_id: str) -> str:
    """Cancel a job that has not finished (`Spool.cancel`; a leased one's holder is fenced out)."""
    try:
        spool.cancel(job_id)
    except JobNotFound:
        raise ActionError(f"job {job_id} does not exist (pruned?)") from None
    except InvalidTransition as exc:
        raise ActionError(f"cannot cancel {job_id}: {exc}") from None
    return f"canceled {job_id}"


def dead_of_kind(spool: Spool, kind: str) -> tuple[list[str], float | None]:
    """Ids of the dead letters of one kind (reads `dead_letter/`, bounded by retention), and
    the newest one's `updated_at`: the confirmation bounds the action by it."""
    jobs = list(spool.jobs(JobState.DEAD_LETTER, kind=kind))
    return [j.id for j in jobs], max((j.updated_at for j in jobs), default=None)


# A confirmation page listed N dead letters and its button said "Yes, purge N"; the action
# then took every dead letter of the kind, those that died since included. It takes only
# those last changed by the listing's newest (`until`); later ones are left for another look.

def requeue_dead(spool: Spool, kind: str, until: float) -> str:
    """Requeue the dead letters of `kind` changed by `until` (`Spool.requeue_matching`:
    re-read under the lock, in chunks, so a job that moved meanwhile is left alone)."""
    done = len(spool.requeue_matching(kind=kind, states=[JobState.DEAD_LETTER],
                                      changed_until=until))
    return f"requeued {done} dead letter{'s' if done != 1 else ''} of kind {kind}"


def purge_dead(spool: Spool, kind: str, until: float) -> str:
    """Remove the dead letters of `kind` changed by `until` for good, the way retention
    pruning removes jobs.

    The public API prunes by age and count, not by kind; this reuses the
    pruning path (which re-checks each job under the lock and removes stale
    copies too), so a job requeued meanwhile is left alone.
    """
    gone: list[str] = []
    chosen = [j for j in spool.jobs(JobState.DEAD_LETTER, kind=kind) if j.updated_at <= until]
    remove_terminal = getattr(spool, "remove_terminal", None)
    if remove_terminal is not None:  # the PostgreSQL store: one guarded DELETE
        gone = remove_terminal(chosen, JobState.DEAD_LETTER)
        return f"purged {len(gone)} dead letter{'s' if len(gone) != 1 else ''} of kind {kind}"
    from jobspool.recovery.prune import _remove
    from jobspool.recovery.scan import entry_of

    victims = [entry_of(j) for j in chosen]
    for start in range(0, len(victims), 256):
        removed, _ = _remove(spool.journal, victims[start:start + 256])
        gone.extend(removed)
    return f"purged {len(gone)} dead letter{'s' if len(gone) != 1 else ''} of kind {kind}"


def _quarantine_restore() -> Callable[..., Any] | None:
    # The quarantine commands own the restore logic (re-check, refuse a duplicate id,
    # bump the directory's generation); the dashboard only calls it.
    module = importlib.import_module("jobspool.recovery.quarantine")
    for name in ("restore_quarantined", "restore"):
        found = getattr(module, name, None)
        if callable(found):
            return found  # type: ignore[no-any-return]
    return None


def can_restore() -> bool:
    """Whether this version has the quarantine restore logic (`jobspool quarantine restore`)."""
    return _quarantine_restore() is not None


def restore(spool: Spool, name: str) -> str:
    """Put a quarantined file back into its state directory (the quarantine module decides)."""
    from jobspool.queue.journal import journal_of
    from jobspool.recovery.quarantine import quarantined_files

    core = journal_of(spool)  # quarantine is a file spool's: another store has none
    if core is None or name not in quarantined_files(core):
        raise ActionError(f"no quarantined file named {name!r}")
    fn = _quarantine_restore()
    if fn is None:
        raise ActionError("this version cannot restore from quarantine")
    try:
        outcome = fn(core, name)
    except (JobspoolError, ValueError, OSError) as exc:
        raise ActionError(f"cannot restore {name}: {exc}") from None
    job_id = getattr(outcome, "id", None)
    state = getattr(getattr(outcome, "state", None), "value", None)
    detail = f" as job {job_id} ({state})" if job_id else ""
    return f"restored {name}{detail}"
