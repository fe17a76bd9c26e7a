"""The stop signals of the workers one process runs with `handle_signals`.

Each run listens through anyio's signal receiver, but an event loop keeps one handler per
signal: only the receiver opened last hears a signal, a receiver closed out of order
removes another's, and closing puts back what was there when it opened — not what the
application had. An application embedding two workers stopped one of them on SIGTERM,
and after they ended its own `loop.add_signal_handler` handler was gone (a SIGTERM then
did nothing, or killed the process).

So, here:
- a signal stops every such worker (one already stopping is hurried: the second signal);
- a run that ends while others go on leaves a handler that reaches them, whatever order
  the runs end in;
- the last to end puts back what the process had before the first began: its
  `signal.signal` handlers and an asyncio application's own loop handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable
from typing import Any, NoReturn, Protocol

log = logging.getLogger("jobspool.queue.worker")


class Stoppable(Protocol):
    grace_seconds: float

    @property
    def stopping(self) -> bool: ...

    def stop(self) -> None: ...

    def hurry(self) -> None: ...


_members: list[Stoppable] = []  # in start order
# Workers serving in other threads: a signal reaches only the main thread, whose worker
# then stops these too (they listen to nothing themselves).
_elsewhere: list[Stoppable] = []
_original: dict[str, Any] = {}  # what the process had before the first member began


def enter(worker: Stoppable, signals: Iterable[int]) -> None:
    """`worker` begins a run that listens for `signals` (from inside its event loop)."""
    if not _members:
        _original.clear()
        _original.update(_capture(tuple(signals)))
    _members.append(worker)


def leave(worker: Stoppable, signals: Iterable[int]) -> None:
    """`worker`'s run ended (its receiver closed); called from inside its event loop."""
    with contextlib.suppress(ValueError):
        _members.remove(worker)
    if _members:
        _install_fan_out(tuple(signals))
    else:
        _disarm()  # the runs ended: an embedding application goes on
        _restore(_original)
        _original.clear()


def attach(worker: Stoppable) -> None:
    """`worker` serves in a thread other than the main one: stopped with the others.

    Python hears signals in the main thread only, and a thread cannot install a
    handler. Such a worker is stopped by a signal when a worker in the main thread
    listens, by `stop()`, and when the main thread ends (a Ctrl-C's KeyboardInterrupt
    out of `thread.join()` included): before, that Ctrl-C printed a traceback and the
    worker thread went on claiming, the process held open by it.
    """
    global _warned_unheard
    _elsewhere.append(worker)
    if not threading.main_thread().is_alive():
        # The main thread ended before this run began (it started the thread and
        # returned): the hook below ran already, or could not be registered any more.
        _main_thread_ended()
        return
    if not _members and not _warned_unheard:
        _warned_unheard = True
        log.warning("a worker serving in thread %r cannot hear SIGTERM/SIGINT (Python "
                    "delivers signals to the main thread only): it stops on worker.stop(), "
                    "on a signal to a worker in the main thread, or when the main thread "
                    "ends; a SIGTERM with no handler ends the process at once, its leases "
                    "left to expire", threading.current_thread().name)


def _daemon_run(worker: Stoppable) -> bool:
    # A daemon thread's run is cut off at exit whatever it is told: "running handlers get
    # 30 s" would be false. Which thread runs a worker is not kept; the daemon flag of the
    # caller (the thread that attached, or the shutdown) cannot tell, so ask the worker.
    return bool(getattr(worker, "serving_daemon", False))


def _main_thread_ended() -> None:
    """The main thread is done (returned or raised): stop the workers serving elsewhere,
    which then drain as on a signal (their grace, then their leases released)."""
    for worker in list(_elsewhere):
        if not worker.stopping and not _daemon_run(worker):
            log.warning("the main thread ended: stopping the worker serving in another "
                        "thread (running handlers get %g s)", worker.grace_seconds)
            worker.stop()


_warned_unheard = False


def _hook_main_exit() -> None:
    # Run by the interpreter's shutdown before it joins non-daemon threads (as
    # concurrent.futures stops its workers); private, hence looked up defensively.
    # Registered at import (in the thread importing jobspool, before any worker thread
    # can start): registered by the worker thread, a main thread that had returned already
    # refused it, and that worker served for ever.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # imported during the shutdown itself
            register(_main_thread_ended)


_hook_main_exit()


def detach(worker: Stoppable) -> None:
    with contextlib.suppress(ValueError):
        _elsewhere.remove(worker)


# After the second signal (a hurry), how long the runs may take to end before the process
# exits on its own: releasing held leases is a few statements or renames, but a thread
# blocked where no signal reaches it (waiting for the spool lock that a stopped or stuck
# process holds, or for a database that does not answer) held the process through any
# number of signals; only SIGKILL ended it.
HURRY_EXIT_SECONDS = 10.0
_overdue: threading.Timer | None = None


def deliver(signum: int, told: Stoppable | None = None) -> None:
    """A stop signal arrived: every member stops, or is hurried if already stopping; a
    third signal (every member hurried already) ends the process at once."""
    members = (list(_members) or ([told] if told is not None else [])) + list(_elsewhere)
    if not members:
        return
    first = told if told is not None else members[0]
    name = signal.Signals(signum).name
    if all(getattr(worker, "hurrying", False) for worker in members):
        exit_now(signum, f"received {name} a third time: exiting now; leases still held "
                 "expire at their lease's end and are reclaimed then")
    if first.stopping:
        log.warning("received %s again: releasing every held lease now (a third ends the "
                    "process at once)", name)
        _arm(signum)
    else:
        log.warning("received %s: no new claims; running handlers get %g s (send it again "
                    "to release their leases now)", name, first.grace_seconds)
    for worker in members:
        if worker.stopping:
            worker.hurry()
        else:
            worker.stop()


def _arm(signum: int) -> None:
    """Exit if the hurried runs have not ended within `HURRY_EXIT_SECONDS`."""
    global _overdue
    if _overdue is not None:
        return

    def overdue() -> None:
        if _members or any(w.stopping for w in _elsewhere):
            exit_now(signum, f"still not stopped {HURRY_EXIT_SECONDS:g} s after the second "
                     "signal (a thread waits where no signal reaches it: for the spool lock "
                     "another process holds, or for the database); exiting now; leases still "
                     "held expire at their lease's end and are reclaimed then")

    _overdue = threading.Timer(HURRY_EXIT_SECONDS, overdue)
    _overdue.daemon = True
    _overdue.start()


def _disarm() -> None:
    global _overdue
    if _overdue is not None:
        _overdue.cancel()
        _overdue = None


def exit_now(signum: int, why: str) -> NoReturn:
    """End the process at once (`os._exit`, 128 + the signal's number, as a process the
    signal killed): no cleanup runs, since what would run it is what is stuck."""
    log.warning("%s", why)
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(128 + signum)


def _asyncio_loop() -> Any:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _capture(signals: tuple[int, ...]) -> dict[str, Any]:
    loop = _asyncio_loop()
    # asyncio keeps an application's `add_signal_handler` entries in a private table:
    # read defensively, re-added by `_restore`.
    table = getattr(loop, "_signal_handlers", None) if loop is not None else None
    handles = {s: h for s in signals
               if (h := table.get(s) if isinstance(table, dict) else None) is not None}
    return {"signal": {s: signal.getsignal(s) for s in signals}, "loop": loop,
            "handles": handles}


def _restore(original: dict[str, Any]) -> None:
    for signum, handler in original.get("signal", {}).items():
        with contextlib.suppress(ValueError, TypeError, OSError):
            signal.signal(signum, handler)
    loop = original.get("loop")
    if loop is None or loop is not _asyncio_loop():
        return
    for signum, handle in original.get("handles", {}).items():
        with contextlib.suppress(Exception):
            if not handle.cancelled():
                loop.add_signal_handler(signum, handle._callback, *handle._args)  # noqa: SLF001


def _install_fan_out(signals: tuple[int, ...]) -> None:
    loop = _asyncio_loop()
    if loop is not None:
        for signum in signals:
            with contextlib.suppress(Exception):
                loop.add_signal_handler(signum, deliver, signum)
        return
    soon = _trio_soon()
    for signum in signals:
        with contextlib.suppress(ValueError, TypeError, OSError):
            # Not in the signal handler itself: stopping takes locks the interrupted code
            # may hold. Trio runs it on its loop, signal-safely.
            signal.signal(signum, (lambda n, _f: soon(deliver, n)) if soon is not None
                          else (lambda n, _f: deliver(n)))


def _trio_soon() -> Any:
    try:
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    except Exception:  # not in a trio run (or no trio): called directly
        return None


__all__ = ["attach", "deliver", "detach", "enter", "leave"]
