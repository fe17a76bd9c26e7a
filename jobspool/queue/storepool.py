"""The store's book of recycled files: the names in `tmp/pool/` it may take a staging
file from, instead of creating an inode (the dominant cost of a state change on the
disks this runs on).

Only the bookkeeping lives here: the list, its reload after a fork or when another
process recycled into the pool, and the remaking of a deleted `tmp/`. Taking a file
from the pool and giving one back are renames, and stay in `store.py` behind its
syscall seams.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobspool.queue.perms import make_dir
from jobspool.queue.procid import current_pid


class RecycledPool:
    """The in-memory list of `tmp/pool/`, a base of `Store` (which sets these attributes).

    A hint, never the truth: another process may take any listed file first, so every
    take is a rename that may find it gone (`Store._staging_file`).
    """

    _tmp: Path
    _pool_dir: Path
    pool_size: int
    dir_mode: int
    _pid: int
    _pool: list[str]
    _pool_loaded: bool
    _pool_stamp: int

    def _refill_pool(self) -> bool:
        """Relist `tmp/pool/` when it changed since we last looked (others recycle into it)."""
        try:
            stamp = os.stat(self._pool_dir).st_mtime_ns
        except FileNotFoundError:
            return False
        if stamp == self._pool_stamp:
            return False
        self._pool_stamp = stamp
        self._pool = self.pool_names()[: self.pool_size]
        return bool(self._pool)

    def _remake_scratch(self) -> bool:
        """Recreate a deleted `tmp/` or `tmp/pool/` (they hold nothing a job depends on; an
        open spool remade them only when next opened, and every write failed meanwhile).
        True when one was missing and is back."""
        remade = False
        for d in (self._tmp, self._pool_dir):
            try:
                make_dir(d, self.dir_mode)
                remade = True
            except FileExistsError:
                continue
            except OSError:  # the spool itself is gone, or not ours to write: say so later
                break
        return remade

    def _check_fork(self) -> None:
        """Load the list on first use, and again in a forked child: the parent's list names
        files the parent may take meanwhile, and the child would miss every one."""
        if not self._pool_loaded or self._pid != current_pid():
            self._pid = current_pid()
            try:
                self._pool = os.listdir(self._pool_dir)[: self.pool_size]
            except FileNotFoundError:
                self._pool = []
            self._pool_loaded = True

    def pool_names(self) -> list[str]:
        """Every name in `tmp/pool/` now (none when it is missing)."""
        try:
            return os.listdir(self._pool_dir)
        except FileNotFoundError:
            return []

    def forget_pool(self) -> None:
        """Drop the in-memory pool list (after recovery trimmed or emptied the pool)."""
        self._pool = []
        self._pool_loaded = False
