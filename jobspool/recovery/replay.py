"""Replay of prepared jobs whose producer may have died between `prepare` and `commit`.

A prepared job older than `prepare_grace_seconds` (by `updated_at`) is put to
its kind's replay hook, `hook(job) -> "committed" | "aborted" | "unknown"`:
did the primary mutation the job stands for happen? `"committed"` publishes
the job (ready), `"aborted"` cancels it, and `"unknown"` — or an exception,
or any other answer — leaves it prepared with the attempt counted, and
dead-letters it once `max_attempts` is reached. A kind without a hook is
reported and left alone.

The hook runs *outside* the spool lock (it may query a database for seconds)
and its verdict is applied under the lock only if the job is still the very
snapshot the hook saw (same revision): a producer that committed or aborted
meanwhile wins, and the verdict is dropped. An "unknown" verdict renews
`updated_at`, so the next recovery asks again only after another grace
period: the grace doubles as the retry interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from jobspool.queue.job import Job, clip_error

log = logging.getLogger(__name__)

ReplayHook = Callable[[Job], str]
ReplayHooks = ReplayHook | Mapping[str, ReplayHook]
Outcome = Literal["committed", "aborted", "unknown"]
OUTCOMES: frozenset[str] = frozenset({"committed", "aborted", "unknown"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a hook said about one job (`error` is set for "unknown")."""

    job: Job
    outcome: Outcome
    error: str | None = None


def hook_for(replay: ReplayHooks | None, kind: str) -> ReplayHook | None:
    """The hook that decides for `kind`: a mapping's entry, or the one callable for all kinds."""
    if replay is None:
        return None
    if isinstance(replay, Mapping):
        return replay.get(kind)
    return replay


def ask(hook: ReplayHook, job: Job) -> Verdict:
    """Run one hook; an exception or an answer outside OUTCOMES counts as "unknown"."""
    try:
        answer = hook(job)
    except Exception as exc:  # the hook is user code: any failure means "we don't know"
        log.warning("replay hook for job %s (%s) raised: %r", job.id, job.kind, exc)
        return Verdict(job, "unknown", clip_error(f"replay hook raised {exc!r}"))
    if answer == "committed":
        return Verdict(job, "committed")
    if answer == "aborted":
        return Verdict(job, "aborted")
    if answer == "unknown":
        return Verdict(job, "unknown", "replay hook said unknown")
    log.warning("replay hook for job %s (%s) returned %r, not one of %s", job.id, job.kind,
                answer, sorted(OUTCOMES))
    return Verdict(job, "unknown", clip_error(f"replay hook returned {answer!r}"))
