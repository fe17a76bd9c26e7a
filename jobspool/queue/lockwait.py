"""Bounded waits for the spool lock, for readers that must answer.

A process that holds the spool lock for long (a long `fenced` block, a process stopped
with SIGSTOP inside one, a stuck disk) holds every other process's changes, which is what
the lock is for; but `health` (a container's HEALTHCHECK, a cron probe) waited with them,
silently, for as long as it lasted: a spool no worker could touch was never reported,
because the check itself hung. Under `bounded(...)` this thread's takes of the lock poll
(`LOCK_NB`) instead of sleeping in the kernel: after `notice_after` seconds `notice(waited)`
is called once (a CLI command says what it waits for), and past `limit` the take gives up
with `SpoolBusy`. Without it (every other caller) the lock is taken as before: one blocking
`flock`, no polling.
"""

from __future__ import annotations

import errno
import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobspool.errors import SpoolBusy

# Polls start fast (a holder's usual change is well under a millisecond) and back off to
# this, so a long wait costs a few wakeups a second.
_MAX_NAP = 0.1


@dataclass(frozen=True)
class _Policy:
    limit: float | None
    notice: Callable[[float], None] | None
    notice_after: float


_here = threading.local()


@contextmanager
def bounded(limit: float | None, *, notice: Callable[[float], None] | None = None,
            notice_after: float = 2.0) -> Iterator[None]:
    """Within this block, this thread waits at most `limit` seconds (None: as long as it
    takes) for each take of a spool lock, telling `notice` once if it waited `notice_after`."""
    previous = getattr(_here, "policy", None)
    _here.policy = _Policy(limit, notice, notice_after)
    try:
        yield
    finally:
        _here.policy = previous


def policy() -> _Policy | None:
    """This thread's policy, if a `bounded` block is open."""
    return getattr(_here, "policy", None)


def wait_for(flock: Callable[[int, int], None], fd: int, op: int, path: Path,
             rule: _Policy) -> None:
    """Take `op` (an exclusive or shared flock) on `fd` under `rule`; `SpoolBusy` past its
    limit. Other errors of `flock` go to the caller as they are."""
    started = time.monotonic()
    nap = 0.001
    told = False
    while True:
        try:
            flock(fd, op | fcntl.LOCK_NB)
            return
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        waited = time.monotonic() - started
        if rule.limit is not None and waited >= rule.limit:
            raise SpoolBusy(f"the spool lock {path} has been held by another process for "
                            f"over {rule.limit:g} s (a long fenced block, or a stopped or "
                            "stuck process: every writer waits for it)", path=str(path))
        if not told and rule.notice is not None and waited >= rule.notice_after:
            told = True
            rule.notice(waited)
        left = None if rule.limit is None else rule.limit - waited
        time.sleep(nap if left is None else max(0.0, min(nap, left)))
        nap = min(_MAX_NAP, nap * 2)
