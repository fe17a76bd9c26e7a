"""The error tree of jobspool: one root, a shallow hierarchy, every class picklable.

Handler control-flow signals (`Retry`, `Fail`) are not faults and live in
`jobspool.queue.signals`, apart from this tree.
"""

from __future__ import annotations

import errno as _errno
import re

# What a full disk or quota answers a write with (WriteFailed.disk_full).
FULL_DISK = frozenset({_errno.ENOSPC, _errno.EDQUOT})


class JobspoolError(Exception):
    """Raised when jobspool refuses an operation or finds its spool unusable (the root)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[JobspoolError], message: str, state: dict[str, object]) -> JobspoolError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class InvalidJob(JobspoolError, ValueError):
    """Raised when a job's kind, id, payload or options are malformed; nothing is written."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidType(InvalidJob, TypeError):
    """Raised when an argument is the wrong kind of object (a job id where a `Lease`
    belongs, a str where a list of payloads does): an `InvalidJob`, and a `TypeError`
    as Python's own checks would raise."""


class JobTooLarge(InvalidJob):
    """Raised when a serialized job (or a stored result) exceeds `max_job_bytes`."""

    def __init__(self, message: str, *, size: int = 0, limit: int = 0,
                 field: str = "payload") -> None:
        super().__init__(message, field=field)
        self.size = size
        self.limit = limit


class JobNotFound(JobspoolError):
    """Raised when no job with the given id exists in any state directory."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class JobPruned(JobNotFound):
    """Raised by `wait` when a job it had seen unfinished is gone at its next look: it
    finished and retention pruned it (or it was removed) before its outcome was read. A
    `JobNotFound` too."""

    def __init__(self, job_id: str) -> None:
        JobspoolError.__init__(
            self, f"job {job_id!r} is gone: it finished and was pruned by retention (or was "
                  "removed) before wait read its outcome; keep finished jobs longer "
                  "(keep_terminal, keep_terminal_seconds) to read it")
        self.job_id = job_id


class DuplicateJob(JobspoolError):
    """Raised when enqueue finds the job id taken and its `on_conflict` policy refuses it."""

    def __init__(self, job_id: str, state: str | None, reason: str = "") -> None:
        # `state` None: the id is not in the spool, but given twice in one batch.
        where = f"already exists (state {state!r})" if state is not None else "is given twice"
        super().__init__(f"job {job_id!r} {where}" + (f": {reason}" if reason else ""))
        self.job_id = job_id
        self.state = state


class JobFailed(JobspoolError):
    """Raised when a caller awaiting a job's result finds it dead-lettered or canceled."""

    def __init__(self, job_id: str, state: str, last_error: str | None = None) -> None:
        super().__init__(f"job {job_id!r} ended {state}"
                         + (f": {last_error}" if last_error else ""))
        self.job_id = job_id
        self.state = state
        self.last_error = last_error


class ConfigError(JobspoolError):
    """Raised when a Spool, Worker or App option is invalid (at construction, before any work)."""


class AppError(ConfigError):
    """Raised when `--app MODULE:ATTR` cannot be imported or names no handlers."""


class ScheduleError(ConfigError):
    """Raised when a `Schedule` is malformed (bad cron, interval, catch-up) or has no handler."""


class LeaseLost(JobspoolError):
    """Raised when a lease holder acts on a job it no longer holds (expired, taken, canceled)."""

    def __init__(self, job_id: str, token: int, reason: str) -> None:
        super().__init__(f"lease on job {job_id!r} (token {token}) lost: {reason}")
        self.job_id = job_id
        self.token = token
        self.reason = reason


class FencedBlockBusy(JobspoolError, RuntimeError):
    """Raised by `ctx.fenced()` in an async handler while another async handler's fenced
    block is open on the same event loop's thread: that handler awaited inside its block
    (which it must not), and this block cannot wait for it there without stopping the
    loop. The worker gives this run back uncounted (it runs again once the block is over)
    and fails the handler that awaited inside its block."""

    def __init__(self, job_id: str, open_for: str) -> None:
        super().__init__(f"ctx.fenced() for job {job_id!r}: the fenced block of job "
                         f"{open_for!r} is open on this event loop's thread (its handler "
                         "awaited inside it); this run is given back, to run again after it")
        self.job_id = job_id
        self.open_for = open_for


class HoldCut(JobspoolError):
    """Raised when a thread steps on inside a fenced block its worker ended: the handler ran
    past its time limit and was abandoned (a sync thread cannot be stopped), so nothing more
    it does in the block is written (the file spool; PostgreSQL ends the block's transaction)."""

    def __init__(self, message: str = "this thread's fenced block was ended by its worker: "
                 "its handler ran past its time limit and was abandoned; nothing more it "
                 "does in the block is written") -> None:
        super().__init__(message)


class InvalidTransition(JobspoolError):
    """Raised when a job's current state does not allow the requested change."""

    def __init__(self, job_id: str, state: str, action: str, message: str | None = None) -> None:
        super().__init__(message or f"cannot {action} job {job_id!r} in state {state!r}")
        self.job_id = job_id
        self.state = state
        self.action = action


class SpoolError(JobspoolError):
    """Raised when the spool directory is missing, unsafe, unwritable or of an unknown format."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class InvalidRoot(SpoolError, ConfigError):
    """Raised when a spool root is given malformed: a URL or a libpq string this store
    cannot serve, whitespace around it. Bad input (the CLI exits 1), yet a `SpoolError`
    as it always was for callers of `Spool()`."""


class UnreadableJob(SpoolError):
    """Raised when a job's file is there but cannot be read: damaged (`recover` moves it to
    quarantine/), or not readable by this user. Listings skip such a file with a warning."""


class StoreUnavailable(SpoolError):
    """Raised when the store cannot be reached for now (a PostgreSQL server down,
    restarting or unreachable), as opposed to refusing: it may come back, and a worker
    waits for it (backing off, for as long as it takes) instead of giving up.
    `down_for`: seconds it had been unreachable already (retried meanwhile), when known."""

    down_for: float = 0.0


class SpoolClosed(SpoolError):
    """Raised when a `Spool` is used after `close()` (a worker gives up on it at once)."""

    def __init__(self, root: object) -> None:
        super().__init__(f"spool {root} was closed; open a new Spool to use it", path=str(root))


class WriteFailed(SpoolError):
    """Raised when the disk refused a write (full, I/O error, read-only) part-way through a change.

    `errno` is the operating system's error number; `landed` names the jobs whose
    new state reached the disk anyway (the write failed after publishing them), so
    a caller can adopt those instead of redoing them. Nothing else changed.
    """

    def __init__(self, message: str, *, path: str | None = None, errno: int | None = None,
                 landed: frozenset[str] = frozenset()) -> None:
        super().__init__(message, path=path)
        self.errno = errno
        self.landed = landed

    @property
    def disk_full(self) -> bool:
        """No space, no inodes or no quota left: a condition that passes when space is freed
        (a worker waits it out), unlike an I/O error or a read-only filesystem."""
        return self.errno in FULL_DISK


class Backpressure(JobspoolError):
    """Raised when enqueue is refused because the backlog is over a configured limit (retryable)."""

    def __init__(self, message: str, *, limit: str = "", value: float = 0.0) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class ProjectionError(JobspoolError):
    """Raised when a projection write is malformed (a permanent, per-job failure)."""

    def __init__(self, message: str, *, table: str = "", field: str | None = None) -> None:
        # One line, whatever it quotes (a 2-D array's repr, Arrow's own message): it is the
        # job's last_error and a log line.
        super().__init__(" ".join(message.split()) if "\n" in message else message)
        self.table = table
        self.field = field


class ProjectionUnusable(ProjectionError):
    """Raised when a projection cannot be used as configured: its URI or storage options are
    refused before any I/O (an `az://` URI without an account, an option that does not
    parse), or its endpoint would lose commits. No job's fault: a worker stops, none charged."""


class ConditionalPutUnsupported(ProjectionUnusable):
    """Raised when an s3:// endpoint overwrites on a create-only PUT: LanceDB commits would be lost."""


class ObjectStoreUnreachable(ProjectionError):
    """Raised when the conditional-PUT probe cannot reach an s3:// endpoint (checked again on next use)."""


class WaitTimeout(JobspoolError, TimeoutError):
    """Raised when `Spool.wait` gives up before the job reached a terminal state."""

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(f"job {job_id!r} did not finish within {timeout} s")
        self.job_id = job_id
        self.timeout = timeout


class TimeLimitExceeded(JobspoolError):
    """Raised (as a run's failure) when a handler ran past its kind's `timeout`."""

    def __init__(self, job_id: str, kind: str, timeout: float, detail: str = "") -> None:
        super().__init__(f"job {job_id!r} ({kind}) ran past its time limit of {timeout:g} s"
                         + (f"; {detail}" if detail else ""))
        self.job_id = job_id
        self.kind = kind
        self.timeout = timeout


class PolicyError(ConfigError, ValueError):
    """Raised when a per-kind `Policy` or a policies mapping is malformed (at start-up)."""


class RunningLoopError(JobspoolError, RuntimeError):
    """Raised when a blocking entry point (`Worker.run_until_idle`) is called inside a running
    event loop, where its async form must be awaited instead."""


class WorkerCrashed(JobspoolError):
    """Raised when the worker's own machinery failed repeatedly in a short time."""


class WorkerSpoolClosed(WorkerCrashed, SpoolClosed):
    """Raised when a worker stops because its spool was closed under it: both a
    `WorkerCrashed` and a `SpoolClosed`, so `except SpoolClosed` catches it too."""

    def __init__(self, closed: SpoolClosed) -> None:
        JobspoolError.__init__(self, f"worker stopped: {closed}")
        self.path = getattr(closed, "path", None)


class PoolFailed(JobspoolError):
    """Raised when the pool's worker processes keep dying right after they start."""


class NotQuarantined(JobspoolError):
    """Raised when a name given to a quarantine command matches no quarantined file."""

    def __init__(self, ident: str, matches: int = 0, *, short_prefix: bool = False) -> None:
        # Several matching is not "no file": it said "no quarantined file 'x': 3 files match".
        what = (f"{matches} quarantined files match {ident!r}; give more of the name"
                if matches > 1 else f"no quarantined file {ident!r}")
        if short_prefix:  # it starts names, but stops inside their time: maybe a job's id
            what += "; a prefix of a name must go past its time (`<time_ns>-`)"
        super().__init__(f"{what} (see `jobspool quarantine list`)")
        self.ident = ident
        self.matches = matches


class CorruptFileWarning(UserWarning):
    """Warned when a reader skips a job file it cannot decode (`recover` quarantines it)."""


__all__ = [
    "AppError",
    "Backpressure",
    "ConditionalPutUnsupported",
    "ConfigError",
    "CorruptFileWarning",
    "DuplicateJob",
    "FencedBlockBusy",
    "HoldCut",
    "InvalidJob",
    "InvalidRoot",
    "InvalidTransition",
    "InvalidType",
    "JobFailed",
    "JobNotFound",
    "JobPruned",
    "JobTooLarge",
    "JobspoolError",
    "LeaseLost",
    "NotQuarantined",
    "ObjectStoreUnreachable",
    "PolicyError",
    "PoolFailed",
    "ProjectionError",
    "ProjectionUnusable",
    "RunningLoopError",
    "ScheduleError",
    "SpoolClosed",
    "SpoolError",
    "StoreUnavailable",
    "TimeLimitExceeded",
    "UnreadableJob",
    "WaitTimeout",
    "WorkerCrashed",
    "WorkerSpoolClosed",
    "WriteFailed",
]


def one_line(exc: BaseException) -> str:
    """An error's first line (psycopg's messages carry DETAIL/HINT lines), for messages that
    must stay one line: the CLI's, a log's, the dashboard's error page."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def undecodable_escaped(text: str) -> str:
    """`text` with the undecodable bytes of a file name (how Python reads a name that is not
    UTF-8: as lone surrogates) spelled as backslash escapes: JSON, and a UTF-8 terminal,
    refuse them raw."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


# Control characters and bidirectional overrides, as a file name may hold them.
_NAME_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                           "\u2066-\u2069\ufeff]")


def shown_name(name: str) -> str:
    """A file name as a one-line message shows it: control characters (a newline in a
    name split `fsck`'s line in two, an escape sequence acted on the terminal) and
    undecodable bytes spelled as backslash escapes. Any other name is shown as it is."""
    name = undecodable_escaped(name)
    if _NAME_CONTROL.search(name) is None:
        return name
    return _NAME_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"),
                             name)


def json_safe(value: object) -> object:
    """A document with every string `undecodable_escaped`, for a JSON encoder that refuses
    surrogates (orjson): used when the first try fails, so the common case costs nothing."""
    if isinstance(value, str):
        return undecodable_escaped(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
