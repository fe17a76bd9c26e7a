"""Per-job progress: `ctx.progress(done, total, note)`, shown by `jobspool show` and `list`.

Recorded cheaply: the handler's call only stores the numbers in memory; the
worker's heartbeat thread writes at most one small file per job every
half second, `<root>/progress/<job_id>.<token>.json`, replaced atomically and
never fsynced (advisory data, like `<root>/metrics/`). The file is named for
the lease's token, and readers show only the one of the job's current lease,
so a file left by a worker that died is never shown against a later run. The
worker removes its own file when it settles the job; a run whose lease was
lost (stalled, then taken over) writes and removes only its own token's file,
never the current holder's (one name for every run let it remove the holder's
report, or replace it with its own stale one).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from jobspool.errors import InvalidJob, SpoolClosed, StoreUnavailable
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.job import Job

PROGRESS_DIR = "progress"
MAX_NOTE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Progress:
    """How far one run got, by its own account."""

    token: int
    done: float
    total: float | None
    note: str | None
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "note": self.note, "at": self.at,
                "token": self.token}

    def text(self) -> str:
        """`40/100 (40%) resizing` style."""
        done = f"{self.done:g}"
        out = done if self.total is None else f"{done}/{self.total:g}"
        if self.total:
            out += f" ({100.0 * self.done / self.total:.0f}%)"
        return out + (f" {self.note}" if self.note else "")


def make_progress(token: int, done: object, total: object, note: object) -> Progress:
    """Validate a handler's `ctx.progress(...)` arguments (`InvalidJob` naming the bad one)."""
    def number(name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or value < 0:
            raise InvalidJob(f"ctx.progress {name} must be a non-negative finite number, "
                             f"got {value!r}", field=name)
        return float(value)

    if note is not None and not isinstance(note, str):
        raise InvalidJob(f"ctx.progress note must be a string, got {note!r}", field="note")
    if note is not None:
        try:
            note.encode("utf-8")
        except UnicodeEncodeError as exc:
            # Met at the flush instead, in the heartbeat thread, it ended that thread: no
            # lease of the worker was extended again.
            raise InvalidJob(f"ctx.progress note must be valid Unicode text: it holds "
                             f"{note[exc.start:exc.end]!r} at {exc.start}, which has no UTF-8 "
                             "form (a lone surrogate)", field="note") from None
    return Progress(token=token, done=number("done", done),
                    total=None if total is None else number("total", total),
                    note=None if note is None else note[:MAX_NOTE_CHARS], at=time.time())


def progress_path(root: Path, job_id: str, token: int) -> Path:
    """Where the run of `job_id` under lease `token` writes its progress."""
    return Path(root) / PROGRESS_DIR / f"{job_id}.{token}.json"


def _owner(name: str) -> tuple[str, int] | None:
    """(job id, token) of a progress file's name, or None for a name not of that form."""
    job_id, _, rest = name.removesuffix(".json").rpartition(".")
    if not name.endswith(".json") or not job_id or not rest.isdigit():
        return None
    return job_id, int(rest)


def write_progress(root: Path, job_id: str, progress: Progress, mode: int = 0o600) -> None:
    """Replace this run's progress file (atomic rename, no fsync: advisory)."""
    path = progress_path(root, job_id, progress.token)
    # The group gets on the directory what it gets on the files (group-read: r-x, not rwx).
    group = (0o050 if mode & 0o040 else 0) | (0o020 if mode & 0o020 else 0)
    path.parent.mkdir(mode=0o700 | group, exist_ok=True)
    tmp = path.with_name(f".{job_id}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, orjson.dumps(progress.to_dict()))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_progress(root: Path, job_id: str, token: int) -> None:
    """Remove the progress file of the run under lease `token` (no other run's)."""
    with contextlib.suppress(OSError):
        progress_path(root, job_id, token).unlink()


def prune_stale_progress(spool: Any) -> int:
    """Remove progress files no current run owns (a worker died before settling its job).

    A file is kept while its job is leased under the token it names, so a live
    run's file survives; one whose run just started and has not written yet
    loses nothing but a stale file. Returns how many were removed.
    """
    directory = Path(spool.root) / PROGRESS_DIR
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return 0
    removed = 0
    for name in names:
        owner = _owner(name)
        job = None
        if owner is not None:
            try:
                job = spool.get(owner[0])
            except (StoreUnavailable, SpoolClosed, OSError):
                # The store out of reach for a moment: whether a run still owns it is
                # unknown, and deleting a live run's file lost its progress until the
                # handler reported again. Asked again next time.
                continue
            except Exception:  # gone, not a job id, unreadable: nothing runs it under this
                job = None
        path = directory / name
        if owner is not None and job is not None and job.lease is not None \
                and job.lease.token == owner[1] and read_progress(spool.root, job) is not None:
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed


# The thread pruning dead runs' progress files, per spool root: one at a time per process
# (a worker run's Monitor each started one, and repeated runs piled them up).
_PRUNING: dict[str, threading.Thread] = {}
_PRUNING_LOCK = threading.Lock()


def prune_in_background(spool: Any) -> None:
    """`prune_stale_progress` on a thread of its own, unless one runs for this spool already.
    Run on the heartbeat thread, one store read per file held the first beat past the lease
    with thousands of files (a probe: 20,000 files, 12.8 s); a store that is down is asked
    for at most a second, not waited out (`reconnect_seconds`)."""
    def prune() -> None:
        db = getattr(spool, "db", None)  # the PostgreSQL store's connection pool
        try:
            with db.patience(time.monotonic() + 1.0) if db is not None \
                    else contextlib.nullcontext():
                prune_stale_progress(spool)
        except Exception:  # advisory data: never let it stop anything
            pass

    key = str(spool.root)
    with _PRUNING_LOCK:
        running = _PRUNING.get(key)
        if running is not None and running.is_alive():
            return
        thread = _PRUNING[key] = threading.Thread(
            target=prune, name="jobspool-progress-prune", daemon=True)
        thread.start()


def join_pruning(spool: Any, timeout: float) -> None:
    """Wait up to `timeout` for this spool's prune thread (a short run's own prune)."""
    running = _PRUNING.get(str(spool.root))
    if running is not None and running.is_alive():
        running.join(timeout=timeout)


def read_progress(root: Path, job: Job) -> Progress | None:
    """The progress of the job's current run, or None (not running, none reported, stale)."""
    if job.state is not JobState.LEASED or job.lease is None:
        return None
    try:
        doc = orjson.loads(progress_path(root, job.id, job.lease.token).read_bytes())
        progress = Progress(token=int(doc["token"]), done=float(doc["done"]),
                            total=None if doc.get("total") is None else float(doc["total"]),
                            note=doc.get("note") if isinstance(doc.get("note"), str) else None,
                            at=float(doc["at"]))
    except (OSError, ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        return None
    if progress.token != job.lease.token:
        return None
    proc = job.lease.proc
    if proc:
        # A worker that died (SIGKILL) left its last report behind, still naming the
        # lease's token until the lease expires: "40% resizing" of a run that is gone.
        from jobspool.queue import liveness

        if liveness.probe(root, proc)[0] == liveness.Verdict.DEAD:
            return None
    return progress
