"""Waiting for the spool lock where someone is waiting on the answer.

A process that holds the spool lock for long (a long `fenced` block, a process stopped
with SIGSTOP inside one, a stuck disk) holds every other process's changes, which is what
the lock is for; but a one-shot command waited silently, and `health` (a container's
HEALTHCHECK, a cron probe) waited with them for as long as it lasted: a spool no worker
could touch was never reported, because the check itself hung.

- `noticed(notice, after)`: this thread's takes of the spool lock stay one blocking `flock`
  each, and a timer calls `notice(after)` once if a take is still waiting `after` seconds
  in (a CLI command says what it waits for).
- `free_within(lock_path, root, seconds)`: whether the spool lock could be taken within
  `seconds`, asked by a thread of its own, on descriptors of its own, with blocking
  flocks (so the kernel queues it with every other waiter, and another thread of this
  process holding the lock counts too); `health` asks before it reads under the lock.
- `held_too_long(spool, seconds)`: the same question about a spool, naming its lock when
  the answer is no (`health`, the dashboard's actions).

Not polling with `LOCK_NB`: a poll loses to holders that re-take the lock as soon as they
let it go (busy workers), which starved a command for seconds to minutes and made a busy,
healthy spool look stuck (`lock.py`'s docstring measured the same for writers).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_here = threading.local()


@contextlib.contextmanager
def noticed(notice: Callable[[float], None], after: float = 2.0) -> Iterator[None]:
    """Within this block, a take of the spool lock by this thread that waits `after`
    seconds calls `notice(after)` once (from a timer thread) and goes on waiting."""
    previous = getattr(_here, "notice", None)
    _here.notice = (notice, after)
    try:
        yield
    finally:
        _here.notice = previous


def blocking_flock(flock: Callable[[int, int], None], fd: int, op: int) -> None:
    """`flock(fd, op)`, blocking, with this thread's notice (if any) armed meanwhile."""
    told = getattr(_here, "notice", None)
    if told is None:
        flock(fd, op)
        return
    try:
        # Free (most takes): taken at once, no timer. A thread per take cost a bulk
        # command ~0.24 ms a job. Busy: then the one blocking wait, queued as before.
        flock(fd, op | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    notice, after = told
    timer = threading.Timer(after, notice, args=(after,))
    timer.daemon = True
    timer.start()
    try:
        flock(fd, op)
    finally:
        timer.cancel()


# One helper per lock at a time: behind a lock held for hours (a stopped process), a
# dashboard or probe asking every few seconds would otherwise leave a thread and two
# descriptors blocked per question. A question asked while one is out waits on that one.
_asking: dict[tuple[str, str], threading.Event] = {}
_asking_mutex = threading.Lock()
_helper_fds: set[int] = set()  # descriptors a helper holds open now (under the mutex)


def _after_fork_in_child() -> None:
    """A child forked while a helper waited (a `multiprocessing` pool after a `health`)
    inherits its descriptors, which kept the spool lock held once the parent's helper had
    taken it and closed its own (flocks belong to the open file description): every
    writer of the spool hung for the child's life. And the helper's event, which no thread
    of the child would ever set: each `health` there answered `lock_held`."""
    global _asking_mutex
    _asking_mutex = threading.Lock()  # a helper may have held it at the fork
    _asking.clear()
    for fd in list(_helper_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _helper_fds.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def free_within(lock_path: Path, root: Path, seconds: float) -> bool:
    """Whether the spool lock (`lock_path`'s flock, then `root`'s) could be taken within
    `seconds`; taken by a helper thread on descriptors of its own and let go at once.

    False also when `lock_path` cannot be opened: the caller's own take then says why.
    The helper outlives a False answer, blocked until the holder lets go; it then lets go
    itself and closes what it opened (a daemon: it never holds the process's exit). Until
    then, later questions about the same lock wait on it rather than start another.
    """
    key = (str(lock_path), str(root))
    with _asking_mutex:
        got = _asking.get(key)
        if got is None:
            got = _asking[key] = threading.Event()
            threading.Thread(target=_take, args=(lock_path, root, key, got),
                             name="jobspool-lock-probe", daemon=True).start()
    return got.wait(seconds)


def held_too_long(spool: Any, seconds: float) -> Path | None:
    """The path of a file spool's lock when it could not be taken within `seconds`
    (`free_within`); None when it could, when this thread holds it already (inside its own
    fenced block a helper asking for it would wait on the caller), or for a store with no
    spool lock. `health` and the dashboard's actions ask before they take it."""
    lock = getattr(spool, "lock", None)
    path = getattr(lock, "path", None)
    if path is None or getattr(lock, "held", False):
        return None
    return None if free_within(path, Path(spool.root), seconds) else Path(path)


def _take(lock_path: Path, root: Path, key: tuple[str, str], got: threading.Event) -> None:
    fds: list[int] = []
    try:
        for path, flags in ((lock_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC),
                            (root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)):
            with _asking_mutex:  # known before a fork can copy it
                fd = os.open(path, flags)
                fds.append(fd)
                _helper_fds.add(fd)
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass  # not ours to judge: the caller's take reports it
    finally:
        with _asking_mutex:
            for fd in fds:
                _helper_fds.discard(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing lets go of its flock
            _asking.pop(key, None)
        got.set()
