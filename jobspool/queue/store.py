"""The on-disk store: reads and atomically writes the files of a spool, nothing more.

It knows nothing of retries or leases; it is handed finished bytes and told
where they go. Every system call that matters for crash-safety goes through
the module-level names `os_replace`, `os_fsync`, `os_unlink` and `os_write`,
so tests can inject a failure at each step.

The write sequence of `apply` (a batch of changes, all under the spool lock):

1. stage: write each new file into `tmp/` (a fresh file, or a recycled one
   from `tmp/pool/`, rewritten in place: creating inodes is the dominant
   cost on this kind of disk), then flush the data (fsync per file, or one
   `syncfs` for the batch);
2. publish: rename each staged file to its destination, then flush the
   destination directories — after this point the change is durable;
3. retire: move each superseded file away (into `tmp/pool/` for reuse, or
   unlink it) — *without* a flush.

A crash at any point leaves, for each job, the old file, or the new file,
or both; both is settled by recovery keeping the higher `revision`. Step 3
starts only after the flush of step 2, so even a power loss (not just a
process crash) cannot persist the removal of the old file without the
arrival of the new one: the new file is durable before the old one is
touched. Step 3 itself is not flushed: a power loss may forget the removal
and leave the old copy beside the new one, which is the "both" case above
— readers take the higher revision (`Spool.get`), a claim after a reboot
or after a writer died mid-batch (the next lock holder finds its in-flight
mark) checks for such copies until recovery has run (`SpoolLock.suspect`), and
`recover` removes them. The change was acknowledged once step 2 was
flushed, so skipping this flush loses nothing that was acknowledged; it
saves one flush per state change (two flushes instead of three).
`durable=False` skips every flush: safe against a process crash (the page
cache survives it), not against a power loss.

Reading (`storeread.py`), the names of the files (`storenames.py`) and the
bookkeeping of the recycled-file pool (`storepool.py`) live beside it; every
syscall a crash test injects a failure into stays here.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobspool.errors import SpoolError
from jobspool.queue import liveness
from jobspool.queue.diskerrors import write_failed
from jobspool.queue.liveness import LIVE_DIR as LIVE_DIR
from jobspool.queue.perms import set_fd_mode

# Re-exported: the names of the store's files have always been imported from here.
from jobspool.queue.storenames import JOB_SUFFIX as JOB_SUFFIX
from jobspool.queue.storenames import POOL_DIR as POOL_DIR
from jobspool.queue.storenames import POOL_NAME as POOL_NAME
from jobspool.queue.storenames import POOL_RESERVE as POOL_RESERVE
from jobspool.queue.storenames import STAGE_SUFFIX as STAGE_SUFFIX
from jobspool.queue.storenames import TMP_DIR as TMP_DIR
from jobspool.queue.storenames import ignored_name as ignored_name
from jobspool.queue.storenames import staging_name as staging_name
from jobspool.queue.storepool import RecycledPool as RecycledPool
from jobspool.queue.storeread import StoreReader as StoreReader

log = logging.getLogger(__name__)

# Syscall seams (fault injection patches these).
os_open = os.open  # creating a new staging file (a new inode: what a full disk refuses)
os_replace = os.replace
os_fsync = os.fsync
os_unlink = os.unlink
os_write = os.write

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

_libc: ctypes.CDLL | None = None


def _syncfs(fd: int) -> None:
    """Flush the whole filesystem holding `fd` (Linux `syncfs(2)`): one flush for a batch."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@dataclass(frozen=True, slots=True)
class Change:
    """Put `data` at `dst/name` and/or remove `src/name` (directories relative to the root).

    `dst` of `""` is the spool root itself (the `fence` file). `data=None`
    with a `src` is a removal (pruning).
    """

    name: str
    dst: str | None
    data: bytes | None
    src: str | None = None
    staged: str | None = None  # a file `prestage` already wrote and flushed with `data`


# How many times `apply` writes again a staging file that vanished before its rename.
_RESTAGE_TRIES = 3


class Unflushed(OSError):
    """`apply` published its files but could not flush their directories: every new
    version is visible, none confirmed durable, and no old copy was removed."""


class Store(StoreReader, RecycledPool):
    """Atomic file placement inside one spool root (reads: `StoreReader`)."""

    # Called (under the spool lock) when a superseded copy could not be removed, so that
    # claims check for stale copies until recovery runs (`SpoolLock.suspect`).
    on_unretired: Callable[[], None] | None = None
    # Called (under the spool lock) with (directory, name) when a file is found where a
    # job moves or is created: a hand-placed or damaged file there, which the rename
    # would destroy. The layer above decides (an unreadable one goes to quarantine/).
    on_occupied: Callable[[str, str], None] | None = None

    def __init__(self, root: Path, *, durable: bool = True, sync_mode: str = "auto",
                 pool_size: int = 256, file_mode: int = 0o600, dir_mode: int = 0o700) -> None:
        if sync_mode not in ("auto", "fsync", "syncfs"):
            raise ValueError(f"sync_mode must be auto, fsync or syncfs, not {sync_mode!r}")
        super().__init__(root)
        self.durable = durable
        self.sync_mode = sync_mode
        self.pool_size = pool_size
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self._tmp = root / TMP_DIR
        self._pool_dir = root / POOL_DIR
        self._pid = os.getpid()
        self._pool: list[str] = []
        self._pool_loaded = False
        self._pool_stamp = 0

    # ------------------------------------------------------------ writing

    def apply(self, changes: Sequence[Change], *, flush_dirs: bool = True) -> set[str]:
        """Apply a batch of changes with the write sequence described in the module docstring.

        Returns the directories the batch published into. `flush_dirs=False`
        leaves step 2's directory flush to the caller (group commit, see
        `groupflush.py`); it is allowed only for a batch that retires nothing,
        since step 3 must wait for that flush.
        """
        if not changes:
            return set()
        if not flush_dirs and any(ch.src is not None for ch in changes):
            raise ValueError("a batch that retires files must flush before retiring them")
        use_syncfs = self.durable and (
            self.sync_mode == "syncfs" or (self.sync_mode == "auto" and len(changes) >= 8)
        )
        self._check_real_dirs({ch.dst for ch in changes if ch.dst is not None}
                              | {ch.src for ch in changes if ch.src is not None})
        staged: list[tuple[Change, str]] = []
        self._check_fork()
        fresh = 0
        try:
            for ch in changes:
                if ch.staged is not None:
                    staged.append((ch, ch.staged))
                elif ch.data is not None:
                    staged.append((ch, self._stage(ch.data, fsync=self.durable and not use_syncfs)))
                    fresh += 1
        except BaseException:
            for ch, tmp in staged:
                if ch.staged is None:
                    _quiet_unlink(tmp)
            raise
        published = 0
        try:
            if use_syncfs and fresh:
                self._flush_fs()
            for i, (ch, tmp) in enumerate(staged):
                assert ch.dst is not None
                dst = os.path.join(self.root, ch.dst, ch.name)
                if (ch.dst and ch.src != ch.dst and self.on_occupied is not None
                        and os.path.lexists(dst)):  # ~1 µs: a job's own move finds none
                    self.on_occupied(ch.dst, ch.name)
                for attempt in range(_RESTAGE_TRIES + 1):
                    try:
                        os_replace(tmp, dst)
                        break
                    except FileNotFoundError:
                        if attempt == _RESTAGE_TRIES or not ch.data or os.path.lexists(tmp):
                            raise
                    # Its staging file vanished (an operator's `rm -rf tmp/` under a live
                    # worker or producer): write it again from memory. Failing here threw
                    # a finished run's result away, and the job ran a second time.
                    log.warning("staging file %s vanished before it was published; "
                                "writing it again", tmp)
                    tmp = self._stage(ch.data, fsync=self.durable)
                    staged[i] = (ch := Change(ch.name, ch.dst, ch.data, ch.src), tmp)
                published += 1
        except BaseException:
            # Staged files that never got published are nobody's: remove them now rather
            # than leave them in tmp/ for recovery (prestaged ones are their caller's).
            for ch, tmp in staged[published:]:
                if ch.staged is None:
                    _quiet_unlink(tmp)
            raise
        dst_dirs = {ch.dst for ch, _ in staged if ch.dst is not None}
        if self.durable and dst_dirs and flush_dirs:
            try:
                self._flush_dirs(dst_dirs, use_syncfs)
            except OSError as exc:
                # Published, not flushed: the old copies must stay (step 3 waits for the
                # flush), so a power loss finds the old version rather than neither.
                raise Unflushed(exc.errno, exc.strerror, exc.filename) from exc
        for ch in changes:
            if ch.src is not None and (ch.src != ch.dst or ch.data is None):
                path = os.path.join(self.root, ch.src, ch.name)
                try:
                    self._retire(path)
                except OSError as exc:
                    # The change is durable already: failing it here told the caller "not
                    # confirmed durable" (false) and a settle was retried over itself. The
                    # copy left behind is the two-copies case recovery settles.
                    if ch.dst is None:  # a removal (prune, recover): the file stays, whole
                        log.warning("could not remove %s (%s); it stays in place", path,
                                    exc.strerror or exc)
                    else:
                        log.warning("could not remove superseded %s (%s); `jobspool recover` "
                                    "removes it", path, exc.strerror or exc)
                    if self.on_unretired is not None:
                        self.on_unretired()
        return dst_dirs

    def _check_real_dirs(self, dirs: set[str]) -> None:
        """Refuse to write while one of the spool's directories is a symlink (DESIGN §2): it
        is checked at open, but one swapped in under an open spool took a long-lived
        worker's or producer's job files outside the spool. An lstat per directory a batch
        touches, before anything is written."""
        for d in (TMP_DIR, POOL_DIR, *sorted(dirs)):
            path = f"{self._root_s}/{d}"
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # named by the write that needs it (`_gone`, the OS error)
            if stat.S_ISLNK(st.st_mode):
                raise SpoolError(f"{path} is a symlink; the spool's directories must be real "
                                 "directories inside it (nothing was written)", path=path)

    def prestage(self, datas: Sequence[bytes]) -> list[str]:
        """Write and flush new files *outside* the spool lock; `apply` publishes them later.

        Creating an inode is the dominant cost of an enqueue on this kind of
        disk, and doing it before taking the lock keeps producers from
        stalling every other process meanwhile. Recycled files are taken from
        the pool by rename (see `_staging_file`), so this is safe without the
        lock; they are named `<ident>.<n>.stage` after this process's
        liveness mark, so recovery
        running in another process leaves them alone while their writer lives
        (see `recovery.strays.stray_tmp_files`). The caller must `discard` the ones it does
        not publish.
        """
        try:
            # The pool listed on first use: `tmp/pool/` that cannot be read (chmod 000) is
            # the same one-line WriteFailed as any other write, not a bare PermissionError.
            self._check_fork()
        except OSError as exc:
            raise write_failed(exc, self.root) from None
        self._check_real_dirs(set())
        try:
            liveness.mark_for(self.root, self.file_mode)
        except OSError as exc:
            raise write_failed(exc, self.root) from None
        paths: list[str] = []
        use_syncfs = self.durable and (self.sync_mode == "syncfs" or (
            self.sync_mode == "auto" and len(datas) >= 8))
        try:
            for data in datas:
                # New jobs leave the last few recycled files to the changes of jobs already
                # in the spool: on a full disk, workers can still settle what they hold.
                path, fd, size = self._staging_file(STAGE_SUFFIX, reserve=POOL_RESERVE)
                paths.append(path)
                try:
                    _write_all(fd, data)
                    if size > len(data):
                        os.ftruncate(fd, len(data))
                    if self.durable and not use_syncfs:
                        os_fsync(fd)
                except OSError as exc:
                    raise _naming(exc, path) from None
                finally:
                    os.close(fd)
            if use_syncfs and paths:
                self._flush_fs()
        except OSError as exc:
            self.discard(paths)
            raise write_failed(exc, self.root) from None
        except BaseException:
            self.discard(paths)
            raise
        return paths

    def discard(self, paths: Sequence[str]) -> None:
        """Remove pre-staged files that will not be published (back into the pool), emptied.

        Emptied first: a batch refused by a full disk kept its payloads in the pool, up to
        `pool_size` files of them, so the disk stayed full and `recover` (which trims the
        pool past its size only) freed nothing; a batch refused for a conflict left what it
        refused readable there. Not the hot path: a retired job file keeps its bytes."""
        for path in paths:
            try:
                os.truncate(path, 0)
                self._retire(path)
            except OSError:
                _quiet_unlink(path)

    def _stage(self, data: bytes, *, fsync: bool) -> str:
        """Write `data` into a staging file and return its path (data flushed if `fsync`)."""
        path, fd, size = self._staging_file()
        try:
            _write_all(fd, data)
            if size > len(data):
                os.ftruncate(fd, len(data))
            if fsync:
                os_fsync(fd)
        except BaseException as exc:
            os.close(fd)
            _quiet_unlink(path)
            if isinstance(exc, OSError):
                raise _naming(exc, path) from None
            raise
        os.close(fd)
        return path

    def _staging_file(self, suffix: str = ".tmp", reserve: int = 0) -> tuple[str, int, int]:
        """An open staging file in `tmp/`: (path, fd, its current size).

        A recycled file is taken from `tmp/pool/` by renaming it to a name of
        ours: a rename succeeds for exactly one taker, so two processes (or a
        producer staging outside the lock and a writer inside it) can never
        write one inode. It is then overwritten in place and cut to length
        afterwards, not opened with O_TRUNC: truncating first frees its blocks
        only for the write to allocate them again, which measured several times
        the cost of the overwrite. Only when the pool is empty is a new inode
        created (the costly part of a state change on this kind of disk).
        """
        self._check_fork()
        for _ in range(2):
            while len(self._pool) > reserve:
                name = self._pool.pop()
                path = os.path.join(self._tmp, staging_name(suffix))
                try:
                    os_replace(os.path.join(self._pool_dir, name), path)
                except FileNotFoundError:
                    continue  # another process took it
                try:
                    fd = os.open(path, _RECYCLED_FLAGS)
                except OSError as exc:
                    if exc.errno not in _NOT_REUSABLE:
                        _quiet_unlink(path)
                        raise
                    # Another user's file (one root's command recycled), or no file at all:
                    # not ours to reuse, and failing on it stopped this user's worker for
                    # good (a directory in the pool wedged every write and `recover`).
                    _remove_entry(path)
                    continue
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    # A device or a FIFO that opened (written to, the job was gone), or a
                    # file linked elsewhere too (overwritten in place, the other name's
                    # contents changed): dropped, as a person's junk in `tmp/` is.
                    os.close(fd)
                    _remove_entry(path)
                    continue
                return path, fd, st.st_size
            if not self._refill_pool():
                break
        path = os.path.join(self._tmp, staging_name(suffix))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os_open(path, flags, self.file_mode)
        except FileNotFoundError:
            if not self._remake_scratch():
                raise
            fd = os_open(path, flags, self.file_mode)
        try:
            set_fd_mode(fd, self.file_mode)
        except BaseException:
            os.close(fd)
            _quiet_unlink(path)
            raise
        return path, fd, 0

    def _retire(self, path: str) -> None:
        """Remove a superseded file: recycle it into the pool while the pool has room."""
        self._check_fork()
        if len(self._pool) < self.pool_size:
            name = staging_name()
            try:
                os_replace(path, os.path.join(self._pool_dir, name))
                self._pool.append(name)
                return
            except FileNotFoundError:
                # The file is gone, or the pool is (an operator's `rm -rf tmp/pool` under a
                # live worker): returning here left every superseded copy in place, a
                # stale duplicate of each job until `recover`. Unlink it; remake the pool.
                self._remake_scratch()
        with contextlib.suppress(FileNotFoundError):
            os_unlink(path)

    def _flush_fs(self) -> None:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            _syncfs(fd)
        finally:
            os.close(fd)

    def flush_dirs(self, dirs: Iterable[str]) -> None:
        """Flush these directories now (a durable store only): what was removed from them
        reaches the disk before anything after this call does."""
        if self.durable:
            self._flush_dirs(dirs, use_syncfs=self.sync_mode == "syncfs")

    def _flush_dirs(self, dirs: Iterable[str], use_syncfs: bool) -> None:
        if use_syncfs:
            self._flush_fs()
            return
        for d in dirs:
            fsync_dir(self.root / d if d else self.root)



def _naming(exc: OSError, path: Path | str) -> OSError:
    """`exc` with the file it concerns (a failed fsync of a descriptor names none, and the
    error then named only the spool)."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os_fsync(fd)
    except OSError as exc:
        # Some filesystems refuse fsync on a directory; the rename is as durable as they allow.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise _naming(exc, path) from None
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o600) -> None:
    """Write one file outside the batch path (spool.json at creation): tmp, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{staging_name('.tmp')}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        set_fd_mode(fd, mode)
        _write_all(fd, data)
        if durable:
            os_fsync(fd)
    except BaseException:
        os.close(fd)
        _quiet_unlink(str(tmp))
        raise
    os.close(fd)
    try:
        os_replace(tmp, path)
    except BaseException:
        _quiet_unlink(str(tmp))
        raise
    if durable:
        fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os_write(fd, view)
        view = view[written:]


# A recycled file is opened without waiting and without following a link: a FIFO put in
# `tmp/pool/` hung the worker in open() for good (no reader ever comes), past SIGTERM.
_RECYCLED_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_NOT_REUSABLE = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENXIO, errno.ELOOP,
                           errno.ETXTBSY, errno.EOPNOTSUPP})


def remove_entry(path: str | os.PathLike[str]) -> bool:
    """Remove whatever a name in one of our own directories (`tmp/`, `quarantine/`, a
    state directory recovery moved aside) turned out to be: a file, a FIFO, a symlink
    (never followed) or a whole directory. False when nothing was there; other errors
    raise."""
    try:
        os_unlink(path)
        return True
    except FileNotFoundError:
        return False
    except (IsADirectoryError, PermissionError):
        # unlink(2) on a directory: EISDIR on Linux, EPERM where POSIX allows it.
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise
        except FileNotFoundError:
            return False
        shutil.rmtree(path)
        return True


def _remove_entry(path: str) -> None:
    """Remove what a pool name turned out to be, quietly: the pool is refilled anyway."""
    with contextlib.suppress(OSError):
        remove_entry(path)


def _quiet_unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
