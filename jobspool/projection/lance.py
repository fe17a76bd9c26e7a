"""The LanceDB projection: group-committed, version-fenced writes, and tombstone-free reads.

`ProjectionStore.apply` commits the pending writes of a whole claimed batch
as ONE `merge_insert` per table (a LanceDB commit costs 10–25 ms whatever
its size, so per-job commits would cap a worker near 50 jobs/s). The merge
itself carries the fence (DESIGN §4):

    when_matched_update_all(where=FENCE_WHERE).when_not_matched_insert_all()

so a row is replaced only by a write whose `(version, fence)` is >= the
stored pair. That is what protects the table against a zombie run (its lease
expired and another run wrote since), duplicated deliveries (an equal pair
rewrites the same content: idempotent) and late writes after a delete
(deletes are tombstone rows under the same rule). It needs no lock, so it
also holds between processes and hosts.

What it relies on:
- Batches are deduplicated per key first (highest pair wins): LanceDB
  refuses a merge whose source repeats an existing key and silently
  duplicates a repeated new one.
- Tables carry an unenforced primary key from their first version (field
  metadata at creation). Without it, two processes inserting the same new
  key concurrently both insert it; with it, LanceDB's commit conflict
  resolution rebases one merge onto the other.
- Connections use `read_consistency_interval=0`, so each operation sees the
  latest version, including another process's compaction and cleanup.
- Any LanceDB error means "outcome unknown": a timed-out commit may have
  landed. The jobs are retried, and since the fenced merge is idempotent a
  re-run converges on the same rows.

What it does not protect against: a source that hands out a higher version
for older content, and anything written to the table behind its back.

`import lancedb` costs over a second, so it happens only when a store or a
projection is first used, never when this module is imported.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pyarrow as pa

from jobspool.errors import InvalidType, ProjectionError, ProjectionUnusable
from jobspool.projection import objectstore as obj
from jobspool.projection.database import (
    ASYNC_REFUSED,
    CREATING_SECONDS,
    ProjectionDatabase,
    damaged_table_dir,
    is_async_connection,
)
from jobspool.projection.database import uri_of as uri_of
from jobspool.projection.faults import config_fault, storage_fault, summary
from jobspool.projection.handler import (
    LIVE_FILTER,
    TABLE_NAME_RE,
    PendingWrite,
    _one_line,
    make_delete,
    make_upsert,
)
from jobspool.projection.keying import creating, key_table

# The seams (`lancecalls.py`): called through these names, so a test can monkeypatch one.
from jobspool.projection.lancecalls import (
    FENCE_WHERE,
    _add_table_columns,
    _connect,
    _create_table,
    _execute_merge,
    _open_table,
    _stored_fences,
)
from jobspool.projection.plan import ApplyResult, TablePlan, decide, plan_table
from jobspool.projection.schema import (
    PK_METADATA_KEY,
    check_key_name,
    columns_pending,
    foreign_table_problem,
    primary_key_of,
    table_schema,
)
from jobspool.projection.tableread import LiveReads, strip_hidden

log = logging.getLogger("jobspool.projection")

class ProjectionStore(ProjectionDatabase):
    """The write side of the projection: applies pending writes with one fenced merge per table.

    `uri_or_connection` is a LanceDB URI or local directory (opened with
    `read_consistency_interval=0`) or an open LanceDB connection (used as
    is). `schemas` declares the user schema of tables created later; other
    tables get a schema inferred from their first rows. `key` names the
    string key column of every table, `keys` that of the tables whose key is
    another (`App(keys=...)`). Thread-safe: applies are serialized.

    `storage_options` go to `lancedb.connect`; an `s3://` endpoint that
    ignores create-only PUTs is refused, and unknown-outcome, throttled or
    timed-out merges are retried as `commit_retry` bounds (see objectstore.py).
    """

    def __init__(
        self,
        uri_or_connection: str | os.PathLike[str] | Any,
        *,
        key: str = "id",
        schemas: Mapping[str, pa.Schema] | None = None,
        commit_timeout: timedelta | None = None,
        clock: Any = time.time,
        keys: Mapping[str, str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        commit_retry: obj.CommitRetry | None = None,
    ) -> None:
        self.key = check_key_name(key)
        self._storage_options = obj.check_storage_options(storage_options)
        self._commit_retry = commit_retry or obj.CommitRetry()
        self._keys = {table: check_key_name(k) for table, k in (keys or {}).items()}
        self._schemas: dict[str, pa.Schema] = {
            name: table_schema(s, self.key_of(name)) for name, s in (schemas or {}).items()
        }
        # Given a connection, its endpoint and credentials are its own: never connect anew.
        self._given_connection = not isinstance(uri_or_connection, str | os.PathLike)
        if isinstance(uri_or_connection, str | os.PathLike):
            self._uri: str | None = os.fspath(uri_or_connection)
            self._conn: Any = None
        else:
            if is_async_connection(uri_or_connection):
                raise ProjectionError(ASYNC_REFUSED)
            self._uri = uri_of(uri_or_connection)
            self._conn = uri_or_connection
        self._commit_timeout = commit_timeout
        self._clock = clock
        self._tables: dict[str, Any] = {}
        self._opened: set[str] = set()  # tables this store saw existing (see `_create`)
        self._lock = threading.RLock()
        self._exclusive: dict[str, threading.Lock] = {}
        self._closed = False

    # --- plumbing

    @property
    def connection(self) -> Any:
        """The LanceDB connection (opened on first use)."""
        with self._lock:
            if self._closed:
                raise ProjectionError("projection store is closed")
            if self._conn is None:
                # No conditional-PUT check here: it PUTs probe objects, and a reader may hold
                # read-only credentials. Writes (`apply`) and maintenance run it.
                assert self._uri is not None
                self._check_local_directory()
                try:
                    self._conn = _connect(self._uri, self._storage_options)
                except (FileExistsError, NotADirectoryError) as exc:
                    # LanceDB makes the directory: a file in the way came out as a raw OSError.
                    raise ProjectionError(f"projection database {self._uri!r} cannot be a "
                                          f"directory: {_one_line(exc)}") from exc
                except (ValueError, RuntimeError, OSError) as exc:
                    if config_fault(exc):
                        raise ProjectionUnusable(
                            f"projection database {self._uri!r} cannot be used as configured: "
                            f"{summary(exc)} (see its storage options)") from None
                    if not storage_fault(exc):
                        raise
                    # An object store down or refusing: LanceDB's ~800 characters of Rust
                    # debug form (source paths included) reached readers and `maintain`.
                    # Chained: writers still tell it for a storage fault and defer.
                    said = summary(exc)
                    # An HTTP status is an answer (403 denied, 404 no such bucket), not
                    # silence: "did not answer (HTTP 403)" sent operators to the network.
                    what = (f"its storage refused ({said}: check the credentials and the "
                            "bucket)" if said.startswith("HTTP 4") else
                            f"its storage failed ({said})" if said.startswith("HTTP ") else
                            f"its storage did not answer ({said})")
                    raise ProjectionError(f"projection database {self._uri!r}: {what}") from exc
            return self._conn

    def open(self, name: str) -> Any | None:
        """Return the LanceDB table `name`, or None when it does not exist yet."""
        with self._lock:
            tbl = self._tables.get(name)
            if tbl is None and self._absent():
                return None  # a read must not create the directory (a typo became one)
            if tbl is None:
                tbl = _open_table(self.connection, name)
                if tbl is not None:
                    self._tables[name] = tbl
                    self._opened.add(name)
            return tbl

    def table_names(self) -> list[str]:
        """The names of the tables in the database, sorted."""
        if self._absent():
            return []
        conn = self.connection
        names: list[str] = []
        token: str | None = None
        while True:
            page = conn.list_tables(page_token=token)
            names.extend(page.tables)
            token = page.page_token
            if not token:
                break
        return sorted(names)

    def table(self, name: str) -> LanceProjection:
        """Return a reader (and convenience writer) for table `name`, sharing this store."""
        return LanceProjection(self, name, key=self.key_of(name))

    def close(self) -> None:
        """Drop cached table handles and the connection; later use raises ProjectionError."""
        with self._lock:
            self._tables.clear()
            self._conn = None
            self._closed = True

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing

    def apply(self, writes: Sequence[PendingWrite]) -> ApplyResult:
        """Commit `writes` with ONE fenced `merge_insert` per table (group commit).

        Steps: group by table; check each job's rows against the table's
        schema (the stored one, the declared one, or one inferred from these
        rows for a new table) and split out the jobs that do not fit as
        `rejected`; deduplicate per key keeping the highest (version, fence)
        (on a tie, the later write); build one batch per table; merge.

        A table whose merge raises puts every job that wrote it in `failed`
        (outcome unknown, retryable); the other tables still commit. Deletes
        for a table that does not exist and has no declared schema create it
        with the key and reserved columns only, to hold their tombstones (an
        older upsert arriving later must not bring the key back); the first
        rows written to it add their columns.
        """
        with self._lock:
            if writes:
                # Raised, not per job: an endpoint that would lose commits is no job's fault.
                self.check_endpoint()
            return self._apply(writes)

    def _apply(self, writes: Sequence[PendingWrite]) -> ApplyResult:
        by_table: dict[str, list[PendingWrite]] = {}
        for w in writes:
            by_table.setdefault(w.table, []).append(w)
        written_at = float(self._clock())

        # Phase 1: decide (plan.py); only opening a table touches LanceDB.
        plans, rejected, failed = decide(
            by_table, lambda name, live: self._plan(name, live, written_at), self._forget)

        # Phase 2: commit, one merge per table.
        tables: dict[str, int] = {}
        for name, plan in plans.items():
            if plan.batch is None or plan.batch.num_rows == 0:
                tables[name] = 0
                continue
            try:
                tables[name] = self._commit(plan)
            except Exception as exc:
                self._forget(name)
                for job_id in plan.job_ids:
                    failed.setdefault(job_id, exc)
        for job_id in rejected:  # permanent beats retryable: the job is dead-lettered
            failed.pop(job_id, None)
        return ApplyResult(failed=failed, rejected=rejected, tables=tables)

    def _plan(
        self, name: str, writes: list[PendingWrite], written_at: float
    ) -> tuple[TablePlan | None, dict[str, ProjectionError]]:
        tbl = self.open(name)
        key = self.key_of(name)
        if tbl is not None and primary_key_of(tbl.schema) is None \
                and foreign_table_problem(tbl.schema, key) is None:
            tbl = self._keyed(name, tbl)  # planned against the keyed (NOT NULL) schema
        schema: pa.Schema | None = tbl.schema if tbl is not None else self._schemas.get(name)
        stored = None
        if tbl is not None and schema is not None and columns_pending(schema, key):
            stored = _stored_fences(tbl, key, writes)
        return plan_table(name, writes, key=key, schema=schema, exists=tbl is not None,
                          written_at=written_at, declared=self._schemas.get(name),
                          stored=stored)

    def _commit(self, plan: TablePlan) -> int:
        assert plan.batch is not None
        tbl = self.open(plan.table) if plan.exists else None
        if tbl is None:
            tbl = self._create(plan.table, plan.schema)
            if not tbl.schema.equals(plan.schema, check_metadata=False):
                # Another process created it first, with a schema inferred from
                # its own rows. Retry: the next attempt checks against that one.
                raise ProjectionError(
                    f"table {plan.table!r} was created concurrently with another schema; retry",
                    table=plan.table,
                )
        if plan.add_fields:
            self._add_columns(tbl, plan)
        batch = plan.batch

        def merge() -> Any:
            with self.exclusive(plan.table):  # released between tries: maintenance may go
                return _execute_merge(tbl, self.key_of(plan.table), batch, self._commit_timeout)

        # Unknown outcome, throttling, timeouts: try again (the fenced merge is idempotent).
        result = obj.retry_transient(merge, self._commit_retry, what=f"merge into {plan.table!r}")
        return int(result.num_inserted_rows) + int(result.num_updated_rows)

    def _keyed(self, name: str, tbl: Any) -> Any:
        """A table made without jobspool keyed before its first fenced merge (`keying.py`)."""
        key_table(tbl, name, self.key_of(name))
        self._forget(name)
        again = self.open(name)
        if again is None or primary_key_of(again.schema) is None:
            raise ProjectionError(f"table {name!r}: its primary key could not be set; retry",
                                  table=name)
        return again

    def _add_columns(self, tbl: Any, plan: TablePlan) -> None:
        """Give a table made by deletes alone the columns of its first rows, once.

        Through a handle that stays at the version it opened (this store's own moves to
        the latest before each call): two processes bringing first rows at once each added
        their columns on top of the other's when the second's handle had already moved
        past the first's commit, and the table kept both. At a fixed version, LanceDB
        refuses the second commit as a conflict, and its jobs retry against the first's."""
        held = self._held_handle(plan.table)
        try:
            with self.exclusive(plan.table):
                if held is not None and not columns_pending(held.schema,
                                                            self.key_of(plan.table)):
                    raise ProjectionError("another process gave it its first columns")
                _add_table_columns(held if held is not None else tbl, plan.add_fields)
        except Exception as exc:
            self._forget(plan.table)
            if not self._took_columns(plan):
                raise  # the storage or LanceDB refused: judged as a failed merge is
            # Another process added its first rows' columns meanwhile: the retry plans
            # against the table as it is now.
            raise ProjectionError(f"table {plan.table!r} took its first columns concurrently "
                                  f"({_one_line(exc)}); retry", table=plan.table) from exc
        if not tbl.schema.equals(plan.schema, check_metadata=False):
            self._forget(plan.table)
            raise ProjectionError(f"table {plan.table!r} took its first columns concurrently; "
                                  "retry", table=plan.table)

    def _held_handle(self, name: str) -> Any | None:
        """`name` opened at its latest version on a connection that never moves it on
        (None for a store given a connection rather than a URI: its own handle serves; a
        new connection from its URI alone lost the endpoint and credentials it was made
        with, and an s3 table's first columns failed for good)."""
        if self._uri is None or self._given_connection:
            return None
        conn = _connect(self._uri, self._storage_options, follow=False)
        return _open_table(conn, name)

    def _took_columns(self, plan: TablePlan) -> bool:
        """Whether the table, read again, has its first columns now."""
        try:
            now = self.open(plan.table)
        except Exception:
            return False
        return now is not None and not columns_pending(now.schema, self.key_of(plan.table))

    def _create(self, name: str, schema: pa.Schema) -> Any:
        with creating(self._uri, name):
            # Made by another process while this one waited: written into, never made again.
            self._forget(name)
            made = self.open(name)
            if made is not None:
                self._opened.add(name)
                return made
            return self._create_alone(name, schema)

    def _create_alone(self, name: str, schema: pa.Schema) -> Any:
        if damaged_table_dir(self._uri, name, settled_for=CREATING_SECONDS):
            # Made anew inside the old directory, the table silently lost its rows (and a
            # key's version 100 lost to a version 1 write), its schema inferred afresh; the
            # old data files stayed behind, orphaned. A storage fault: its jobs wait, as
            # for a damaged manifest, and `health` says so.
            raise OSError(errno.EIO, f"projection table {name!r} is damaged: {name}.lance is "
                          "there but holds no table LanceDB can open (its _versions/ or "
                          "manifest lost?); restore it from a backup, or move it away to "
                          "start the table anew")
        if name in self._opened:
            # It was there and is gone (deleted or moved by hand): made anew, it holds none of
            # the rows written before — said once, not left for readers to find out.
            log.warning("projection table %r was there and is gone (deleted or moved?); "
                        "creating it anew: rows written before are not in it", name)
        try:
            tbl = _create_table(self.connection, name, schema)
        except ValueError as exc:
            if "does not match existing table schema" not in str(exc):
                raise
            # Another process created it first with columns of its own rows: LanceDB's own
            # "Schema Error" read as "outcome unknown", though nothing could have been
            # written. Retry: the next attempt checks against that table's columns.
            raise ProjectionError(f"table {name!r} was created concurrently with another "
                                  "schema; retry", table=name) from exc
        self._opened.add(name)
        key = self.key_of(name)
        field = tbl.schema.field(key)
        if PK_METADATA_KEY not in (field.metadata or {}):
            # A LanceDB that drops field metadata at creation: set the key now.
            try:
                tbl.set_unenforced_primary_key(key)
            except ValueError as exc:
                if "already set" not in str(exc):
                    raise
        self._tables[name] = tbl
        return tbl


class LanceProjection(LiveReads):
    """One projected table: reads that never show tombstones, and convenience writes.

    `LanceProjection(uri, table, schema=None, key="id", storage_options=None)`
    opens its own store (object storage settings in `storage_options`);
    `ProjectionStore.table(name)` shares the store's connection. Rows come
    back with the user's columns plus `version` and `fence`; the hidden
    `_deleted` and `_written_at` columns are dropped. For raw LanceDB queries
    on `raw`, add `LIVE_FILTER` (see `jobspool.projection.handler`).
    """

    LIVE_FILTER = LIVE_FILTER

    def __init__(
        self,
        uri: str | os.PathLike[str] | ProjectionStore | Any,
        table: str,
        schema: pa.Schema | None = None,
        key: str | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(table, str) or not TABLE_NAME_RE.fullmatch(table):
            # LanceDB's own refusal came out as a raw ValueError from deep in a read.
            raise ProjectionError(f"table name {table!r} must match "
                                  "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", table=str(table))
        if schema is not None and not isinstance(schema, pa.Schema):
            # A dict of names to type names failed at the first write with AttributeError.
            raise InvalidType(f"schema of table {table!r} must be a pyarrow.Schema "
                              f"(pa.schema([...])), got {type(schema).__name__}",
                              field="schema")
        if isinstance(uri, ProjectionStore):
            self._store = uri
        else:
            self._store = ProjectionStore(
                uri, key=key or "id", schemas={table: schema} if schema is not None else None,
                storage_options=storage_options,
            )
            if key is None:
                # Not given: the key the table was made with (its schema records it), so
                # reading a table keyed on `path` needs no `key=` (it failed on `id`).
                made = self._store.open(table)
                found = primary_key_of(made.schema) if made is not None else None
                if found is not None and found != "id":
                    self._store = ProjectionStore(
                        uri, keys={table: found},
                        schemas={table: schema} if schema is not None else None,
                        storage_options=storage_options)
        self.name = table
        self.key = self._store.key_of(table)

    @property
    def store(self) -> ProjectionStore:
        return self._store

    @property
    def raw(self) -> Any | None:
        """The LanceDB table (None until first written). Filter raw queries with LIVE_FILTER."""
        return self._store.open(self.name)

    def version(self) -> int | None:
        """The table's current LanceDB version (None until first written)."""
        tbl = self.raw
        return None if tbl is None else int(tbl.version)

    def _empty(self) -> pa.Table:
        schema = self._store.declared_schema(self.name)
        if schema is None:
            return pa.table({self.key: pa.array([], type=pa.string())})
        return strip_hidden(schema.empty_table())

    def upsert(
        self,
        rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        version: float | None = None,
        fence: int = 0,
        job_id: str = "direct",
    ) -> int:
        """Write rows outside a worker, fenced like any job; returns rows the fence let through."""
        return self._write(make_upsert(job_id, self.name, rows, version, fence, key=self.key))

    def delete(
        self,
        ids: str | Iterable[str],
        *,
        version: float | None = None,
        fence: int = 0,
        job_id: str = "direct",
    ) -> int:
        """Tombstone rows outside a worker, fenced like any job; returns tombstones written."""
        return self._write(make_delete(job_id, self.name, ids, version, fence, key=self.key))

    def _write(self, write: PendingWrite) -> int:
        result = self._store.apply([write])
        if write.job_id in result.rejected:
            raise result.rejected[write.job_id]
        if write.job_id in result.failed:
            err = result.failed[write.job_id]
            raise ProjectionError(
                f"commit to table {self.name!r} failed, outcome unknown: {_one_line(err)}", table=self.name
            ) from err
        return result.tables.get(self.name, 0)


__all__ = ["FENCE_WHERE", "ApplyResult", "LanceProjection", "ProjectionStore", "uri_of"]
