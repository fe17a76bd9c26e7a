"""The job record: an immutable snapshot of one job file, and its codec.

`encode_job` and `decode_job` live side by side; `decode_job` type-checks every
field so that a malformed file is reported (`CorruptJob`), never a crash of the
reader. Validation of caller input (ids, kinds, payload size) lives here too,
so every boundary refuses the same things with the same messages.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from jobspool.errors import CorruptFileWarning, InvalidJob, JobTooLarge
from jobspool.queue.states import JobState

_log = logging.getLogger("jobspool.queue")

FORMAT_VERSION = 1
MAX_JOB_BYTES = 64 * 1024
MAX_ERROR_CHARS = 1024
# A stored traceback keeps its last lines (where it was raised) within this many UTF-8 bytes
# of JSON, so a failure always fits beside the payload (DESIGN §9, sizes).
MAX_TRACEBACK_BYTES = 8 * 1024

JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KIND_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
JOB_ID_PATTERN = "[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
KIND_PATTERN = "[A-Za-z][A-Za-z0-9_]{0,63}"


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The lease as stored inside a leased job's file."""

    token: int
    owner: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class Job:
    """An immutable snapshot of one job file."""

    id: str
    kind: str
    payload: Any
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    revision: int
    created_at: float
    updated_at: float
    run_at: float
    lease: LeaseInfo | None = None
    last_error: str | None = None
    result: Any = None
    reservations: tuple[str, ...] = ()
    rescues: int = 0
    traceback: str | None = None  # the last failed run's, bounded (MAX_TRACEBACK_CHARS)

    @property
    def terminal(self) -> bool:
        return self.state in (JobState.COMPLETED, JobState.DEAD_LETTER, JobState.CANCELED)

    def to_dict(self) -> dict[str, Any]:
        """The job as plain JSON-able data (what `jobspool show --json` prints)."""
        return _to_dict(self)


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's hold on a job: `(job_id, token, owner, expires_at)` plus the job it leased.

    The token is the fencing token: strictly increasing across all claims of
    all jobs of a spool, so any later holder of the same job has a larger one.
    """

    job_id: str
    token: int
    owner: str
    expires_at: float
    job: Job = field(compare=False, repr=False)

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


@dataclass(frozen=True, slots=True)
class Reservation:
    """One producer's hold on a prepared job (two-phase enqueue)."""

    job_id: str
    reservation_id: str
    job: Job = field(compare=False, repr=False)


class CorruptJob(Exception):
    """A job file that cannot be decoded; carries the reason (internal, never escapes a reader)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def report_unreadable(directory: str, job_id: str, reason: str) -> None:
    """Say, without raising, that a reader skipped an unreadable job file.

    Both a log warning (for operators) and a `CorruptFileWarning` (for code
    and tests); the CLI silences the latter since it logs the former.
    """
    message = (f"skipping unreadable job file {directory}/{job_id}.json: {reason} "
               "(`jobspool recover` moves it to quarantine/)")
    _log.warning(message, extra={"job_id": job_id, "state": directory})
    warnings.warn(message, CorruptFileWarning, stacklevel=3)


# ---------------------------------------------------------------- validation


def validate_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or JOB_ID_RE.fullmatch(job_id) is None:
        raise InvalidJob(f"job id {job_id!r} must match {JOB_ID_PATTERN}", field="job_id")
    return job_id


def validate_kind(kind: object) -> str:
    if not isinstance(kind, str) or KIND_RE.fullmatch(kind) is None:
        raise InvalidJob(f"kind {kind!r} must match {KIND_PATTERN}", field="kind")
    return kind


def validate_int(name: str, value: object, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{name} must be an integer, got {value!r}", field=name)
    if minimum is not None and value < minimum:
        raise InvalidJob(f"{name} must be >= {minimum}, got {value!r}", field=name)
    return value


def validate_seconds(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(f"{name} must be a number of seconds, got {value!r}", field=name)
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        need = "a positive" if positive else "a non-negative"
        raise InvalidJob(f"{name} must be {need} finite number, got {value!r}", field=name)
    return v


def clip_error(error: object) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


# ---------------------------------------------------------------- ids

_id_lock = threading.Lock()
_last_ms = 0
_seq = 0
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_job_id() -> str:
    """A ULID-like id: 48-bit ms timestamp + 80 random bits, monotonic within a process.

    Lexicographic order is creation order across processes to the millisecond,
    and strictly so within one process, so FIFO needs no file reads.
    """
    global _last_ms, _seq
    with _id_lock:
        ms = int(time.time() * 1000)
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
        else:
            _last_ms = ms
            _seq = int.from_bytes(os.urandom(5), "big") >> 1  # room to count up
        rand = (_seq << 40) | int.from_bytes(os.urandom(5), "big")
    value = (ms << 80) | (rand & ((1 << 80) - 1))
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_token_id() -> str:
    return os.urandom(8).hex()


# ---------------------------------------------------------------- codec


def _to_dict(job: Job) -> dict[str, Any]:
    d: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "id": job.id,
        "kind": job.kind,
        "payload": job.payload,
        "state": job.state.value,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "revision": job.revision,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "run_at": job.run_at,
        "lease": None
        if job.lease is None
        else {"token": job.lease.token, "owner": job.lease.owner, "expires_at": job.lease.expires_at},
        "last_error": job.last_error,
        "result": job.result,
        "reservations": list(job.reservations),
        "rescues": job.rescues,
    }
    if job.traceback is not None:
        d["traceback"] = job.traceback  # absent when None: older readers never see the key
    return d


def encode_job(job: Job, *, max_bytes: int = MAX_JOB_BYTES) -> bytes:
    """Serialize a job; refuse one over `max_bytes` or with non-JSON data (nothing written)."""
    try:
        data = orjson.dumps(_to_dict(job))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidJob(f"job {job.id!r} is not JSON-serializable: {exc}", field="payload") from None
    if len(data) > max_bytes:
        raise JobTooLarge(
            f"job {job.id!r} (payload and result included) is {len(data)} bytes serialized, "
            f"over max_job_bytes={max_bytes}",
            size=len(data),
            limit=max_bytes,
        )
    return data


def _need(d: dict[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise CorruptJob(f"missing field {key!r}")
    value = d[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise CorruptJob(f"field {key!r} has type bool")
    if not isinstance(value, types):
        raise CorruptJob(f"field {key!r} has type {type(value).__name__}")
    return value


_NUM = (int, float)


def decode_job(data: bytes, *, expect_id: str | None = None,
               expect_state: JobState | None = None) -> Job:
    """Parse and type-check a job file; raise `CorruptJob` with the reason otherwise."""
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CorruptJob(f"bad JSON: {exc}") from None
    if not isinstance(d, dict):
        raise CorruptJob("not a JSON object")
    version = d.get("v", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise CorruptJob(f"unknown job format version {version!r}")
    job_id = _need(d, "id", str)
    if JOB_ID_RE.fullmatch(job_id) is None:
        raise CorruptJob(f"invalid id {job_id!r}")
    if expect_id is not None and job_id != expect_id:
        raise CorruptJob(f"id {job_id!r} does not match file name {expect_id!r}")
    kind = _need(d, "kind", str)
    if KIND_RE.fullmatch(kind) is None:
        raise CorruptJob(f"invalid kind {kind!r}")
    state_name = _need(d, "state", str)
    try:
        state = JobState(state_name)
    except ValueError:
        raise CorruptJob(f"unknown state {state_name!r}") from None
    if expect_state is not None and state is not expect_state:
        raise CorruptJob(f"state {state_name!r} does not match directory {expect_state.value!r}")
    lease_raw = d.get("lease")
    lease: LeaseInfo | None = None
    if lease_raw is not None:
        if not isinstance(lease_raw, dict):
            raise CorruptJob("field 'lease' is not an object")
        lease = LeaseInfo(
            token=_need(lease_raw, "token", int),
            owner=_need(lease_raw, "owner", str),
            expires_at=float(_need(lease_raw, "expires_at", _NUM)),
        )
    if state is JobState.LEASED and lease is None:
        raise CorruptJob("leased job without a lease")
    last_error = d.get("last_error")
    if last_error is not None and not isinstance(last_error, str):
        raise CorruptJob("field 'last_error' is not a string")
    reservations = d.get("reservations", [])
    if not isinstance(reservations, list) or not all(isinstance(r, str) for r in reservations):
        raise CorruptJob("field 'reservations' is not a list of strings")
    rescues = d.get("rescues", 0)
    if isinstance(rescues, bool) or not isinstance(rescues, int):
        raise CorruptJob("field 'rescues' is not an integer")
    tb = d.get("traceback")
    if tb is not None and not isinstance(tb, str):
        raise CorruptJob("field 'traceback' is not a string")
    return Job(
        id=job_id,
        kind=kind,
        payload=d.get("payload"),
        state=state,
        priority=_need(d, "priority", int),
        attempts=_need(d, "attempts", int),
        max_attempts=_need(d, "max_attempts", int),
        revision=_need(d, "revision", int),
        created_at=float(_need(d, "created_at", _NUM)),
        updated_at=float(_need(d, "updated_at", _NUM)),
        run_at=float(_need(d, "run_at", _NUM)),
        lease=lease,
        last_error=last_error,
        result=d.get("result"),
        reservations=tuple(reservations),
        rescues=rescues,
        traceback=tb,
    )


def evolve(job: Job, **changes: Any) -> Job:
    """A copy of `job` with `changes` applied (the one way the state machine builds jobs)."""
    return replace(job, **changes)
