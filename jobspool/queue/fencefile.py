"""The fence file: the flushed ceiling of fencing tokens (`fence.py` hands tokens out).

Read, written and identified here, apart from the journal: a missing file (deleted
under an open spool) restarts above the clock, a symlink is never followed, and every
other failure is one line naming the file.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from jobspool.errors import SpoolError
from jobspool.queue.diskerrors import listing_failed, write_failed
from jobspool.queue.fence import (
    FENCE_FILE,
    FenceEmpty,
    decode_fence,
    encode_fence,
    restart_floor,
)
from jobspool.queue.store import Store, write_atomic

log = logging.getLogger("jobspool.queue.spool")


class FenceFile:
    """One spool's fence file (`<root>/fence`)."""

    def __init__(self, root: Path, store: Store, *, durable: bool, mode: int,
                 read_only: bool = False) -> None:
        self.root = root
        self._read_only = read_only
        self.path = root / FENCE_FILE
        self._path_s = os.fspath(self.path)  # stat'ed at every claim
        self._store = store
        self._durable = durable
        self._mode = mode

    def read(self) -> int:
        """The ceiling on disk (a restart floor when the file is gone)."""
        try:
            data = self._store.read("", FENCE_FILE)
        except FileNotFoundError:
            return self.lost()  # deleted under an open spool
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the store never follows one
                raise SpoolError(f"{self.path}: a symlink where the fence file belongs; "
                                 "`jobspool recover` quarantines it and rebuilds the file",
                                 path=str(self.path)) from None
            raise listing_failed(exc, self.root) from None
        if not data:
            raise FenceEmpty(f"{self.path}: fence file is empty; run `jobspool recover` to "
                             "rebuild it", path=str(self.path))
        try:
            return decode_fence(data)
        except ValueError as exc:
            # Written by someone else (an edit, another file copied over it): never guessed.
            raise SpoolError(f"{self.path}: {exc}; run `jobspool recover` to rebuild it from "
                             "the tokens on disk", path=str(self.path)) from None

    def lost(self) -> int:
        """The ceiling to go on from when an existing spool's fence file is gone."""
        floor = restart_floor()
        if self._read_only:
            # Nothing restarts here: it said "tokens restart above X" and wrote nothing,
            # and the next writer then restarted above another value.
            log.warning("%s is missing: the next process that writes the spool (or `jobspool "
                        "recover`) restarts fencing tokens above the clock", self.path)
        else:
            log.warning("%s is missing: fencing tokens restart above %d (the clock in "
                        "microseconds, past any token handed out) so that none is handed "
                        "out twice", self.path, floor)
        return floor

    def write(self, value: int) -> None:
        """Flush a new token ceiling (under the lock; see `FenceCounter`)."""
        try:
            write_atomic(self.path, encode_fence(value), durable=self._durable, mode=self._mode)
        except OSError as exc:
            raise write_failed(exc, self.root) from None

    def ident(self) -> int:
        """The file's identity (inode and modification time): 0 when there is none."""
        try:
            st = os.stat(self._path_s)
        except OSError:
            return 0
        # Not the ctime: a chmod or a backup tool's attribute change is not a new value.
        return (st.st_ino * 1_000_003 + st.st_mtime_ns) & 0xFFFFFFFFFFFFFFFF or 1
