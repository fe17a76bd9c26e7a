"""The read side of the on-disk store: one job file's bytes, and the job ids a state
directory lists.

Reads go through no syscall seam: a failed read changes nothing on disk, so there is
no crash state to inject. `Store` (store.py) adds the atomic write path on top.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from jobspool.errors import SpoolError
from jobspool.queue.diskerrors import listing_failed, spool_missing
from jobspool.queue.payload import MAX_JOB_BYTES_LIMIT
from jobspool.queue.storenames import JOB_SUFFIX

_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_READ_CHUNK = 1 << 17
# No job file is larger than the largest `max_job_bytes` a spool may set, plus room for
# what a lease adds. Anything larger is not a job (a log or a dump copied in by mistake),
# refused unread: read whole, one 200 MB stray file took every claim, `stats` and
# `recover` to a 1 GB peak, and a few GB would have killed every worker of the spool.
MAX_FILE_BYTES = MAX_JOB_BYTES_LIMIT + (1 << 20)


def _special(path: str) -> OSError:
    return OSError(errno.EINVAL, "a FIFO or special file where a job file belongs",
                   os.path.normpath(path))


def _too_large(path: str, size: int) -> OSError:
    return OSError(errno.EFBIG, f"{size} bytes, larger than any job file can be (at most "
                   f"{MAX_FILE_BYTES}): not a job", os.path.normpath(path))


class StoreReader:
    """Reads the files of one spool root; never writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root_s = str(root)

    def path(self, directory: str, name: str) -> Path:
        return self.root / directory / name

    def present(self, directory: str, name: str) -> bool:
        """Whether anything is at that name (not followed: a symlink counts). An error
        other than absence (no permission) counts as present: the reader says why."""
        try:
            os.lstat(f"{self._root_s}/{directory}/{name}")
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def denied(self, directory: str, name: str) -> OSError | None:
        """The error when the name cannot even be looked up for want of permission (the
        directory, not the file: an lstat needs search permission on the directory alone);
        None when it can."""
        try:
            os.lstat(f"{self._root_s}/{directory}/{name}")
        except PermissionError as exc:
            exc.filename = f"{self._root_s}/{directory}"
            return exc
        except OSError:
            return None
        return None

    def surely_present(self, directory: str, name: str) -> bool:
        """Whether something is seen at that name: an error (no permission to search the
        directory) is "cannot tell", not "there"."""
        try:
            os.lstat(f"{self._root_s}/{directory}/{name}")
        except OSError:
            return False
        return True

    def read(self, directory: str, name: str) -> bytes:
        """The bytes of one file; raises FileNotFoundError when it is not there."""
        path = f"{self._root_s}/{directory}/{name}"
        # Never through a symlink (its target may be any file on the machine), and never
        # blocking on a FIFO a hand left there (it hung stats, recover and workers).
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, "a symlink where a job file belongs",
                              os.path.normpath(path)) from None
            if exc.errno == errno.ENXIO:  # a socket (or a FIFO no one may open so)
                raise _special(path) from None
            raise
        try:
            # A regular file returns everything up to EOF in one read: one syscall for a
            # job file (at most 64 KiB), a loop only for something larger.
            try:
                data = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                # A FIFO another process holds open for writing: EAGAIN, which read as the
                # machine short of resources failed `stats`, `list` and `health` whole.
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise _special(path) from None
                raise
            if not data and not stat.S_ISREG(os.fstat(fd).st_mode):
                # A FIFO (or a device) read empty without blocking: said as what it is, not
                # as "empty file" (`recover` quarantined it under that reason).
                raise _special(path)
            if len(data) < _READ_CHUNK:
                return data
            size = os.fstat(fd).st_size
            if size > MAX_FILE_BYTES:
                raise _too_large(path, size)
            chunks = [data]
            total = len(data)
            while chunk := os.read(fd, _READ_CHUNK):
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_FILE_BYTES:  # grew while read
                    raise _too_large(path, total)
            return b"".join(chunks)
        except OSError as exc:
            exc.filename = exc.filename or os.path.normpath(path)  # say which file
            raise
        finally:
            os.close(fd)

    def names(self, directory: str) -> list[str]:
        """Job ids with a file in `directory` (one directory listing). A hidden name is
        never a job (`ignored_name`; `x.json~` has no job suffix): `.x.json`, an editor's or
        rsync's copy, was warned about at every read, "recover moves it to quarantine/",
        while recover and fsck left it alone, as they should."""
        n = len(JOB_SUFFIX)
        try:
            return [f[:-n] for f in os.listdir(self.root / directory)
                    if f.endswith(JOB_SUFFIX) and f[0] != "."]
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone(directory) from None
        except OSError as exc:
            raise listing_failed(exc, self.root) from None

    def scan(self, directory: str) -> list[tuple[str, int]]:
        """(job id, inode) for each job file in `directory` (inodes come free with the listing)."""
        n = len(JOB_SUFFIX)
        try:
            with os.scandir(self.root / directory) as it:
                return [(e.name[:-n], e.inode()) for e in it
                        if e.name.endswith(JOB_SUFFIX) and e.name[0] != "."]
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone(directory) from None
        except OSError as exc:
            raise listing_failed(exc, self.root) from None

    def _gone(self, directory: str) -> SpoolError:
        """A state directory vanished under an open spool (`rm -rf`, a move, an unmount):
        one line naming it, not a raw FileNotFoundError from deep in a listing."""
        if not self.root.is_dir():
            return spool_missing(self.root)
        where = self.root / directory
        return SpoolError(f"{where}: a state directory is missing; was the spool deleted or "
                          "moved while open? (`jobspool init` makes a new one)",
                          path=str(where))
