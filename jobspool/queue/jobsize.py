"""How large a job may grow, on both stores (DESIGN §9 "Sizes"): admission keeps room for
what later transitions add, a completion's result is checked against the limit, and the
transitions that add free text (errors, tracebacks) cut it to fit."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import orjson

from jobspool.errors import InvalidJob, JobTooLarge
from jobspool.queue.job import MAX_OWNER_CHARS, MAX_TRACEBACK_BYTES, Job, encode_job, storable_text

_log = logging.getLogger("jobspool.queue")

# A job must stay writable through its whole life (DESIGN §9 "Sizes"): a claim adds a
# lease, a failure an error (and a traceback), a crash a rescue count. New jobs are
# therefore admitted only up to `max_job_bytes` less a reserve for those additions, and
# the transitions that add free text (errors, tracebacks) cut it to fit what is left.

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


def encode_completed(job: Job, *, max_bytes: int) -> tuple[Job, bytes]:
    """A completed job as written, and its bytes: `JobTooLarge` when its result does not
    fit, `InvalidJob` naming the result when it is not JSON (the only new data a
    completion brings).

    An earlier run's error and traceback give way to the result: they are cut (`fitted`)
    before a result is refused. Kept whole, a job admitted near the limit that had failed
    once completed over `max_job_bytes` (the looser rule below took it for an old job).
    A job admitted under a looser limit (an older `max_job_bytes`, a migrated spool) is
    over the limit without any such text: it gets the room a new job keeps for its
    transitions on top of its own size, instead of having every result refused."""
    try:
        return fitted(job, max_bytes=max_bytes)
    except JobTooLarge as exc:
        bare = replace(job, traceback=None, last_error=None if job.last_error is None else "")
        base = len(encode_job(replace(bare, result=None), max_bytes=sys.maxsize))
        if base <= admission_limit(max_bytes) or exc.size > base + transition_reserve(max_bytes):
            raise
        return bare, encode_job(bare, max_bytes=exc.size)
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
    error, tb = job.last_error or "", job.traceback or ""
    # The room the two texts may share, split evenly unless one needs less than its half.
    # (Cut whole, the traceback first, a job near the limit kept its error and no trace of
    # where it was raised.)
    room = _text_bytes(error) + _text_bytes(tb) - over - 16
    while room > 0:
        tb_room = room - min(_text_bytes(error), room // 2)
        kept_tb = clip_traceback(tb, tb_room) if tb and tb_room >= _MIN_TRACEBACK else None
        error_room = room - (_text_bytes(kept_tb) if kept_tb else 0)
        cut = replace(job, traceback=kept_tb, last_error=None if job.last_error is None
                      else _head(error, error_room))
        try:
            return cut, encode_job(cut, max_bytes=max_bytes)
        except JobTooLarge as exc:
            room -= exc.size - max_bytes + 16  # escapes and markers the estimate missed
    bare = replace(job, traceback=None, last_error=None if job.last_error is None else "")
    return bare, encode_job(bare, max_bytes=max_bytes)


# A traceback given less room than this is dropped: its start and end would say nothing.
_MIN_TRACEBACK = 256


def _text_bytes(text: str) -> int:
    return len(orjson.dumps(text)) - 2


def _head(text: str, max_bytes: int) -> str:
    """The start of an error within `max_bytes` of JSON, marked as cut."""
    if _text_bytes(text) <= max_bytes:
        return text
    if max_bytes <= 3:
        return ""
    # Cut by characters, budgets count bytes: an emoji is 4 of them encoded, a control
    # character 6 (\u0001). Counting one byte per character cut such a text to nothing.
    per_char = max(1.0, _text_bytes(text) / len(text))
    keep = int((max_bytes - 3) / per_char)
    while keep > 0 and _text_bytes(text[:keep]) > max_bytes - 3:
        keep = keep * 9 // 10
    return text[:keep] + "..." if keep else ""


def clip_traceback(text: str | None, max_bytes: int = MAX_TRACEBACK_BYTES) -> str | None:
    """Keep a traceback's start (its frames) and end (where and what was raised) within
    `max_bytes` of JSON (at least 128 characters' worth), cutting the middle."""
    if text is None:
        return None
    text = storable_text(text)
    # JSON escapes newlines and quotes, so measure the escaped form, not the characters.
    if _text_bytes(text) + 2 <= max_bytes:
        return text
    # Half each side: a long exception message (at the end) took the whole budget when
    # only the end was kept, and no frame was left to say where it came from.
    keep = max_bytes  # characters: at least as many bytes once escaped
    while True:
        head = text[:keep // 2]
        if "\n" in head[len(head) // 2:]:
            head = head[:head.rindex("\n") + 1]  # whole lines at the cut
        tail = text[len(text) - keep // 2:]
        cut = len(text) - len(head) - len(tail)
        clipped = f"{head}... ({cut} characters cut) ...\n{tail}"
        size = len(orjson.dumps(clipped))
        if size <= max_bytes or keep <= 128:
            return clipped
        keep = max(128, min(keep - 32, keep * max_bytes // size))


__all__ = [
    "MAX_OWNER_CHARS",
    "admission_limit",
    "clip_traceback",
    "encode_admitted",
    "encode_completed",
    "fitted",
    "fitted_anyway",
    "transition_reserve",
]
