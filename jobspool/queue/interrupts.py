"""Keep SIGINT and SIGTERM out of a batch of renames.

A Ctrl-C (KeyboardInterrupt, raised at any bytecode) or a SIGTERM in the middle of a
store batch left a job in two directories or a staged temp file behind: nothing lost,
but `fsck` failed until `recover` ran. Python runs signal handlers in the main thread
only, so a batch in any other thread is never interrupted. In the main thread, the
handlers are swapped for one that only records the signal, for the batch; the signal is
delivered to the handler it was meant for right after. Blocking the signals in the main
thread (`pthread_sigmask`, as this did first) was not enough: the kernel hands a
process-wide signal to any thread not blocking it, whose C handler still makes Python
raise in the main thread at its next bytecode — any program with a second thread (a
pool, a logging thread) had its batches cut in half by Ctrl-C.

Nested sections defer to the outermost, which delivers. `deferred()` yields a probe
saying whether a signal came meanwhile: a claim that took leases then gives them back
before the KeyboardInterrupt leaves it, instead of leaving them to nobody until expiry.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# The C functions where there are (CPython's `_signal`): `signal.signal` converts to and
# from enums, ~3 µs a call, four calls a batch; these take 0.2.
_raw: Any = signal
with contextlib.suppress(ImportError):
    _raw = importlib.import_module("_signal")

_DEFERRED = (signal.SIGINT, signal.SIGTERM)
_MAIN = threading.main_thread()
_caught: list[int] = []  # main thread only: signals held by the open section
_depth = 0


def _hold(signum: int, frame: FrameType | None) -> None:
    _caught.append(signum)


def _loop_handled(handler: object) -> bool:
    """asyncio's `add_signal_handler` (anyio's signal receivers, a Worker's own): its
    Python handler does nothing, the loop learns of the signal from the wakeup fd, which
    the C handler writes whatever Python handler is in place — so it is never raised in a
    batch, and delivering it again after the batch ran its callback twice (one SIGTERM
    read as two: a worker released every lease at once instead of finishing)."""
    return getattr(handler, "__name__", "") == "_sighandler_noop"


class Section:
    """What `deferred()` yields: whether a signal came meanwhile, and its delivery."""

    def __init__(self, saved: list[tuple[int, Any]] | None) -> None:
        self._saved = saved  # None: not the outermost section (that one delivers)

    def pending(self) -> bool:
        return self._saved is not None and bool(_caught)

    def deliver(self) -> None:
        """Put the handlers back and deliver what came meanwhile, now (the outermost
        section only; later it does nothing). Every signal is delivered even when a
        handler raises (the first exception is raised after the others ran): a SIGTERM
        and a Ctrl-C in one batch lost the second."""
        global _depth
        saved, self._saved = self._saved, None
        if saved is None:
            return
        _depth = 0
        for sig, old in saved:
            _raw.signal(sig, old)
        held = list(dict.fromkeys(_caught))
        _caught.clear()
        first: BaseException | None = None
        for signum in held:
            try:
                signal.raise_signal(signum)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first


_INNER = Section(None)


@contextmanager
def deferred() -> Iterator[Section]:
    global _depth
    if threading.current_thread() is not _MAIN:
        yield _INNER
        return
    if _depth:
        _depth += 1
        try:
            yield _INNER
        finally:
            _depth = max(0, _depth - 1)
        return
    saved: list[tuple[int, Any]] = []
    for sig in _DEFERRED:
        old = _raw.getsignal(sig)
        # A handler not installed from Python (None) cannot be put back; ignored is ignored.
        if old is not None and old != signal.SIG_IGN and not _loop_handled(old):
            saved.append((sig, old))
    _caught.clear()
    _depth = 1
    section = Section(saved)
    try:
        for signum, _ in saved:
            _raw.signal(signum, _hold)
        yield section
    finally:
        section.deliver()


__all__ = ["Section", "deferred", "stop_signals"]


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM and SIGINT; and SIGHUP (the terminal it ran in closed: an ssh session that
    dropped) when nothing else claimed it: by default it killed the worker mid-handler, its
    leases left to expire. Ignored (`nohup`) or handled by the application, it is left so."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is not None and signal.getsignal(hup) == signal.SIG_DFL:
        return (signal.SIGTERM, signal.SIGINT, hup)
    return (signal.SIGTERM, signal.SIGINT)
