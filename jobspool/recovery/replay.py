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

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobspool.errors import InvalidType
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


def check_hooks(replay: object) -> None:
    """Refuse (`InvalidType`, one line) replay hooks that are not a callable or a mapping of
    kind -> callable: each recovery counted the TypeError as an "unknown" verdict, and the
    prepared jobs were dead-lettered for a typo (`App(replay=...)` refused it already)."""
    if replay is None or callable(replay):
        return
    if isinstance(replay, Mapping):
        for kind, hook in replay.items():
            if not isinstance(kind, str) or not callable(hook):
                raise InvalidType(f"replay hook for {kind!r} must be a callable (job -> "
                                  f"'committed' | 'aborted' | 'unknown'), got {hook!r:.80}",
                                  field="replay")
        return
    raise InvalidType(f"replay must be a callable or a mapping of kind -> callable, got "
                      f"{type(replay).__name__} {replay!r:.80}", field="replay")


def hook_for(replay: ReplayHooks | None, kind: str) -> ReplayHook | None:
    """The hook that decides for `kind`: a mapping's entry, or the one callable for all kinds."""
    if replay is None:
        return None
    if isinstance(replay, Mapping):
        return replay.get(kind)
    return replay


def ask(hook: ReplayHook, job: Job) -> Verdict:
    """Run one hook (awaited when it is a coroutine function); whatever goes wrong in it —
    an exception, SystemExit included, an answer outside OUTCOMES, an answer that cannot
    even be compared or shown — counts as "unknown": one hook never stops recovery."""
    try:
        answer = hook(job)
        if answer is not None and inspect.isawaitable(answer):
            answer = _await(answer)
        verdict = next((o for o in OUTCOMES if isinstance(answer, str) and answer == o), None)
    except KeyboardInterrupt:
        raise  # Ctrl-C stops recovery, as it stops any command
    except BaseException as exc:  # user code: any failure means "we don't know"
        said = _shown(exc)
        log.warning("replay hook for job %s (%s) raised: %s", job.id, job.kind, said)
        return Verdict(job, "unknown", clip_error(f"replay hook raised {said}"))
    if verdict == "committed":
        return Verdict(job, "committed")
    if verdict == "aborted":
        return Verdict(job, "aborted")
    if verdict == "unknown":
        return Verdict(job, "unknown", "replay hook said unknown")
    said = _shown(answer)
    log.warning("replay hook for job %s (%s) returned %s, not one of %s", job.id, job.kind,
                said, sorted(OUTCOMES))
    return Verdict(job, "unknown", clip_error(f"replay hook returned {said}"))


def _await(awaitable: Any) -> Any:
    """An async hook's answer: run on a loop of its own (in a thread when this thread
    already runs one, e.g. `recover` called from async code)."""
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


# A hook's exception or answer, as logged: a 200,000-character message was logged whole,
# once per job and recovery (the job's own error is clipped by `clip_error`).
_SHOWN_CHARS = 1000


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that raises must not take recovery down with it
        return f"<{type(value).__name__} whose repr() failed>"
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[:_SHOWN_CHARS]}... ({len(text) - _SHOWN_CHARS} characters cut)"
