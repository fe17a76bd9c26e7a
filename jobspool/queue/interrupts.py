"""Keep SIGINT and SIGTERM out of a batch of renames.

A Ctrl-C (KeyboardInterrupt, raised at any bytecode) or a SIGTERM in the middle of a
store batch left a job in two directories or a staged temp file behind: nothing lost,
but `fsck` failed until `recover` ran. While the calling thread is the main thread (the
only one Python delivers signals to), both are blocked for the batch and arrive right
after it, between two batches. Other threads need nothing: a signal never interrupts them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_DEFERRED = {signal.SIGINT, signal.SIGTERM}
_MAIN = threading.main_thread()


@contextmanager
def deferred() -> Iterator[None]:
    if threading.current_thread() is not _MAIN:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


__all__ = ["deferred", "stop_signals"]


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM and SIGINT; and SIGHUP (the terminal it ran in closed: an ssh session that
    dropped) when nothing else claimed it: by default it killed the worker mid-handler, its
    leases left to expire. Ignored (`nohup`) or handled by the application, it is left so."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is not None and signal.getsignal(hup) == signal.SIG_DFL:
        return (signal.SIGTERM, signal.SIGINT, hup)
    return (signal.SIGTERM, signal.SIGINT)
