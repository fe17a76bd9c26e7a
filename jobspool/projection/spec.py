"""What a worker or an App may be given as its projection, checked when it is built.

A projection is opened lazily, at the first write: a typo found only then cost every
job an attempt (each retried with LanceDB's error, then dead-lettered) while the worker
itself started and exited 0. These checks need no I/O beyond a local `stat`, but for
`check_connects`, which connects to what is neither a directory nor object storage.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from jobspool.errors import ConfigError
from jobspool.projection.database import ASYNC_REFUSED, is_async_connection
from jobspool.projection.handler import TABLE_NAME_RE
from jobspool.projection.objectstore import is_object_store, scheme_of
from jobspool.projection.schema import check_key_name

# SCHEME:/rest with one slash: a URI with a slash lost.
_ONE_SLASH = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def check_projection(spec: Any, keys: Mapping[str, str] | None = None) -> None:
    """Refuse (`ConfigError`, one line) a projection that cannot work: not a URI, a
    `ProjectionStore` or a LanceDB connection; an object-storage URI without a bucket;
    a local path that is a file; a key column that cannot name one."""
    for table, key in (keys or {}).items():
        if not isinstance(table, str) or not TABLE_NAME_RE.fullmatch(table):
            raise ConfigError(f"projection keys: table name {table!r} must be letters, digits, "
                              "'_', '-' or '.' (not starting with '.' or '-')")
        try:
            check_key_name(key)
        except ValueError as exc:
            raise ConfigError(f"projection keys[{table!r}]: {exc}") from None
    key_of = getattr(spec, "key_of", None)
    if callable(key_of):
        # A ProjectionStore merges on its own keys; the worker's would be ignored silently,
        # each side then keyed differently (rows duplicated under another column).
        for table, key in (keys or {}).items():
            if key_of(table) != key:
                raise ConfigError(f"projection keys[{table!r}] is {key!r} but the "
                                  f"ProjectionStore given keys that table on "
                                  f"{key_of(table)!r}: give the keys to one of them")
    if is_async_connection(spec):
        raise ConfigError(ASYNC_REFUSED)
    if spec is None or hasattr(spec, "open_table") or hasattr(spec, "apply"):
        return  # the default, a LanceDB connection, or a ProjectionStore
    if not isinstance(spec, str | os.PathLike):
        raise ConfigError(f"projection must be a LanceDB URI or directory, a ProjectionStore "
                          f"or a LanceDB connection, got {spec!r:.80}")
    text = os.fspath(spec)
    if not text.strip():
        raise ConfigError("projection URI is empty")
    if scheme_of(text) == "memory":
        return
    one_slash = _ONE_SLASH.match(text)
    if one_slash:
        # "s3:/bucket/x" is a local directory "s3:" to LanceDB's parser only sometimes;
        # here it failed at the first write, every job charged, then dead-lettered.
        raise ConfigError(f"projection {text!r} is neither a URI nor a plain path: "
                          f"{one_slash.group(1)}://BUCKET/PATH (two slashes), or "
                          f"./{text} for a local directory")
    if is_object_store(text):
        rest = text.split("://", 1)[1] if "://" in text else ""
        if not rest.split("/", 1)[0]:
            raise ConfigError(f"projection {text!r} names no bucket "
                              f"({scheme_of(text)}://BUCKET/PATH)")
        return
    path = text[len("file://"):] if text.startswith("file://") else text
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"projection {text!r} is a file, not a directory")
    blocker = _file_above(os.path.expanduser(path))
    if blocker is not None:
        # It was deferred as a storage failure at each job's write, for ever.
        raise ConfigError(f"projection {text!r} cannot be made: {blocker!r} is a file, "
                          "not a directory")


def _file_above(path: str) -> str | None:
    """The nearest existing ancestor of `path` when it is not a directory."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up
    return parent if parent and not os.path.isdir(parent) else None


# Object stores whose connect reaches the network (an outage must defer jobs, not refuse
# the worker): checked above by shape only. Any other scheme is LanceDB Cloud (db://) or
# one LanceDB does not know, whose connect is local and says what is wrong.
_NETWORK_SCHEMES = frozenset({"s3", "s3+ddb", "gs", "az", "abfss", "oss", "cos", "hf",
                              "goosefs"})


def check_connects(spec: Any, storage_options: Mapping[str, str] | None = None) -> None:
    """Refuse (`ConfigError`, one line) a projection URI LanceDB cannot connect to at all:
    an unknown scheme, `db://` without an API key. Each job failed at its first write
    instead, charged an attempt, until the whole queue was dead-lettered."""
    if not isinstance(spec, str | os.PathLike):
        return
    text = os.fspath(spec)
    scheme = scheme_of(text)
    if scheme in ("", "file", "memory") or scheme in _NETWORK_SCHEMES:
        return
    from jobspool.projection.lancecalls import _connect

    try:
        _connect(text, storage_options)
    except ValueError as exc:
        detail = " ".join(str(exc).split()).removeprefix("Invalid input, ")
        raise ConfigError(f"projection {text!r}: LanceDB cannot connect to it: "
                          f"{detail:.300}") from None


def check_usable(spec: Any, keys: Mapping[str, str] | None,
                 storage_options: Mapping[str, str] | None) -> None:
    """Everything an App or a Worker checks of its projection when it is built: its shape
    (`check_projection`), then whether LanceDB can connect to it (`check_connects`)."""
    check_projection(spec, keys)
    check_connects(spec, storage_options)


class StoreKeys(Mapping[str, str]):
    """The key column of each table as a `ProjectionStore` merges it: its `keys`, and its
    `key` for any other table (a mapping whose misses answer the store's default key)."""

    def __init__(self, store: Any, given: Mapping[str, str]) -> None:
        self._store = store
        self._given = dict(given)

    def __getitem__(self, table: str) -> str:
        return self._given.get(table) or str(self._store.key_of(table))

    def __iter__(self) -> Any:
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)


def keys_of(spec: Any, keys: Mapping[str, str]) -> Mapping[str, str]:
    """The keys a worker's handlers write with: a `ProjectionStore`'s own (its `keys` and
    its `key`) when it is the projection; else those the worker was given (others: "id").
    A worker given a store keyed on `path` validated rows against "id" and dead-lettered
    every job that wrote one."""
    return StoreKeys(spec, keys) if callable(getattr(spec, "key_of", None)) else keys


__all__ = ["StoreKeys", "check_projection", "keys_of"]
