"""A re-entrant thread lock whose hold another thread can end: the spool lock's thread half.

A sync handler cannot be stopped. One abandoned past its time limit inside `ctx.fenced()`
kept the spool lock for as long as its thread ran, and with it every thread and process of
the spool waited: the worker's own record of the time limit first (a `threading.RLock` can
be released by its owner only). PostgreSQL ends such a block by ending its transaction
(`Database.cut_block`); this lock lets the worker do the same to a file spool's block.

A hold may be cut only where its thread runs the caller's code: at a *cut point* that the
owner opened (`allow_cut`, the inside of a fenced block). A thread stopped anywhere else is
inside one of the spool's own changes, which must not be interleaved with another's, so the
cut waits (pending) until the thread is back at its cut point. A thread that does not hold
the lock yet is marked: its first cut point is cut at once.

A thread whose hold was cut finds out at its next step: taking the lock again raises
`HoldCut`, and the releases of the levels it held are ignored, so that it unwinds. Once
unwound it is a thread like any other: a handler that catches `HoldCut` and opens another
block holds the lock again (one cut per time limit, as the worker asks once). A cut asked
of a handler that has returned is void (`forget_cuts`): its pool thread runs other jobs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from jobspool.errors import HoldCut


class HandoverLock:
    """Exclusive, re-entrant per thread; `cut` ends another thread's hold at a cut point."""

    def __init__(self, on_cut: Callable[[], None]) -> None:
        self._lock = threading.Lock()  # the exclusion; a plain Lock, so any thread may free it
        self._state = threading.Lock()  # owner, count and marks change together under it
        self._on_cut = on_cut  # the spool's part of letting go (its flocks), under `_state`
        self.owner: int | None = None
        self.count = 0
        self._points: list[int] = []  # levels at which the owner runs its caller's code
        self._pending = False  # cut the owner when it is back at its cut point
        # Threads whose hold was cut (levels still to unwind) or that are to be cut at their
        # first cut point. Keyed by the thread itself: an ident is reused by later threads.
        self._cut: dict[int, tuple[weakref.ref[threading.Thread], int]] = {}

    def _cut_level(self) -> int | None:
        """Levels of a cut hold the calling thread has still to unwind (0: marked, not
        holding); None if it was never cut. Call under `_state`."""
        me = threading.get_ident()
        mark = self._cut.get(me)
        if mark is None:
            return None
        if mark[0]() is not threading.current_thread():
            del self._cut[me]  # the mark of a thread that is gone; this one reuses its ident
            return None
        return mark[1]

    def acquire(self, *, cut_ok: bool = False, timeout: float = -1) -> bool:
        """Take the lock (again); `HoldCut` for a thread whose hold was cut and has not
        unwound yet, unless `cut_ok` (a `close()`, which must work from anywhere). False if
        `timeout` (seconds; -1: none) passed first."""
        me = threading.get_ident()
        with self._state:
            if self.owner == me:
                self.count += 1
                return True
            if not cut_ok and self._cut and self._cut_level():
                raise HoldCut()
        if not self._lock.acquire(timeout=timeout):
            return False
        with self._state:
            self.owner = me
            self.count = 1
        return True

    def release(self) -> bool:
        """Let one level go; False if it was a level of a hold that was cut (nothing to do)."""
        me = threading.get_ident()
        with self._state:
            if self.owner != me:
                level = self._cut_level() if self._cut else None
                if not level:
                    raise RuntimeError("cannot release un-acquired lock")
                if level == 1:
                    del self._cut[me]
                else:
                    self._cut[me] = (self._cut[me][0], level - 1)
                return False
            self.count -= 1
            if self.count == 0:
                if self._pending:  # never back at a cut point: cut at its next one
                    self._pending = False
                    self._mark(me)
                self.owner = None
                self._lock.release()
            elif self._pending and self._points and self.count == self._points[-1]:
                self._cut_now()
            return True

    def _is_owned(self) -> bool:
        return self.owner == threading.get_ident()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def allow_cut(self) -> None:
        """The owner runs its caller's code at this level until `forbid_cut`."""
        with self._state:
            self._points.append(self.count)
            # Asked while it opened its block (pending), or before it held (marked).
            if self._pending or (self._cut and self._cut_level() == 0):
                self._cut_now()
                raise HoldCut()

    def forbid_cut(self) -> None:
        """The end of the latest `allow_cut`; `HoldCut` if the hold was cut meanwhile."""
        with self._state:
            if self.owner != threading.get_ident():
                if self._cut and self._cut_level():
                    raise HoldCut()
                return
            self._points.pop()

    def cut(self, thread_ident: int) -> str:
        """End the hold of the thread `thread_ident` at its cut point: "cut" now, "pending"
        (inside one of the spool's changes: at its end), or "marked" (not holding: its
        first cut point)."""
        with self._state:
            if self.owner == thread_ident:
                if self._points and self.count == self._points[-1]:
                    self._cut_now()
                    return "cut"
                self._pending = True
                return "pending"
            self._mark(thread_ident)
            return "marked"

    def _mark(self, thread_ident: int) -> None:
        """Cut `thread_ident` at its next cut point (under `_state`)."""
        thread = _thread(thread_ident)
        there = self._cut.get(thread_ident)
        # Another thread's entry under a reused ident (one marked that never reached a
        # block, and ended) is stale: kept, it stood in for this thread's mark.
        if thread is not None and (there is None or there[0]() is not thread):
            self._cut[thread_ident] = (weakref.ref(thread), 0)

    def levels_here(self) -> int:
        """Levels the calling thread holds, or has still to unwind of a hold that was cut."""
        with self._state:
            if self.owner == threading.get_ident():
                return self.count
            return (self._cut_level() or 0) if self._cut else 0

    def forget_cuts(self) -> None:
        """The calling thread's handler returned: a cut asked of it is void (a pool thread
        serves other jobs next, whose blocks were cut on its mark)."""
        me = threading.get_ident()
        with self._state:
            self._cut.pop(me, None)
            if self.owner == me:
                self._pending = False

    def _cut_now(self) -> None:
        """Take the hold from its owner (under `_state`)."""
        owner = self.owner
        assert owner is not None
        thread = _thread(owner)
        self._on_cut()
        if thread is not None:  # else gone already: nothing will unwind
            self._cut[owner] = (weakref.ref(thread), self.count)
        self.owner = None
        self.count = 0
        self._points = []
        self._pending = False
        self._lock.release()


def _thread(ident: int) -> threading.Thread | None:
    """The live thread of `ident` (the weak references of cuts and marks point to it)."""
    return next((t for t in threading.enumerate() if t.ident == ident), None)
