"""The spool's mutation lock: a thread lock paired with blocking `flock`s on the spool.

What it protects against: two processes, or two threads of one process,
interleaving the steps of state changes (a claim reading a job another
claim is moving). `flock` locks belong to the open file description, so
threads sharing one descriptor are not excluded from each other by it:
a thread lock does that (`handover.py`). The lock is re-entrant within a thread so
that `ctx.fenced()` may call `heartbeat` while holding it, and a worker may end the hold
of a handler it abandoned inside a fenced block.

Two flocks are taken, in this order: one on `<root>/.lock` (the lock DESIGN
§2 names, which outside tools may also take) and one on the spool's root
directory itself. The second is what makes an operator's `rm .lock` harmless:
a process still holding the deleted file's lock and a newcomer locking the
freshly created `.lock` would otherwise both hold "the" lock (measured: 230
tokens issued twice, jobs overwritten). A directory cannot be unlinked while
it holds the spool, so every process always meets on the same inode there.
After locking, a process also checks that the `.lock` it holds is the one at
the path; if it was deleted or replaced, it reopens it (reading the shared
data below from the new file, and telling its caches to start over).

The lock is taken *blocking* (`LOCK_EX` without `LOCK_NB`): the kernel
queues waiters, which measured fair (p99 3.4 ms, 50/50 share between two
processes), where a non-blocking poll starved one process for seconds.

What it does not protect against: a process that writes the spool without
taking the lock, or a spool on a network filesystem where `flock` is not
coherent across machines (an `ENOLCK` there is reported as a `SpoolError`).

The same file also carries one change counter per state directory (the
*generation*), read and written in place with positional reads and writes
(every process sees the others' through the page cache). Not through a
memory map, as before: a map touched past the end of a `.lock` an operator
emptied (`: > .lock`) is a SIGBUS, and every process on the spool died of it
at any moment; a read past the end is zeros, and the next holder starts the
counters over (`_grow_back`). Every mutation bumps the counters of
the directories it touched, under the lock. A process that cached a
directory listing can then tell, in one memory read, whether anyone changed
that directory since — so a claim does not relist `ready/` while nothing
changed. The counters are hints for caches, never a source of truth: their
content after a crash, a reboot or a deleted `.lock` does not matter.

`read_only=True` opens an existing `.lock` without write access (a user who
may only read the spool): the writer-side methods must not be called.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from jobspool.errors import SpoolClosed, SpoolError
from jobspool.queue import fencedmark, lockwait
from jobspool.queue.changelog import RING_BYTES, ChangeRing
from jobspool.queue.diskerrors import os_hint, spool_missing
from jobspool.queue.handover import HandoverLock
from jobspool.queue.perms import set_fd_mode
from jobspool.queue.procid import current_pid

# Generations and flags in the first page, the ready/ change ring after it.
_MAP_SIZE = 4096 + (-(-RING_BYTES // 4096)) * 4096
_SLOT = struct.Struct("<Q")
_GENERATION_SLOTS = 12
# The slots read once per hold (`SpoolLock._page`): all of them but the group flush's
# (17..31), which leaders write under the flush lock alone, outside any hold.
_PAGE_SLOTS = 34
_PAGE_BYTES = _PAGE_SLOTS * _SLOT.size
_GROUP_SLOTS = (17, 31)

# Seams for fault injection.
os_flock = fcntl.flock


def _flock(fd: int, op: int, path: Path) -> None:
    while True:
        try:
            lockwait.blocking_flock(os_flock, fd, op)
            return
        except InterruptedError:
            continue
        except OSError as exc:
            hint = ("a spool must live on a local filesystem (flock is not supported here)"
                    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS) else
                    "check the spool's permissions and filesystem")
            raise SpoolError(f"cannot lock {path}: {exc.strerror or exc}; {hint}",
                             path=str(path)) from None


def _not_a_lock_file(path: Path) -> SpoolError:
    return SpoolError(f"the spool lock {path} is not a regular file (replaced by hand?): "
                      "no command can use the spool; move it away (`rmdir` or `mv`), and the "
                      "next command that writes recreates it", path=str(path))


def _boot_hash() -> int:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            text = f.read().replace("-", "").strip()
        return int(text[:15], 16) or 1
    except (OSError, ValueError):
        return 1  # unknown: never a reboot seen, the disk ceiling still bounds tokens


class SpoolLock:
    """Cross-process, cross-thread, re-entrant exclusive lock on one spool."""

    ring: ChangeRing

    def __init__(self, path: Path, *, read_only: bool = False, mode: int = 0o600,
                 on_reopen: Callable[[], None] | None = None) -> None:
        self._path = path
        self._root = path.parent
        self.read_only = read_only
        self._mode = mode
        self.on_reopen = on_reopen
        self._thread_lock = HandoverLock(self._let_go_for_cut)
        self._boot = _boot_hash()
        self._dir_fd = -1
        self._fd = -1
        self._closed = False
        self._inherited = 0  # levels of a hold a forked child inherited (`drop_after_fork`)
        self._emptied = False  # `.lock` found emptied by hand at open (`_grow_back`)
        self._page: bytearray | None = None  # the slots as of this hold (`generation`)
        self._open()
        _LOCKS.add(self)

    def _open(self) -> None:
        # A forked child must not share the parent's open file description: flock
        # locks belong to it, so parent and child would not exclude each other.
        self._pid = os.getpid()
        try:
            # O_NONBLOCK: a FIFO put at the path (by hand) blocked a reader's open for ever,
            # before the check below could refuse it; a regular file ignores the flag.
            if self.read_only:
                fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            else:
                fd, created = _open_or_create(self._path, self._mode)
                with contextlib.suppress(OSError):  # another user's lock file: leave its mode
                    set_fd_mode(fd, self._mode, may_exist=True)
            dir_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            if not self._root.is_dir():
                raise spool_missing(self._root) from None
            if self.read_only and isinstance(exc, FileNotFoundError):
                # A reader cannot make it; any writer does (the probe's `rm .lock`).
                raise SpoolError(f"the spool lock {self._path} is missing (deleted?); any "
                                 "command that writes, e.g. `jobspool recover`, recreates it",
                                 path=str(self._path)) from None
            if isinstance(exc, IsADirectoryError):
                raise _not_a_lock_file(self._path) from None
            raise SpoolError(f"cannot open the spool lock {self._path}: "
                             f"{exc.strerror or exc}", path=str(self._path)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            # A reader opens a directory put there by hand without a word, and answered
            # "consistent" (`fsck`, `health`) for a spool every writer refused.
            os.close(fd)
            os.close(dir_fd)
            raise _not_a_lock_file(self._path)
        self._fd, self._dir_fd = fd, dir_fd
        self._ident = (st.st_dev, st.st_ino)
        if not self.read_only:
            # Growing to a fixed size is idempotent, so racing openers agree; we never
            # shrink it. Allocated, a full disk is an error here, not at a later write.
            if st.st_size < _MAP_SIZE or st.st_blocks * 512 < _MAP_SIZE:
                _allocate(fd, self._path)
            # Short, and not of our making: emptied by hand. Its shared state starts over
            # at the first hold (`_grow_back`), under the lock.
            self._emptied = st.st_size < _MAP_SIZE and not created
        if not hasattr(self, "ring"):
            self.ring = ChangeRing(self._read, self._write)

    def drop_after_fork(self) -> None:
        """In a forked child, at once: close the copies of the flocked descriptors, which
        kept the parent's lock alive for as long as the child lived. A child that never
        used the spool (a `multiprocessing` worker, a helper the parent forked while a
        thread held the lock) blocked every process on it after the parent died. Closing
        a copy unlocks nothing: the parent's descriptor holds the lock as before.

        The child's own are made here too, while it has one thread: made lazily by the
        first `acquire`, several threads of the child each closed descriptors another had
        just locked and swapped the thread lock under its holder (deadlocks, two threads
        inside the lock, a job left both ready and leased).

        Forked by the thread that held it (inside `fenced`): the child holds nothing (the
        lock is its parent's), so its next `acquire` takes the lock for real, waiting for
        the parent's block to end, and the releases of the levels it inherited are
        ignored (`_inherited`): one ran the count below zero (a traceback, then a child
        that never took the lock again)."""
        inherited = self._thread_lock.levels_here()  # held, or cut and not unwound yet
        self._close_fds()
        self._thread_lock = HandoverLock(self._let_go_for_cut)
        self._inherited = inherited
        self._pid = os.getpid()
        if self._closed:
            return
        try:
            self._open()
        except (OSError, SpoolError):
            return  # the spool is gone: the next `acquire` tries again (`_fd < 0`)

    def _close_fds(self) -> None:
        self._page = None
        for fd in (self._fd, self._dir_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._dir_fd = -1

    def __del__(self) -> None:
        # A spool dropped without close() kept its two descriptors for the life of the
        # process: a service opening a Spool per request ran out of them.
        if getattr(self, "_fd", -1) >= 0 or getattr(self, "_dir_fd", -1) >= 0:
            self._close_fds()

    def _reopen_after_fork(self) -> None:
        # The parent's descriptors stay open in the parent; the child drops its copies.
        self._close_fds()
        self._thread_lock = HandoverLock(self._let_go_for_cut)
        self._open()

    def _reopen(self) -> None:
        """Switch to the `.lock` at the path. When that fails (the spool directory is gone)
        the descriptors stay closed (the shared data reads as zeros meanwhile): the next
        `acquire` tries again, so a spool re-created at its path is found without
        reopening the Spool."""
        self._close_fds()
        self._open()

    def _still_at_path(self) -> bool:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    def _lock_files(self) -> None:
        """Take both flocks, reopening `.lock` while the one we hold is no longer at the path."""
        for _ in range(100):
            _flock(self._fd, fcntl.LOCK_EX, self._path)
            try:
                _flock(self._dir_fd, fcntl.LOCK_EX, self._root)
            except BaseException:
                # Refused or interrupted (a signal's exception out of the wait): the lock
                # is not ours, so neither half may stay held, or every other process
                # waits on it.
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
            if self._still_at_path():
                return
            if self.read_only and not self._path.exists():
                return  # nothing to re-create; the directory lock alone excludes writers
            # `.lock` was deleted or replaced under us (an operator's rm): switch to the
            # file at the path so the shared counters are shared again. Holding the
            # directory lock, no other process is mid-change; theirs will notice too.
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._reopen()
            self._after_reopen = True
        raise SpoolError(f"{self._path} keeps changing under us; is something deleting it?",
                         path=str(self._path))

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """`SpoolClosed` after `close()`: for readers, which read without the lock (a `wait`
        on a closed spool polled for ever)."""
        if self._closed:
            raise SpoolClosed(self._root)

    @property
    def path(self) -> Path:
        return self._path

    def acquire(self) -> None:
        if self._closed:  # else a cryptic "file descriptor cannot be a negative integer"
            raise SpoolClosed(self._root)
        if self._pid != current_pid():
            self._reopen_after_fork()
        block = fencedmark.block_thread()
        if block is not None and block != threading.get_ident() \
                and self._thread_lock.owner == block:
            # Handed from inside a fenced block whose thread holds this lock: it may be
            # waiting for this very call (for ever), or not (work it did not await).
            if not self._thread_lock.acquire(timeout=fencedmark.HANDED_WAIT_SECONDS):
                raise fencedmark.refusal()
        else:
            self._thread_lock.acquire()
        first = self._thread_lock.count == 1
        if self._closed and first:  # closed by another thread while we waited
            self._thread_lock.release()
            raise SpoolClosed(self._root)
        if first:
            self._after_reopen = False
            try:
                if self._fd < 0:  # an earlier reopen failed: the spool was gone
                    self._reopen()
                    self._after_reopen = True
                self._lock_files()
            except BaseException:
                self._thread_lock.release()
                raise
            # The counters only a holder writes, read once for the whole hold (a read of
            # the file apiece was a system call each, ~20 per enqueue).
            self._page = bytearray(self._read(0, _PAGE_BYTES))
            if self._after_reopen:
                self._forget_shared_state()
            elif self._emptied or self._shrunk():
                self._grow_back()
            if not self.read_only and self.generation(self.BOOT_SLOT) != self._boot:
                self._new_boot()
            if not self.read_only and self.generation(self.WRITER_SLOT):
                # Every writer clears its mark before letting the lock go: one still set
                # means its writer died mid-batch, so a job may have two copies. Flag it
                # now, before this holder picks claim candidates (the flag makes claims
                # check for newer copies); found only at our own `begin_write`, the first
                # claim after the crash ran a job whose completion was already on disk.
                self.bump(self.SUSPECT_SLOT)
                self.put(self.WRITER_SLOT, 0)

    @property
    def current_boot(self) -> bool:
        """Whether the shared counters were written since this machine booted."""
        return self.generation(self.BOOT_SLOT) == self._boot

    def _new_boot(self) -> None:
        """First holder since the machine booted (or of a new `.lock`): the shared data
        predates a reboot, when a power loss may have left two copies of a job (claims
        check for them until recovery runs) and the token counter must restart from disk."""
        if self.generation(self.BOOT_SLOT) != 0:
            self.bump(self.SUSPECT_SLOT)
        self.put(self.FENCE_NEXT_SLOT, 0)
        self.put(self.FENCE_CEILING_SLOT, 0)
        self.put(self.BOOT_SLOT, self._boot)

    def _shrunk(self) -> bool:
        """Whether `.lock` is shorter than its shared data (emptied by hand: `: > .lock`).
        Asked once per hold: the data reads as zeros past the end, and the counters must
        start over (`_grow_back`), not from those zeros."""
        try:
            return os.fstat(self._fd).st_size < _MAP_SIZE
        except OSError:
            return False  # a descriptor that cannot be asked: the next open says why

    def _grow_back(self) -> None:
        """Under both flocks: give the emptied `.lock` its size again (its content is
        gone: zeros) and start the shared state over (`_forget_shared_state`). The
        publication and flush numbers restart at 0, which only makes the next producer
        lead its own flush; the token counter re-reads its ceiling from disk. A reader
        cannot grow it: it reads zeros until a writer has, and forgets its caches."""
        self._emptied = False
        if not self.read_only:
            _allocate(self._fd, self._path)
        self._forget_shared_state()

    def _forget_shared_state(self) -> None:
        """After switching to a new `.lock`: every cache built on the old counters is void,
        and a writer may have died mid-batch unseen (its in-flight mark was in the old file)."""
        if not self.read_only:
            # Restarted at random values, not bumped: a counter that restarted from 0 (the
            # file emptied, or a new one) and came round again to the value a cache holds
            # would pass that cache for current.
            for slot in range(_GENERATION_SLOTS):
                self.put(slot, secrets.randbits(48) | 1)
            self.bump(self.SUSPECT_SLOT)
            self.put(self.FENCE_CEILING_SLOT, 0)  # re-read the token ceiling from disk
        if self.on_reopen is not None:
            self.on_reopen()

    def release(self) -> None:
        lock = self._thread_lock
        if not lock._is_owned():
            if self._inherited:
                self._inherited -= 1  # the end of a block its parent entered: nothing to let go
                return
            lock.release()  # a level of a hold that was cut (`cut`): nothing to let go
            return
        if lock.count == 1:
            if self._closed:  # closed by this holder inside its block: now it goes
                try:
                    self._close_now()
                finally:
                    self._thread_lock.release()
                return
            try:
                self._unlock_files()
            finally:
                lock.release()
        else:
            lock.release()

    def _let_go_for_cut(self) -> None:
        if self._closed:  # closed by the holder inside its block: it goes with the hold
            self._close_now()
        else:
            self._unlock_files()

    def _unlock_files(self) -> None:
        self._page = None  # before the flocks go: another process may change them then
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            # Closing a descriptor drops its lock for certain: never leave other
            # processes blocked behind a lock we failed to release.
            self._close_fds()
            self._open()

    @property
    def held(self) -> bool:
        """True when the calling thread holds the lock."""
        return self._thread_lock._is_owned()

    @property
    def nested(self) -> bool:
        """True when the calling thread holds the lock inside an outer hold of its own (a
        fenced block, a schedule's tick): the inner hold's end does not release it."""
        return self._thread_lock.count > 1 and self._thread_lock._is_owned()

    @property
    def threads(self) -> HandoverLock:
        """The thread half: where a fenced block allows its hold to be cut, and a worker
        giving up on a handler cuts it (`handover.py`; the flocks go with the hold)."""
        return self._thread_lock

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    # ------------------------------------------------------------ generations

    def _read(self, offset: int, size: int) -> bytes:
        """`size` bytes of the shared data at `offset`; zeros past the file's end (emptied
        by hand) or while the spool is away (a failed reopen). Positional reads, not a
        memory map: a map touched past the end of a file someone emptied is a SIGBUS, and
        every process on the spool died of it, at any moment, not only in its next hold."""
        fd = self._fd
        if fd < 0:
            if self._closed:
                raise ValueError("the spool lock's shared data is closed")
            return bytes(size)
        data = os.pread(fd, size, offset)
        return data if len(data) == size else data.ljust(size, b"\0")

    def _write(self, offset: int, data: bytes) -> None:
        """Write shared data at `offset` (past a short file's end it grows it, sparse)."""
        fd = self._fd
        if fd < 0:
            if self._closed:
                raise ValueError("the spool lock's shared data is closed")
            return  # the spool is away: hints only, and the next hold starts them over
        os.pwrite(fd, data, offset)

    def generation(self, slot: int) -> int:
        page = self._page
        if page is not None and slot < _PAGE_SLOTS and not _GROUP_SLOTS[0] <= slot <= _GROUP_SLOTS[1]:
            # Held (by some thread of ours): no other process can change these now, and
            # our own writes went to the page too.
            return int(_SLOT.unpack_from(page, slot * _SLOT.size)[0])
        return int(_SLOT.unpack(self._read(slot * _SLOT.size, _SLOT.size))[0])

    def put(self, slot: int, value: int) -> None:
        """Set a slot; call only while holding the lock."""
        raw = _SLOT.pack(value & 0xFFFFFFFFFFFFFFFF)
        self._write(slot * _SLOT.size, raw)
        page = self._page
        if page is not None and slot < _PAGE_SLOTS:
            page[slot * _SLOT.size:(slot + 1) * _SLOT.size] = raw

    def bump(self, slot: int) -> int:
        """Increment a directory's change counter; call only while holding the lock."""
        value = (self.generation(slot) + 1) & 0xFFFFFFFFFFFFFFFF
        self.put(slot, value)
        return value

    # Slots past the per-state generations: a writer in flight, and crash suspicion.
    WRITER_SLOT = _GENERATION_SLOTS
    SUSPECT_SLOT = 13
    # The fencing counter (fence.py): last token handed out, the ceiling flushed to disk
    # when it was read, and which boot wrote them.
    FENCE_NEXT_SLOT = 14
    FENCE_CEILING_SLOT = 15
    BOOT_SLOT = 16
    # Terminal writes by every process since the last automatic prune (journal.py); 17..31
    # are the group flush's (groupflush.py).
    TERMINAL_SLOT = 32
    # The fence file as this scheme last wrote or read it (fence.py: `_moved_on_disk`).
    FENCE_FILE_SLOT = 33

    def begin_write(self) -> None:
        """Mark a batch of renames in flight (under the lock). A mark found still set is
        a writer that died mid-batch: `acquire` flags that, before anything is read."""
        self.put(self.WRITER_SLOT, current_pid())

    def end_write(self, *, clean: bool) -> None:
        if not clean:
            self.bump(self.SUSPECT_SLOT)
        self.put(self.WRITER_SLOT, 0)

    def suspect(self) -> int:
        """Non-zero while a writer may have died mid-batch since the last recovery. Lives in
        shared memory: it survives a process crash, not a reboot (recovery runs on boot)."""
        return self.generation(self.SUSPECT_SLOT)

    def clear_suspect(self, seen: int) -> None:
        """Clear the suspicion recovery started from, unless a new one arrived meanwhile."""
        if self.generation(self.SUSPECT_SLOT) == seen:
            self.put(self.SUSPECT_SLOT, 0)

    def close(self) -> None:
        """Close, after the operations other threads have in flight here: closing under
        them dropped their flock mid-change (another process then moved a job inside a
        fenced block) and left them a map and descriptors that were gone."""
        if self._pid != current_pid():
            # A forked child closing its copy: a parent thread may have held the thread
            # lock at the fork, and it stays held in the child for ever (the close hung).
            self._thread_lock = HandoverLock(self._let_go_for_cut)
        self._thread_lock.acquire(cut_ok=True)  # from a block that was cut too
        try:
            if self._closed:
                return
            self._closed = True
            if self._thread_lock.count > 1:
                # Called by the holder itself (inside a fenced block): the lock goes when
                # the block ends (`release`), not from under it.
                return
            self._close_now()
        finally:
            self._thread_lock.release()

    def _close_now(self) -> None:
        self._close_fds()


def _open_or_create(path: Path, mode: int) -> tuple[int, bool]:
    """`.lock` opened for writing, and whether this call created it (a short file it did
    not create was emptied by hand: `_open`)."""
    flags = os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(10):
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
        except FileExistsError:
            pass
        try:
            return os.open(path, flags), False
        except FileNotFoundError:
            continue  # deleted between the two opens: try to create it again
    return os.open(path, flags | os.O_CREAT, mode), False


_LOCKS: weakref.WeakSet[SpoolLock] = weakref.WeakSet()


def _drop_locks_after_fork() -> None:
    for lock in list(_LOCKS):
        lock.drop_after_fork()


os.register_at_fork(after_in_child=_drop_locks_after_fork)


def _allocate(fd: int, path: Path) -> None:
    """Give the lock file its disk blocks now. `ftruncate` makes a sparse file; its pages
    got blocks only when first written (through the map, as it was: on a full disk a
    SIGBUS, producers and workers dying with exit 135, one after publishing its job).
    Allocated at open, a full disk is an error here instead (and a file size limit under
    88 KiB, RLIMIT_FSIZE, a one-line one, not an OSError)."""
    try:
        if os.fstat(fd).st_size < _MAP_SIZE:
            os.ftruncate(fd, _MAP_SIZE)
        os.posix_fallocate(fd, 0, _MAP_SIZE)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # a filesystem without it: as sparse as before
        hint = os_hint(exc.errno)
        raise SpoolError(f"cannot allocate the spool lock {path}: {exc.strerror or exc}"
                         + (f"; {hint}" if hint else ""), path=str(path)) from None

