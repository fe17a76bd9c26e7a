"""Wakeups for idle workers: the kernel says when a job file lands, no polling needed.

An idle worker used to find new work by claiming on a timer (a relisted
directory at most every `poll_seconds`, 80 ms median pickup). `DirWatcher`
blocks on Linux `inotify` for the directories new jobs arrive in (`ready/`
and `retryable/`: renames into them, and files written there by hand), so a
worker claims within a millisecond or two of an enqueue by any process. It
is a hint, never the source of truth: the worker still claims on its
periodic safety poll, and without inotify (another OS, or the watch limit
reached) it falls back to that poll alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC

_libc: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.inotify_init1  # noqa: B018 - probe: missing outside Linux
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            _libc = lib
        except (OSError, AttributeError):
            return None
    return _libc


class DirWatcher:
    """Waits until a file arrives in one of `dirs` (or a timeout); see the module docstring."""

    def __init__(self, dirs: Iterable[Path]) -> None:
        self.fd = -1
        lib = _load()
        if lib is None:
            return
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify (%s): idle workers poll", os.strerror(ctypes.get_errno()))
            return
        for d in dirs:
            if lib.inotify_add_watch(fd, os.fsencode(d), _IN_MOVED_TO | _IN_CLOSE_WRITE) < 0:
                log.info("cannot watch %s (%s): idle workers poll", d,
                         os.strerror(ctypes.get_errno()))
                os.close(fd)
                return
        self.fd = fd

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when something arrived (events drained)."""
        if self.fd < 0:
            return False
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout)
        except (OSError, ValueError):
            return False  # closed meanwhile
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.fd, 65536):
                pass
        return True

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
