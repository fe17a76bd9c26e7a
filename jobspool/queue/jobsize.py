"""How large a job may grow, on both stores (DESIGN §9 "Sizes"): admission keeps room for
what later transitions add, a completion's result is checked against the limit, and the
transitions that add free text (errors, tracebacks) cut it to fit."""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import replace
from typing import Any

import orjson

from jobspool.errors import InvalidJob, JobTooLarge
from jobspool.queue.job import MAX_OWNER_CHARS, Job, encode_job

_log = logging.getLogger("jobspool.queue")

# A job must stay writable through its whole life (DESIGN §9 "Sizes"): a claim adds a
# lease, a failure an error (and a traceback), a crash a rescue count. New jobs are
# therefore admitted only up to `max_job_bytes` less a reserve for those additions, and
# the transitions that add free text (errors, tracebacks) cut it to fit what is left.

_TEXT_FIELDS = ("traceback", "last_error")


def transition_reserve(max_bytes: int) -> int:
    """Bytes kept free at admission for what later transitions add (a lease with an owner
    of up to `MAX_OWNER_CHARS`, counters, a short error)."""
    return min(2048, max_bytes // 4)


def admission_limit(max_bytes: int) -> int:
    """The largest serialized size `enqueue`/`prepare` accept under `max_job_bytes`."""
    return max_bytes - transition_reserve(max_bytes)


def encode_admitted(job: Job, *, max_bytes: int) -> bytes:
    """Encode a new job, refusing it (`JobTooLarge`) unless it leaves the transition reserve."""
    limit = admission_limit(max_bytes)
    try:
        return encode_job(job, max_bytes=limit)
    except JobTooLarge as exc:
        raise JobTooLarge(
            f"job {job.id!r} is {exc.size} bytes serialized, over the {limit} bytes a new job "
            f"may use (max_job_bytes={max_bytes}, less {max_bytes - limit} kept for the lease, "
            "errors and counters its later transitions add)", size=exc.size, limit=limit,
        ) from None


def encode_completed(job: Job, *, max_bytes: int) -> bytes:
    """A completed job's file: `JobTooLarge` when its result does not fit, `InvalidJob`
    naming the result when it is not JSON (the only new data a completion brings).

    A job admitted under a looser limit (an older `max_job_bytes`, a migrated spool) is
    over the limit before any result: it gets the room a new job keeps for its
    transitions on top of its own size, instead of having every result refused."""
    try:
        return encode_job(job, max_bytes=max_bytes)
    except JobTooLarge as exc:
        base = len(encode_job(replace(job, result=None), max_bytes=sys.maxsize))
        if base <= admission_limit(max_bytes) or exc.size > base + transition_reserve(max_bytes):
            raise
        return encode_job(job, max_bytes=exc.size)
    except InvalidJob as exc:
        raise InvalidJob(f"result of job {job.id!r} is not JSON-serializable: "
                         f"{exc.message.rpartition(': ')[2]}", field="result") from None


def fitted_anyway(job: Job, *, max_bytes: int) -> tuple[Job, bytes]:
    """`fitted` for a transition the spool itself makes (claim, fail, release, reclaim...):
    never refused for its size. Only a job admitted under an older, looser rule can still
    be over once its texts are cut: it is written whole (logged), because refusing would
    wedge it, leased, and run it again at every expiry."""
    try:
        return fitted(job, max_bytes=max_bytes)
    except JobTooLarge as exc:
        _log.warning("job %s is %d bytes serialized, over max_job_bytes=%d; written anyway "
                     "so that it can move on", job.id, exc.size, max_bytes,
                     extra={"job_id": job.id})
        return job, encode_job(job, max_bytes=sys.maxsize)


def fitted(job: Job, *, max_bytes: int) -> tuple[Job, bytes]:
    """Encode a job, cutting its stored error and traceback until it fits `max_bytes`;
    the job as cut comes back too (a store keeping columns, not files, writes that job:
    the same texts a file spool would keep). Raises `JobTooLarge` only when the job is
    too large without any of that text (a result that does not fit, or a job admitted
    under an older, looser rule)."""
    try:
        return job, encode_job(job, max_bytes=max_bytes)
    except JobTooLarge as exc:
        over = exc.size - max_bytes
    for _ in range(8):
        texts: list[tuple[str, str]] = []
        for f in _TEXT_FIELDS:
            t = getattr(job, f, None)
            if isinstance(t, str) and t:
                texts.append((f, t))
        if not texts:
            break
        name, text = texts[0]
        # Cut by characters, `over` counts bytes: an emoji is 4 of them encoded, a control
        # character 6 (\u0001). Counting one byte per character cut such a text to nothing
        # (a dead letter with an empty error). A traceback keeps its tail (the raising
        # frame), an error its head.
        per_char = max(1.0, (len(orjson.dumps(text)) - 2) / len(text))
        keep = max(0, len(text) - math.ceil(over / per_char) - 16)
        cut: str | None
        if name == "traceback":
            cut = "...\n" + text[len(text) - keep:] if keep else None
        else:
            cut = text[:keep] + "..." if keep else ""
        changes: dict[str, Any] = {name: cut}
        job = replace(job, **changes)
        try:
            return job, encode_job(job, max_bytes=max_bytes)
        except JobTooLarge as exc:
            over = exc.size - max_bytes
    return job, encode_job(job, max_bytes=max_bytes)


__all__ = ["MAX_OWNER_CHARS", "admission_limit", "encode_admitted", "encode_completed",
           "fitted", "fitted_anyway", "transition_reserve"]
