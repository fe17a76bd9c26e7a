"""The one-line errors a spool's disk gives: what went wrong, where, and what to do.

Write failures become `WriteFailed` (naming what landed anyway), reads short of
resources `StoreUnavailable`, a vanished spool a `SpoolError`; each carries the hint
an operator needs (ENOSPC: free space, EMFILE: raise the descriptor limit...).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from jobspool.errors import SpoolError, StoreUnavailable, WriteFailed

_HINTS = {
    errno.ENOSPC: "the disk is full (no space or no inodes left: see df -h and df -i): "
                  "free space on it, then run `jobspool recover`",
    errno.EDQUOT: "the disk quota is used up: raise it or free space, then run `jobspool recover`",
    errno.EIO: "the disk reported an I/O error: check it (dmesg), then run `jobspool recover`",
    errno.EROFS: "the filesystem is read-only: remount it read-write",
    errno.EMFILE: "this process ran out of file descriptors: raise its limit (ulimit -n, "
                  "systemd LimitNOFILE=) or lower --concurrency",
    errno.ENFILE: "the system ran out of file descriptors: raise fs.file-max or stop "
                  "what holds them",
    errno.EACCES: "permission denied: run as the spool's owner or fix its permissions",
    errno.EPERM: "operation not permitted: run as the spool's owner or fix its permissions",
}


def os_hint(errno_: int | None) -> str | None:
    """What to do about an OS error writing a spool (ENOSPC: free space...), if known."""
    return _HINTS.get(errno_ or 0)


def write_failed(exc: OSError, root: Path, landed: frozenset[str] = frozenset()) -> WriteFailed:
    """A one-line `WriteFailed` for an OSError met while writing the spool at `root`."""
    where, path = _where(exc, root)
    hint = _HINTS.get(exc.errno or 0, "run `jobspool recover` once the cause is fixed")
    gone = _missing_target(exc)
    if gone is not None:
        # `rm -rf completed` under a worker: the rename's error names its source, the
        # staging file in tmp/, which is there; the directory it went to is not.
        where, path = f"{gone}/ is missing", gone
        hint = "`jobspool init` makes it again (then `jobspool recover`)"
    message = f"cannot write to spool {root}: {exc.strerror or exc} ({where}); {hint}"
    return WriteFailed(message + _published(landed), path=path, errno=exc.errno,
                       landed=landed)


def _missing_target(exc: OSError) -> str | None:
    """The directory a rename went to, when that is what does not exist."""
    if exc.errno != errno.ENOENT or exc.filename2 is None:
        return None
    parent = os.path.dirname(os.fsdecode(exc.filename2))
    return parent if parent and not os.path.isdir(parent) else None


def _where(exc: OSError, root: Path) -> tuple[str, str]:
    """What refused: a rename's error carries both names, and the directory that refused
    is the one to name (by the source alone, a refused `completed/` was reported as its
    writable staging file in tmp/, and the operator found nothing wrong there)."""
    src, dst = exc.filename, exc.filename2
    if dst is None or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        # Not a refusal of one directory (a full disk is the filesystem's): one name.
        return str(src or root), str(src or root)
    for name in (dst, src):
        parent = os.path.dirname(os.fsdecode(name))
        if parent and not os.access(parent, os.W_OK | os.X_OK):
            return f"{parent}/", parent
    return os.fsdecode(dst), os.fsdecode(dst)  # as root, access() cannot tell: the target


def published_anyway(exc: SpoolError, landed: frozenset[str]) -> WriteFailed:
    """A failure met after `landed` were published (a lock the shared flush needs, refused):
    a `WriteFailed` that names them, so that nobody enqueues them again."""
    if isinstance(exc, WriteFailed):
        return exc
    return WriteFailed(f"{exc}{_published(landed)}", path=exc.path, landed=landed)


def _published(landed: frozenset[str]) -> str:
    # Said in the message too: a CLI user must not enqueue these again.
    if not landed:
        return ""
    shown = sorted(landed)
    return (f"; published though not confirmed durable: {', '.join(shown[:3])}"
            + (f" and {len(shown) - 3} more" if len(shown) > 3 else ""))


# Read errors that say nothing of the file: the process or the machine is short of
# something for now. A job file met with one is not unreadable (quarantined, its lease
# taken for lost), and the reader must not go on as if it were absent.
SHORT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN,
                                errno.EINTR, errno.ENOBUFS})


def read_failed(exc: OSError, root: Path) -> StoreUnavailable:
    """A one-line `StoreUnavailable` for a read that failed for want of resources."""
    where = exc.filename or root
    hint = _HINTS.get(exc.errno or 0, "try again once the machine has recovered")
    return StoreUnavailable(f"cannot read spool {root}: {exc.strerror or exc} ({where}); "
                            f"{hint}", path=str(where))


def listing_failed(exc: OSError, root: Path) -> SpoolError:
    """A one-line error for a directory of the spool at `root` that cannot be listed (an
    I/O error, a permission taken away): not a raw OSError from deep in a scan."""
    if exc.errno in SHORT_OF_RESOURCES:
        return read_failed(exc, root)
    where = exc.filename or root
    hint = _HINTS.get(exc.errno or 0, "check the disk and the spool's permissions")
    return SpoolError(f"cannot read spool {root}: {exc.strerror or exc} ({where}); {hint}",
                      path=str(where))


def spool_missing(root: Path) -> SpoolError:
    """The spool directory itself is gone under an open spool (readers and the lock)."""
    return SpoolError(f"{root}: the spool directory is missing; was the spool deleted or "
                      "moved while open? (`jobspool init` makes a new one)", path=str(root))
