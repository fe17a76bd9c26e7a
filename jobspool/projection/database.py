"""Where a projection database is and how it is opened: its URI and storage options,
the declared schemas and key columns, the cache of table handles, and the per-table
lock maintenance holds off merges with.

`ProjectionDatabase` is the base of `ProjectionStore` (lance.py), which sets these
attributes and makes every LanceDB call (through the seams there, which tests patch).
"""

from __future__ import annotations

import inspect
import os
import stat
import threading
import time
from typing import Any

import pyarrow as pa

from jobspool.errors import ProjectionError
from jobspool.projection import objectstore as obj


def uri_of(target: str | os.PathLike[str] | Any) -> str | None:
    """Return the URI a path or a LanceDB connection points at (None when unknown)."""
    if isinstance(target, str | os.PathLike):
        return os.fspath(target)
    uri = getattr(target, "uri", None)
    return uri if isinstance(uri, str) else None


# A table directory whose data files are all younger than this, without a table in it,
# may be another process's creation in progress (its data files land before its first
# manifest).
CREATING_SECONDS = 30.0


def damaged_table_dir(uri: str | None, name: str, *, settled_for: float = 0.0) -> bool:
    """Whether table `name`'s directory (a local database) holds data files though LanceDB
    found no table in it, and it is no creation in progress: rows were written there
    once, so it is damaged, not absent. A directory without data files is what a failed
    first creation (a full disk) leaves: no table ever was, nothing to restore; the next
    write makes it.

    A creation in progress (another process's: its data files land before its first
    manifest) has only fresh data files and no commit past the first. So the directory is
    damaged when a transaction file was read from a version past 0 (`<read version>-
    <uuid>.txn`: a commit on top of an existing table) or its oldest data file is at least
    `settled_for` seconds old. By the directory's own age, deleting `_versions/` (the
    damage itself) made any table look new, and one compacted and cleaned up has only new
    data files: either was made anew inside it, its rows lost and a key's version 100 lost
    to a version 1 write."""
    local = None if uri is None else obj.local_path(uri)
    if local is None:
        return False
    table = os.path.join(local, f"{name}.lance")
    try:
        if not stat.S_ISDIR(os.stat(table).st_mode):
            return False
        oldest = None
        with os.scandir(os.path.join(table, "data")) as files:
            for f in files:
                if f.is_file():
                    written = f.stat().st_mtime
                    oldest = written if oldest is None else min(oldest, written)
    except OSError:
        return False
    if oldest is None:
        return False
    return time.time() - oldest >= settled_for or _committed_on_top(table)


def _committed_on_top(table: str) -> bool:
    """Whether a transaction file of the table was written on top of a version past 0."""
    try:
        with os.scandir(os.path.join(table, "_transactions")) as files:
            return any(f.name.partition("-")[0] not in ("", "0") and f.name.endswith(".txn")
                       for f in files)
    except OSError:
        return False


# `lancedb.connect_async(...)`: its methods are coroutines, which every write called as if
# they were not ('coroutine' object has no attribute 'schema', each job charged).
ASYNC_REFUSED = ("projection: an async LanceDB connection (lancedb.connect_async) cannot be "
                 "used; give its URI, or a lancedb.connect(...) connection (the worker "
                 "writes from its own threads, so async code loses nothing)")


def is_async_connection(spec: Any) -> bool:
    """Whether `spec` is a LanceDB connection whose methods are coroutines."""
    open_table = getattr(spec, "open_table", None)
    return open_table is not None and inspect.iscoroutinefunction(open_table)


class ProjectionDatabase:
    """The database a `ProjectionStore` writes to, apart from the LanceDB calls."""

    key: str
    _uri: str | None
    _conn: Any
    _given_connection: bool
    _storage_options: dict[str, str] | None
    _keys: dict[str, str]
    _schemas: dict[str, pa.Schema]
    _tables: dict[str, Any]
    _lock: threading.RLock
    _exclusive: dict[str, threading.Lock]

    @property
    def uri(self) -> str | None:
        """The URI (or local directory) of the database, when known."""
        return self._uri

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The storage options the connection is opened with (None when none were given)."""
        return self._storage_options

    def check_endpoint(self) -> None:
        """Refuse an s3:// endpoint that ignores create-only PUTs (checked once per process
        and endpoint, remembered on success; else a no-op). Before every write, whether or
        not a read opened the connection first (a read, or a key looked up at construction,
        skipped it). A connection the caller opened is the caller's to vouch for."""
        if self._uri is not None and not self._given_connection:
            obj.check_conditional_put(self._uri, self._storage_options)

    def _check_local_directory(self) -> None:
        """Refuse a local database path that is an existing file (`/etc/passwd`): one line
        naming it, where LanceDB raised a raw FileExistsError from its mkdir."""
        local = obj.local_path(self._uri) if self._uri is not None else None
        if local is not None and "://" not in local and os.path.exists(local) \
                and not os.path.isdir(local):
            raise ProjectionError(f"projection database {self._uri!r} is an existing file, "
                                  "not a directory; give a directory path")

    def declared_schema(self, name: str) -> pa.Schema | None:
        """The stored schema declared for `name` at construction, if any."""
        return self._schemas.get(name)

    def exclusive(self, name: str) -> threading.Lock:
        """The lock that keeps this store's merges off table `name` while it is held.

        Maintenance holds it around compaction, tombstone GC and indexing:
        a compaction that races a merge touching the same fragments loses
        (LanceDB retries the writer, not the rewrite), so under a steady
        stream of batches it would never win. Holding it delays this
        process's next merge on that one table by the length of the
        compaction; other processes are not held back (their races are
        benign, and retried on the next beat).
        """
        with self._lock:
            lock = self._exclusive.get(name)
            if lock is None:
                lock = self._exclusive[name] = threading.Lock()
            return lock

    def _forget(self, name: str) -> None:
        # After an error the handle may point at files another process's
        # cleanup removed; the next use opens the table afresh.
        self._tables.pop(name, None)

    def _absent(self) -> bool:
        """A local database whose directory does not exist (and no connection yet)."""
        if self._conn is not None or self._uri is None:
            return False
        local = obj.local_path(self._uri)
        return local is not None and "://" not in local and not os.path.exists(local)

    def key_of(self, table: str) -> str:
        """The key column of `table`: its own from `keys`, else the store's `key`."""
        return self._keys.get(table, self.key)
