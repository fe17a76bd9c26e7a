"""Group commit: concurrent producers share the flush that makes their jobs durable.

A durable enqueue publishes its (already flushed) job files with renames
under the spool lock, and must then flush the directories it renamed into
before it returns. Done under the lock, that flush serializes every
producer behind it. Instead the producer takes a *publication number* under
the lock (`PUBLISHED_SLOT`, after bumping the generation of each directory
it changed), releases the lock, and waits for a flush covering that number:

- it takes the flush lock (a `flock` on `tmp/`, apart from the spool lock);
- if a flush already covered its number (`FLUSHED_SLOT`), it is done — some
  other producer flushed for it while it waited;
- otherwise it leads: under the spool lock (a few microseconds) it reads the
  last publication number and which directories changed since the last
  group flush (their generations against `FLUSHED_GEN_BASE + slot`), flushes
  those directories outside the spool lock, and records the number (under the flush
  lock only: leaders are the only writers of what it records).

Every publication up to the number read bumped its directories' generations
before taking its number, under the same lock, so the leader's flush covers
all of them. One producer alone pays no extra flush: it leads at once.

What it protects against: nothing new — the same two flushes per change, now
shared. Between the rename and the flush a job is visible before it is
durable (another worker may claim it); a power loss then returns it to where
an unacknowledged change may go (it vanishes, and its producer, which had not
returned, never reported it stored). Only pure inserts take this path: a
change that retires an old file must flush before retiring it (store.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

from jobspool.errors import SpoolClosed
from jobspool.queue.lock import SpoolLock
from jobspool.queue.procid import current_pid

PUBLISHED_SLOT = 17
FLUSHED_SLOT = 18
FLUSHED_GEN_BASE = 20  # + a directory's generation slot (0..11)


class GroupFlush:
    """One process's side of group commit for one spool (see the module docstring)."""

    def __init__(self, root: Path, lock: SpoolLock,
                 flush_dir: Callable[[Path], None]) -> None:
        self._root = root
        self._lock = lock
        self._flush_dir = flush_dir
        self._thread_lock = threading.Lock()  # flock does not exclude threads of one process
        self._fd = -1
        self._pid = -1
        self._closed = False
        _FLUSHES.add(self)

    def publish(self, slots: Iterable[int]) -> int:
        """Take a publication number for a batch that changed the directories `slots`
        (call under the spool lock, after bumping those directories' generations)."""
        del slots  # their generations were bumped by the caller; kept for the call's clarity
        return self._lock.bump(PUBLISHED_SLOT)

    def wait(self, number: int, slot_dirs: dict[int, str]) -> None:
        """Return once a flush covers publication `number` (call without the spool lock)."""
        if self._pid != current_pid():
            # Forked while another thread of the parent held it: the child's copy would
            # stay held for ever (its first enqueue hung).
            self._thread_lock = threading.Lock()
        with self._thread_lock:
            if self._closed:
                # The spool was closed after this thread published (its jobs are visible):
                # flush on our own rather than fail a call whose work is done.
                for d in set(slot_dirs.values()):
                    self._flush_dir(self._root / d)
                return
            fd = self._flush_fd()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                try:
                    if self._lock.generation(FLUSHED_SLOT) >= number:
                        return  # another producer's flush covered us while we waited
                    with self._lock.hold():
                        target = self._lock.generation(PUBLISHED_SLOT)
                        changed = {slot: g for slot in slot_dirs
                                   if (g := self._lock.generation(slot))
                                   != self._lock.generation(FLUSHED_GEN_BASE + slot)}
                except (SpoolClosed, ValueError):  # ValueError: its shared map closed
                    if not self._lock.closed:
                        raise
                    # Closed meanwhile (by a fenced block's holder, `close`): our jobs are
                    # published; flush for ourselves, as a waiter arriving after it does,
                    # rather than fail a call whose work is done (a regression probe).
                    for d in set(slot_dirs.values()):
                        self._flush_dir(self._root / d)
                    return
                for slot in changed:
                    self._flush_dir(self._root / slot_dirs[slot])
                # Without the spool lock: only leaders write these slots, and only under
                # the flush lock we hold (a second spool-lock hold cost four flocks and a
                # stat per enqueue). A leader that dies or fails before this line leaves
                # them behind, so the next one flushes those directories again.
                for slot, g in changed.items():
                    self._lock.put(FLUSHED_GEN_BASE + slot, g)
                if self._lock.generation(FLUSHED_SLOT) < target:
                    self._lock.put(FLUSHED_SLOT, target)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                if self._closed:
                    self._close_fd()  # closed meanwhile by the spool lock's holder (`close`)

    def _flush_fd(self) -> int:
        if self._fd < 0 or self._pid != current_pid():
            # After a fork the parent's descriptor would share its flock: open our own.
            self._pid = current_pid()
            self._fd = os.open(self._root / "tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._fd

    def drop_after_fork(self) -> None:
        # In a forked child, at once: its copy of a descriptor flocked by a parent thread
        # at the fork kept the flush lock held for the child's life (`SpoolLock` likewise).
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1  # the child's own is opened by its first flush, under the thread lock
        self._pid = os.getpid()
        self._thread_lock = threading.Lock()  # a parent thread may have held it

    def __del__(self) -> None:
        # Dropped without close() (a Spool never closed): the descriptor goes with it.
        fd = getattr(self, "_fd", -1)
        if fd >= 0 and self._pid == current_pid():
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self, *, holding_spool_lock: bool = False) -> None:
        """Close the flush lock's descriptor once no flush of this process is in flight.
        `holding_spool_lock`: the caller holds the spool lock (a close inside a fenced
        block), which a flush in flight may be waiting for: then that flush closes it
        when it ends. Waiting for it here hung every process of the spool (a lock-order
        probe: the holder waited for the flush, the flush for the spool lock)."""
        if self._pid != current_pid():
            self._thread_lock = threading.Lock()  # as in SpoolLock.close: held at the fork
        if not self._thread_lock.acquire(blocking=not holding_spool_lock):
            self._closed = True  # seen by the flush in flight as it ends (`wait`)
            return
        try:
            self._closed = True
            self._close_fd()
        finally:
            self._thread_lock.release()

    def _close_fd(self) -> None:
        if self._fd >= 0 and self._pid == current_pid():
            os.close(self._fd)
        self._fd = -1


_FLUSHES: weakref.WeakSet[GroupFlush] = weakref.WeakSet()


def _drop_after_fork() -> None:
    for flush in list(_FLUSHES):
        flush.drop_after_fork()


os.register_at_fork(after_in_child=_drop_after_fork)
