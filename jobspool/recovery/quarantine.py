"""Moving unreadable files out of the state directories, into `quarantine/`, with a reason.

A file in a state directory that is not a readable job (bad JSON, wrong
schema, a state field not matching its directory, a name not matching its
id, an empty or truncated file, a symlink, a directory) is never deleted:
it is renamed into `quarantine/` under a unique name, and a
`<that name>.reason` file beside it says where it came from and why. One bad
file must never stop the queue, and an operator must be able to look at it:
`list_quarantined`, `show_quarantined`, `restore_quarantined` (a repaired
file back into the directory of its state) and `purge_quarantined` (the
only deletion, on an operator's request) back `jobspool quarantine`.

Names are `<time_ns>-<pid>-<n>.<state>.<original name>`: unique (the reason
file is created with O_EXCL before the move), sortable by time, and
self-describing for `ls`.

Order and crash-safety: the reason file is written (and fsync'd when the
spool is durable) *before* the rename, so a quarantined file always has its
reason; a crash between the two leaves an orphan `.reason` and the bad file
still in place, which the next recovery quarantines again. The directories
are flushed after the batch of renames. All of it runs under the spool lock,
after re-reading each file there: see `scan.py` for why a lock-free verdict
of "corrupt" is only a suspicion.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from jobspool.errors import NotQuarantined as NotQuarantined
from jobspool.errors import SpoolError, shown_name, undecodable_escaped
from jobspool.queue import store as store_mod
from jobspool.queue.diskerrors import write_failed
from jobspool.queue.fence import FENCE_FILE, decode_fence
from jobspool.queue.job import CorruptJob, Job, decode_job
from jobspool.queue.layout import QUARANTINE_DIR
from jobspool.queue.perms import set_fd_mode
from jobspool.queue.states import JobState
from jobspool.queue.store import JOB_SUFFIX
from jobspool.recovery.scan import Bad, read_job

if TYPE_CHECKING:
    from jobspool.queue.journal import Journal

log = logging.getLogger(__name__)

REASON_SUFFIX = ".reason"
REASON_FORMAT = 1
_MAX_NAME = 150  # bytes: room for the prefix and `.reason` within a 255-byte file name
_counter = itertools.count()


def confirm(spool: Journal, bad: Bad) -> Bad | None:
    """Re-check a suspect under the lock: still there and still unreadable (with today's reason)."""
    path = spool.root / bad.directory / bad.name
    if os.path.islink(path):
        return Bad(bad.directory, bad.name, "a symlink where a job file belongs")
    got = read_job(spool, bad.directory, bad.name)
    return got if isinstance(got, Bad) else None


def quarantine(spool: Journal, suspects: Iterable[Bad]) -> list[tuple[str, str]]:
    """Move each confirmed-bad file into `quarantine/`; returns (source, quarantine name) pairs.

    Call under the spool lock.
    """
    assert spool.lock.held, "quarantine() must run under the spool lock"
    moved: list[tuple[str, str]] = []
    dirs: set[str] = set()
    try:
        for suspect in suspects:
            bad = confirm(spool, suspect)
            if bad is None:
                continue
            qname = _move(spool, bad)
            if qname is not None:
                moved.append((bad.path, qname))
                dirs.add(bad.directory)
                log.warning("quarantined %s as %s/%s: %s", shown_name(bad.path),
                            QUARANTINE_DIR, shown_name(qname), bad.reason)
    finally:
        # Also when a later move failed: the ones done are flushed and seen by claims.
        if moved:
            spool.touch(JobState(d) for d in dirs)
            if spool.durable:
                store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
                for d in sorted(dirs):
                    store_mod.fsync_dir(spool.root / d)
    return moved


def quarantine_root_file(spool: Journal, name: str, reason: str) -> str | None:
    """Move a damaged file of the spool root (the fence counter) aside before it is rebuilt.

    Call under the spool lock; the root directory is flushed by the rebuild that follows.
    """
    assert spool.lock.held, "quarantine_root_file() must run under the spool lock"
    qname = _move(spool, Bad("", name, reason))
    if qname is not None:
        log.warning("quarantined %s as %s/%s: %s", shown_name(name), QUARANTINE_DIR,
                    shown_name(qname), reason)
        if spool.durable:
            store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
    return qname


def _clipped(name: str) -> str:
    """`name` cut to `_MAX_NAME` bytes, on a character boundary. Cut to 150 characters,
    a name of 120 two-byte characters (a legal 245-byte name) made a quarantine name past
    the 255-byte limit: every `recover` stopped on it, before taking back dead leases."""
    if len(os.fsencode(name)) <= _MAX_NAME:
        return name
    cut = name[:_MAX_NAME]
    while len(os.fsencode(cut)) > _MAX_NAME:
        cut = cut[:-1]
    return cut


def _move(spool: Journal, bad: Bad) -> str | None:
    qdir = spool.root / QUARANTINE_DIR
    reason = orjson.dumps({
        "v": REASON_FORMAT,
        "source": undecodable_escaped(bad.path),  # a name that is not UTF-8 stopped recovery here
        "reason": undecodable_escaped(bad.reason),
        "quarantined_at": spool.now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }) + b"\n"
    while True:
        origin = bad.directory or "root"
        qname = f"{time.time_ns()}-{os.getpid()}-{next(_counter)}.{origin}.{_clipped(bad.name)}"
        if os.path.lexists(qdir / qname):
            continue
        try:
            fd = os.open(qdir / (qname + REASON_SUFFIX),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, spool.store.file_mode)
        except FileExistsError:
            continue
        break
    reason_path = qdir / (qname + REASON_SUFFIX)
    try:
        try:
            set_fd_mode(fd, spool.store.file_mode)  # the spool's mode whatever the umask
            view = memoryview(reason)
            while view:
                view = view[store_mod.os_write(fd, view):]
            if spool.durable:
                store_mod.os_fsync(fd)
        finally:
            os.close(fd)
        store_mod.os_replace(spool.root / bad.directory / bad.name, qdir / qname)
    except OSError as exc:
        # No reason file without its quarantined file: one left behind was invisible to
        # `quarantine list` and stayed for good. The bad file stays where it was.
        with contextlib.suppress(OSError):
            os.unlink(reason_path)
        if isinstance(exc, FileNotFoundError) and \
                not os.path.lexists(spool.root / bad.directory / bad.name):
            return None  # gone meanwhile: nothing to quarantine
        raise write_failed(exc, spool.root) from None
    return qname


def quarantined_files(spool: Journal) -> list[str]:
    """Names of the quarantined files (their reason files excluded)."""
    try:
        return _pairs(os.listdir(spool.root / QUARANTINE_DIR))[0]
    except FileNotFoundError:
        return []


def _pairs(listing: Iterable[str]) -> tuple[list[str], list[str]]:
    """A listing of quarantine/ as (quarantined files, reason files with no file beside
    them). A name ending in `.reason` is a quarantined file when it has a reason of its own
    (`ready/notes.reason` quarantined): counted as a reason by its name alone, it was never
    listed, shown or restored, and `recover` took it for an orphan and deleted it."""
    names = {n for n in listing if not n.startswith(".")}
    files = sorted(n for n in names
                   if not n.endswith(REASON_SUFFIX) or n + REASON_SUFFIX in names)
    kept = set(files) | {f + REASON_SUFFIX for f in files}
    return files, sorted(n for n in names - kept if n.endswith(REASON_SUFFIX))


def orphan_reasons(qdir: Path) -> list[str]:
    """Reason files in quarantine/ with no quarantined file beside them that are surely
    reasons: plain files named as `_move` names them (`<time_ns>-<pid>-<n>.`; cut short or
    empty, a reason written as its quarantine was killed still is one), or holding a
    reason record. Call under the spool lock: a quarantine writes the reason, then moves
    the file, and one killed between the two left the reason behind for good."""
    try:
        candidates = _pairs(os.listdir(qdir))[1]
    except FileNotFoundError:
        return []
    return [n for n in candidates
            if (_QUARANTINE_NAME.match(n) and _is_plain_file(qdir / n))
            or _reason_record(qdir / n) is not None]


_QUARANTINE_NAME = re.compile(r"\d+-\d+-\d+\.")


def _is_plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_plain(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, never blocking: a FIFO named like a reason
    file hung `recover` (holding the spool lock) and `quarantine list` for good."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _reason_record(path: Path) -> dict[str, object] | None:
    """The reason record `path` holds, as `_move` writes them; None for anything else."""
    try:
        doc = orjson.loads(_read_plain(path, 64 * 1024))
    except (OSError, orjson.JSONDecodeError):
        return None
    if (isinstance(doc, dict) and doc.get("v") == REASON_FORMAT
            and isinstance(doc.get("source"), str) and isinstance(doc.get("reason"), str)):
        return doc
    return None


def read_reason(spool: Journal, qname: str) -> dict[str, object]:
    """The reason record written beside a quarantined file."""
    data = _read_plain(spool.root / QUARANTINE_DIR / (qname + REASON_SUFFIX), 1024 * 1024)
    doc = orjson.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"{qname}{REASON_SUFFIX} is not a JSON object")
    return doc


# ---------------------------------------------------------------- operator commands
#
# `jobspool quarantine list|show|restore|purge`: look at what recovery moved aside, put a
# repaired file back where workers find it, or delete what is not worth keeping.

_SHOW_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class QuarantinedFile:
    """One file in `quarantine/`: its name there (the id commands take), where it came
    from (`state/name`), why it was moved, when (epoch seconds, None if unrecorded), its size."""

    name: str
    source: str
    reason: str
    quarantined_at: float | None
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "reason": self.reason,
                "quarantined_at": self.quarantined_at, "size": self.size}


def _describe(spool: Journal, name: str) -> QuarantinedFile | None:
    qdir = spool.root / QUARANTINE_DIR
    try:
        size = (qdir / name).lstat().st_size
    except FileNotFoundError:
        return None
    try:
        doc = read_reason(spool, name)
    except (OSError, ValueError):
        doc = {}
    source, reason, at = doc.get("source"), doc.get("reason"), doc.get("quarantined_at")
    if not isinstance(source, str):
        parts = name.split(".", 2)  # <time>-<pid>-<n>.<origin>.<original name>
        source = f"{parts[1]}/{parts[2]}" if len(parts) == 3 else "unknown"
    return QuarantinedFile(
        name=name, source=source,
        reason=reason if isinstance(reason, str) else "no reason recorded",
        quarantined_at=float(at) if isinstance(at, int | float) and
        not isinstance(at, bool) else None,
        size=size)


def list_quarantined(spool: Journal) -> list[QuarantinedFile]:
    """Every quarantined file, oldest first (names sort by the time they were moved)."""
    out = (_describe(spool, n) for n in quarantined_files(spool))
    return [q for q in out if q is not None]


def resolve(spool: Journal, ident: str) -> str:
    """The quarantine name `ident` means: an exact name, the id of the job (the original
    file name without `.json`) when exactly one file matches, or a unique prefix of a name
    that goes past its time (`<time_ns>-`).

    The job id is tried before prefixes, and a prefix must hold the whole time: `17`, the
    id of a healthy job, was a prefix of every name of the years the clock starts with 17,
    and `purge 17` deleted another job's quarantined file for good."""
    if not ident or "/" in ident or ident in (".", ".."):
        raise NotQuarantined(ident)
    names = quarantined_files(spool)
    if ident in names:
        return ident
    by_job = [n for n in names if n.split(".", 2)[-1] in (ident, ident + JOB_SUFFIX)]
    by_prefix = [n for n in names
                 if n.startswith(ident) and len(ident) > n.find("-") > 0]
    for found in (by_job, by_prefix):
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise NotQuarantined(ident, len(found))
    raise NotQuarantined(ident, short_prefix=any(n.startswith(ident) for n in names))


def show_quarantined(spool: Journal, ident: str) -> dict[str, Any]:
    """One file's description, its content (text, at most 64 KiB) and, when it now reads
    as a job (repaired in place), that job."""
    name = resolve(spool, ident)
    info = _describe(spool, name)
    if info is None:
        raise NotQuarantined(ident)
    doc = info.to_dict()
    try:
        data = spool.store.read(QUARANTINE_DIR, name)  # never through a symlink, nor a FIFO
    except IsADirectoryError:
        return {**doc, "content": "", "truncated": False, "job": None, "readable": False,
                "problem": "a directory, not a job file"}
    except OSError as exc:
        return {**doc, "content": "", "truncated": False, "job": None, "readable": False,
                "problem": exc.strerror or str(exc)}
    doc["content"] = data[:_SHOW_BYTES].decode("utf-8", errors="replace")
    doc["truncated"] = len(data) > _SHOW_BYTES
    try:
        doc["job"] = decode_job(data).to_dict()
        doc["readable"] = True
    except CorruptJob as exc:
        doc["job"] = None
        doc["readable"] = False
        doc["problem"] = exc.reason if data else "empty file"
    return doc


def restore_quarantined(spool: Journal, ident: str) -> Job:
    """Move a repaired quarantined job file back into the directory of its `state`.

    Refused (`SpoolError`, nothing moved) while the file is still not a
    readable job, or when the spool already holds a job with its id (two
    copies would be a crash leftover that recovery settles by revision,
    possibly against the restored one). The rename is atomic and, in a
    durable spool, both directories are flushed; the state directory's
    generation is bumped so every worker's claim index sees the job.
    """
    spool.check_writable("restore a quarantined file")
    name = resolve(spool, ident)
    qpath = spool.root / QUARANTINE_DIR / name
    where = f"{QUARANTINE_DIR}/{shown_name(name)}"
    with spool.lock.hold():
        try:
            data = spool.store.read(QUARANTINE_DIR, name)
        except FileNotFoundError:
            raise NotQuarantined(ident) from None
        except IsADirectoryError:
            raise SpoolError(f"cannot restore {where}: a directory, not a job "
                             "file; `jobspool quarantine purge` it", path=str(qpath)) from None
        except OSError as exc:  # a symlink, no permission
            raise SpoolError(f"cannot restore {where}: "
                             f"{exc.strerror or exc}", path=str(qpath)) from None
        try:
            job = decode_job(data)
        except CorruptJob as exc:
            raise SpoolError(f"cannot restore {where}: still not a readable job "
                             f"({exc.reason if data else 'empty file'}); repair it in place "
                             "first, or `jobspool quarantine purge` it", path=str(qpath)) from None
        if len(data) > spool.max_job_bytes:
            # Readers would take it, and every later write of it be "written anyway".
            raise SpoolError(f"cannot restore {where}: {len(data)} bytes, over "
                             f"max_job_bytes={spool.max_job_bytes}; shorten it in place first",
                             path=str(qpath))
        existing, _ = spool.locate(job.id)
        if existing is not None:
            raise SpoolError(f"cannot restore {where}: job {job.id!r} already "
                             f"exists (state {existing.state.value}); purge the quarantined "
                             "copy instead", path=str(qpath))
        target = spool.root / job.state.value / (job.id + JOB_SUFFIX)
        if job.lease is not None:
            _fence_above(spool, job.lease.token)
        # The spool's mode, whatever a hand left (a 000 file came back unreadable to workers).
        with contextlib.suppress(OSError):
            os.chmod(qpath, spool.store.file_mode)
        try:
            store_mod.os_replace(qpath, target)
        except FileNotFoundError:
            raise NotQuarantined(ident) from None  # purged by an older release's purge
        with contextlib.suppress(FileNotFoundError):
            os.unlink(qpath.with_name(name + REASON_SUFFIX))
        if spool.durable:
            store_mod.fsync_dir(spool.root / job.state.value)
            store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
        spool.touch([job.state])
    log.info("restored %s/%s as %s", QUARANTINE_DIR, shown_name(name),
             shown_name(str(target.relative_to(spool.root))),
             extra={"job_id": job.id, "state": job.state.value})
    return job


def _fence_above(spool: Journal, token: int) -> None:
    """A restored lease's token above every token handed out (a hand edit, another spool's
    file) raises the counter, and the ceiling on disk when needed, as recovery would:
    tokens handed out later stay above it."""
    if token <= spool.fence_value():
        return
    try:
        current = decode_fence(spool.store.read("", FENCE_FILE))
    except (OSError, ValueError):
        return  # missing or broken: recovery rebuilds it above every token on disk
    spool.fence_above(token, current)


def purge_quarantined(spool: Journal, idents: Sequence[str] = (), *,
                      older_than: float | None = None) -> list[str]:
    """Delete quarantined files (and their reason files) for good; returns their names.

    All of them when `idents` is empty (orphan reason files too), else the
    ones named; `older_than` keeps those quarantined within that many seconds.
    """
    spool.check_writable("purge quarantined files")
    names = [resolve(spool, i) for i in idents] if idents else quarantined_files(spool)
    qdir = spool.root / QUARANTINE_DIR
    now = spool.now()
    purged: list[str] = []
    failed: list[str] = []
    for name in dict.fromkeys(names):
        if older_than is not None:
            info = _describe(spool, name)
            at = info.quarantined_at if info is not None else None
            if at is None or now - at <= older_than:
                continue
        try:
            # Under the lock, as restore reads, checks and moves: purged between its read
            # and its rename, a restore failed with a raw FileNotFoundError.
            with spool.lock.hold():
                for path in (qdir / name, qdir / (name + REASON_SUFFIX)):
                    store_mod.remove_entry(path)
        except OSError as exc:
            failed.append(f"{name}: {exc.strerror or exc}")  # the others are still purged
            continue
        purged.append(name)
    if not idents and older_than is None:
        # Reason files left by a crash between writing one and moving its file in. Under
        # the lock, and only those without their file: a `recover` quarantining alongside
        # writes the reason first, and lost it to this sweep ("no reason recorded").
        with contextlib.suppress(FileNotFoundError), spool.lock.hold():
            for orphan in _pairs(os.listdir(qdir))[1]:
                store_mod.remove_entry(qdir / orphan)
    if purged and spool.durable:
        store_mod.fsync_dir(qdir)
    if failed:
        raise SpoolError(f"purged {len(purged)} quarantined file(s), could not purge "
                         f"{len(failed)}: {'; '.join(failed[:5])}", path=str(qdir))
    return purged
