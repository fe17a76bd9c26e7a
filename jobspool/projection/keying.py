"""Two things a projection table needs before jobspool's first write into it, across
processes: to be made once (`creating`), and, if made without jobspool, its primary key
(`key_table`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc

from jobspool.projection import objectstore as obj

log = logging.getLogger("jobspool.projection")


@contextlib.contextmanager
def creating(uri: str | None, name: str) -> Iterator[None]:
    """Held around making table `name` in a local database, across processes. Lance commits
    a creation that lost its race as an overwrite on top of the winner's table: of 400
    rounds of 4 processes making one new table at once, one ended with an empty overwrite
    at version 3, wiping a merge another process had been told was written (version 2).
    Serialised, the second one finds the table and writes into it. Object storage has no
    such lock here: that race remains there (not measured)."""
    local = None if uri is None else obj.local_path(uri)
    if local is None or "://" in local:
        yield
        return
    import portalocker

    lock = portalocker.Lock(os.path.join(local, f".{name}.creating.lock"), mode="a",
                            timeout=60)
    try:
        os.makedirs(local, exist_ok=True)
        lock.acquire()
    except (OSError, portalocker.LockException) as exc:
        # A directory this user may not write a file in (a group's projection made by
        # another member): created as before, unserialised, rather than not at all.
        log.debug("making table %r without its creation lock: %s", name, exc)
        yield
        return
    try:
        yield
    finally:
        lock.release()


class UnkeyableTable(OSError):
    """A table made without jobspool holding a key twice, or a row without one: a storage
    fault (its jobs wait uncounted) that says its own remedy (`remedy`): the worker's
    generic advice sent the operator to `jobspool maintain`, which said the table was
    fine."""

    remedy = "remove those rows by hand, then its writes resume"


def key_table(tbl: Any, name: str, key: str) -> None:
    """A table made without jobspool (by hand, another tool) given its unenforced
    primary key before its first fenced merge: without it LanceDB cannot tell two
    concurrent inserts of one new key apart, and both land, for good (3 processes: 75
    keys three times). Its key column is made NOT NULL first (a table made from data
    has it nullable, and LanceDB keys only NOT NULL columns). One holding a key twice
    or a row without a key cannot be fenced: a storage fault, as a damaged table is
    (its jobs wait uncounted, `health` says so) until it is mended by hand. Another
    process setting the key at the same moment is as good."""
    keys = tbl.search().select([key]).limit(None).to_arrow().column(key)
    problem = None
    if keys.null_count:
        problem = f"{keys.null_count} row(s) without a key ({key!r} is null)"
    elif (extra := len(keys) - len(pc.unique(keys))) > 0:
        problem = f"{extra} key(s) held more than once"
    if problem is not None:
        raise UnkeyableTable(errno.EIO, f"projection table {name!r} (made without "
                             f"jobspool?) has {problem}: fenced writes need each key once; "
                             f"{UnkeyableTable.remedy}")
    try:
        if tbl.schema.field(key).nullable:
            tbl.alter_columns({"path": key, "nullable": False})
        tbl.set_unenforced_primary_key(key)
    except ValueError as exc:
        if "already set" not in str(exc):
            raise
    log.warning("projection table %r had no primary key (made without jobspool?): set "
                "on %r, so that concurrent writers cannot insert one key twice", name, key)
