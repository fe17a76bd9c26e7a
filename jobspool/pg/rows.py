"""A job row and a `Job` snapshot, each made from the other.

Payloads and results are stored as `json` (not `jsonb`): the text round-trips
exactly (key order, NUL characters) and needs no conversion on insert. They
are sent and read as text and parsed with orjson, bypassing the driver's
slower json adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from jobspool.errors import UnreadableJob
from jobspool.queue.job import (
    JOB_ID_RE,
    KIND_RE,
    Job,
    implausible,
    new_job_snapshot,
    new_lease_info,
)
from jobspool.queue.payload import MAX_JSON_DEPTH, MAX_RUN_AT, nested_deeper_than
from jobspool.queue.states import JobState

COLUMNS = ("id, kind, state, priority, attempts, max_attempts, revision, created_at, "
           "updated_at, run_at, token, owner, expires_at, proc, payload::text, result::text, "
           "last_error, traceback, reservations, rescues, timeout")

# The same list qualified by the table alias `j` (statements that join other relations).
J_COLUMNS = ", ".join(f"j.{c.strip()}" for c in COLUMNS.split(","))
# Where a row of COLUMNS holds the lease token.
TOKEN_INDEX = [c.strip() for c in COLUMNS.split(",")].index("token")

WRITE_COLUMNS = ("kind", "state", "priority", "attempts", "max_attempts", "revision",
                 "created_at", "updated_at", "run_at", "token", "owner", "expires_at", "proc",
                 "payload", "result", "last_error", "traceback", "reservations", "rescues",
                 "timeout")


def text(value: str | None) -> str | None:
    """A string for a `text` column, which cannot hold NUL: shown as the escape `\\x00`
    (an error or traceback is for people to read; payloads and results, stored as JSON,
    keep NUL exactly)."""
    return value.replace("\x00", "\\x00") if value is not None and "\x00" in value else value


def dump(value: Any) -> str | None:
    """JSON text for a `json` column (None stays SQL NULL only for a missing result)."""
    return orjson.dumps(value).decode()


_STATES = {s.value: s for s in JobState}


def to_job(row: Sequence[Any]) -> Job:
    """The job a row holds; `UnreadableJob` naming it when the row holds what jobspool
    never writes (a hand edit): JSON its parser refuses (`1e999`, integers past 64 bits),
    or values out of range (a NaN time, a negative time limit, negative attempts)."""
    try:
        job = _decode(row)
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        raise UnreadableJob(f"job {row[0]!r}: its row cannot be read ({exc}); fix or delete "
                            "it by hand") from None
    why = implausible(job) or _out_of_range(job)
    if why is not None:
        raise UnreadableJob(f"job {row[0]!r}: its row cannot be read ({why}); fix or delete "
                            "it by hand")
    return job


def _out_of_range(job: Job) -> str | None:
    """What the schema lets a hand write that no transition does (the file store's decoder
    refuses the same in a file: `queue/job.py` `_time`, `_timeout`, the id and kind
    rules). A kind such as `a/b` was claimed, run, shown and canceled by its id on
    PostgreSQL, and an unreadable file on the file store."""
    if JOB_ID_RE.fullmatch(job.id) is None:
        return f"its id {job.id!r} breaks the naming rules"
    if KIND_RE.fullmatch(job.kind) is None:
        return f"its kind {job.kind!r} breaks the naming rules"
    for name in ("created_at", "updated_at", "run_at"):
        value = getattr(job, name)
        if not -MAX_RUN_AT <= value <= MAX_RUN_AT:  # NaN fails too
            return f"{name} is not a time jobspool writes: {value!r}"
    if job.timeout is not None and not 0 < job.timeout < float("inf"):
        return f"timeout is {job.timeout!r} (a positive number of seconds)"
    if job.lease is not None and not -MAX_RUN_AT <= job.lease.expires_at <= MAX_RUN_AT:
        return f"expires_at is not a time jobspool writes: {job.lease.expires_at!r}"
    return None


def _decode(row: Sequence[Any]) -> Job:
    (jid, kind, state, priority, attempts, max_attempts, revision, created_at, updated_at,
     run_at, token, owner, expires_at, proc, payload, result, last_error, traceback,
     reservations, rescues, timeout) = row
    for name, text in (("payload", payload), ("result", result)):
        # As the file store's reader: what no transition could write back is unreadable.
        if text is not None and nested_deeper_than(text, lambda t=text: orjson.loads(t),
                                                   MAX_JSON_DEPTH):
            raise ValueError(f"its {name} is nested deeper than {MAX_JSON_DEPTH} levels, "
                             "which jobspool cannot write back")
    st = _STATES[state]  # a dict lookup: `JobState(state)` goes through Enum.__call__
    # `Job(...)` and `LeaseInfo(...)` as built without the frozen `__init__` (job.py).
    lease = (new_lease_info(token=int(token), owner=owner or "", expires_at=float(expires_at),
                            proc=proc)
             if st is JobState.LEASED and token is not None and expires_at is not None else None)
    return new_job_snapshot(
        id=jid, kind=kind, payload=None if payload is None else orjson.loads(payload),
        state=st, priority=priority, attempts=attempts, max_attempts=max_attempts,
        revision=int(revision), created_at=created_at, updated_at=updated_at,
        run_at=run_at, lease=lease, last_error=last_error,
        result=None if result is None else orjson.loads(result),
        reservations=tuple(reservations or ()), rescues=rescues, traceback=traceback,
        timeout=timeout)


def write_values(job: Job, token: int | None = None) -> list[Any]:
    """The values of `WRITE_COLUMNS` for `job`; `token` keeps the last lease's token on a
    job that is no longer leased (a repeated settle recognizes its own work by it)."""
    lease = job.lease
    return [job.kind, job.state.value, job.priority, job.attempts, job.max_attempts,
            job.revision, job.created_at, job.updated_at, job.run_at,
            lease.token if lease is not None else token,
            lease.owner if lease is not None else None,
            lease.expires_at if lease is not None else None,
            lease.proc if lease is not None else None,
            dump(job.payload), None if job.result is None else dump(job.result),
            text(job.last_error), text(job.traceback), list(job.reservations), job.rescues,
            job.timeout]


UPDATE_SQL = ("UPDATE jobspool_jobs SET "
              + ", ".join(f"{c} = %s" + ("::json" if c in ("payload", "result") else "")
                          for c in WRITE_COLUMNS)
              + " WHERE id = %s AND revision = %s")

INSERT_SQL = ("INSERT INTO jobspool_jobs (id, " + ", ".join(WRITE_COLUMNS) + ") VALUES (%s, "
              + ", ".join("%s::json" if c in ("payload", "result") else "%s"
                          for c in WRITE_COLUMNS)
              + ") ON CONFLICT (id) DO NOTHING")
