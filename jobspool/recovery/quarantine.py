"""Moving unreadable files out of the state directories, into `quarantine/`, with a reason.

A file in a state directory that is not a readable job (bad JSON, wrong
schema, a state field not matching its directory, a name not matching its
id, an empty or truncated file, a symlink, a directory) is never deleted:
it is renamed into `quarantine/` under a unique name, and a
`<that name>.reason` file beside it says where it came from and why. One bad
file must never stop the queue, and an operator must be able to look at it.

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

import itertools
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import orjson

from jobspool.queue import store as store_mod
from jobspool.queue.layout import QUARANTINE_DIR
from jobspool.queue.states import JobState
from jobspool.recovery.scan import Bad, read_job

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool

log = logging.getLogger(__name__)

REASON_SUFFIX = ".reason"
REASON_FORMAT = 1
_MAX_NAME = 150  # room for the prefix within a 255-byte file name
_counter = itertools.count()


def confirm(spool: Spool, bad: Bad) -> Bad | None:
    """Re-check a suspect under the lock: still there and still unreadable (with today's reason)."""
    path = spool.root / bad.directory / bad.name
    if os.path.islink(path):
        return Bad(bad.directory, bad.name, "a symlink where a job file belongs")
    got = read_job(spool, bad.directory, bad.name)
    return got if isinstance(got, Bad) else None


def quarantine(spool: Spool, suspects: Iterable[Bad]) -> list[tuple[str, str]]:
    """Move each confirmed-bad file into `quarantine/`; returns (source, quarantine name) pairs.

    Call under the spool lock.
    """
    assert spool.lock.held, "quarantine() must run under the spool lock"
    moved: list[tuple[str, str]] = []
    dirs: set[str] = set()
    for suspect in suspects:
        bad = confirm(spool, suspect)
        if bad is None:
            continue
        qname = _move(spool, bad)
        if qname is not None:
            moved.append((bad.path, qname))
            dirs.add(bad.directory)
            log.warning("quarantined %s as %s/%s: %s", bad.path, QUARANTINE_DIR, qname, bad.reason)
    if moved:
        if spool.durable:
            store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
            for d in sorted(dirs):
                store_mod.fsync_dir(spool.root / d)
        spool._touch(JobState(d) for d in dirs)
    return moved


def quarantine_root_file(spool: Spool, name: str, reason: str) -> str | None:
    """Move a damaged file of the spool root (the fence counter) aside before it is rebuilt.

    Call under the spool lock; the root directory is flushed by the rebuild that follows.
    """
    assert spool.lock.held, "quarantine_root_file() must run under the spool lock"
    qname = _move(spool, Bad("", name, reason))
    if qname is not None:
        log.warning("quarantined %s as %s/%s: %s", name, QUARANTINE_DIR, qname, reason)
        if spool.durable:
            store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
    return qname


def _move(spool: Spool, bad: Bad) -> str | None:
    qdir = spool.root / QUARANTINE_DIR
    reason = orjson.dumps({
        "v": REASON_FORMAT,
        "source": bad.path,
        "reason": bad.reason,
        "quarantined_at": spool.now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }) + b"\n"
    while True:
        origin = bad.directory or "root"
        qname = f"{time.time_ns()}-{os.getpid()}-{next(_counter)}.{origin}.{bad.name[:_MAX_NAME]}"
        if os.path.lexists(qdir / qname):
            continue
        try:
            fd = os.open(qdir / (qname + REASON_SUFFIX),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        break
    try:
        view = memoryview(reason)
        while view:
            view = view[store_mod.os_write(fd, view):]
        if spool.durable:
            store_mod.os_fsync(fd)
    finally:
        os.close(fd)
    try:
        store_mod.os_replace(spool.root / bad.directory / bad.name, qdir / qname)
    except FileNotFoundError:
        os.unlink(qdir / (qname + REASON_SUFFIX))
        return None
    return qname


def quarantined_files(spool: Spool) -> list[str]:
    """Names of the quarantined files (their reason files excluded)."""
    try:
        return sorted(n for n in os.listdir(spool.root / QUARANTINE_DIR)
                      if not n.endswith(REASON_SUFFIX))
    except FileNotFoundError:
        return []


def read_reason(spool: Spool, qname: str) -> dict[str, object]:
    """The reason record written beside a quarantined file."""
    data = (spool.root / QUARANTINE_DIR / (qname + REASON_SUFFIX)).read_bytes()
    doc = orjson.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"{qname}{REASON_SUFFIX} is not a JSON object")
    return doc
