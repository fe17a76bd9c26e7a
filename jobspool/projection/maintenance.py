"""Bounded, throttled maintenance of projected tables: compaction, cleanup, key index, tombstone GC.

Every fenced merge adds a LanceDB version, a small fragment and deletion
files; left alone, reads slow down and the version list grows without end.
`maintain` repairs that per table, in this order:

1. Tombstone GC: tombstones older than `tombstone_retention` AND written
   under a fence below `min_live_token` (the smallest token of any live
   lease) are deleted. A tombstone must outlive every run that could still
   write the row with a lower (version, fence): the token bound covers runs
   holding a live lease claimed before the delete, the retention window
   covers zombies (expired leases, no longer "live"). What no bound covers:
   a source that, after the window, replays a version older than the
   delete; that write resurrects the row. Without `min_live_token` no
   tombstone is collected.
2. A BTREE index on the key once the table passes `index_threshold` rows:
   the fence lookup before each merge and readers' `get` find rows through
   it. The merge itself scans (lancecalls.py `_execute_merge` says why).
3. `optimize(cleanup_older_than=...)`: compaction, index update, and removal
   of versions older than minutes. Never `delete_unverified`: it removes files
   of in-flight commits and corrupted tables under concurrent writers.
   Versions newer than `cleanup_older_than` stay, so a reader that opened
   the table a moment ago keeps reading.

A run is bounded: it stops starting work once `budget_seconds` are spent
(remaining tables are `deferred`, `resume_at` names where the next run
starts), stops between steps when `cancel` is set, and cuts off any single
LanceDB call after `call_timeout` seconds (the call is left to finish in a
background thread and the table is `skipped` until it does). On object
storage, where one call can be slow, a call is also cut off when the budget
runs out (the table is `deferred`, "budget exhausted"; the call finishes in
its thread), so a run returns about when its budget says. Between steps the
budget only stops a run past its first table, so every run gets somewhere. A lost commit
race with a writer is benign: the table is `deferred`, not `failed`. One
table failing never stops the others.

Outcomes and the time of the last success / count of consecutive failures
per table are kept in `<uri>/.jobspool-maintenance.json` (local URIs only)
so `jobspool health` can report them (`read_maintenance_state`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from jobspool.errors import ProjectionError
from jobspool.projection.beat import Beat
from jobspool.projection.calls import CallTimedOut, _busy, _call_with_deadline, is_conflict
from jobspool.projection.database import damaged_table_dir
from jobspool.projection.handler import (
    DELETED_COLUMN,
    FENCE_COLUMN,
    TABLE_NAME_RE,
    WRITTEN_AT_COLUMN,
    _one_line,
)
from jobspool.projection.lance import ProjectionStore
from jobspool.projection.lancecalls import _open_table

# The records and the state file live in maintenance_state.py (health reads them
# without LanceDB); they stay importable from here.
from jobspool.projection.maintenance_state import (
    MaintenanceReport,
    Outcome,
    TableOutcome,
    _save_state,
    read_maintenance_state,
    state_path,
)
from jobspool.projection.objectstore import is_object_store, local_path
from jobspool.projection.schema import primary_key_of

log = logging.getLogger("jobspool.projection.maintenance")
T = TypeVar("T")


# --- seams: the LanceDB calls maintenance makes (tests inject failures here).


def _optimize(tbl: Any, cleanup_older_than: timedelta) -> None:
    # delete_unverified stays False, always: see the module docstring.
    tbl.optimize(cleanup_older_than=cleanup_older_than, delete_unverified=False)


def _count_rows(tbl: Any, where: str | None) -> int:
    return int(tbl.count_rows(where))


def _delete_rows(tbl: Any, where: str) -> None:
    tbl.delete(where)


def _has_index_on(tbl: Any, column: str) -> bool:
    return any(list(ix.columns) == [column] for ix in tbl.list_indices())


def _create_key_index(tbl: Any, column: str) -> None:
    from lancedb.index import BTree  # lazy, as every lancedb import

    tbl.create_index(column, config=BTree(), replace=False)


# --- the run


@dataclass
class _Run:
    store: ProjectionStore
    key: str
    deadline: float
    cleanup_older_than: timedelta
    tombstone_retention: timedelta
    min_live_token: int | None
    index_threshold: int
    cancel: threading.Event | None
    call_timeout: float
    clock: Callable[[], float]
    wall: float
    state: dict[str, Any] = field(default_factory=dict)
    # The run's first table goes through all its steps whatever the budget (only a cancel,
    # or on object storage a call cut off at the budget, stops it): a budget shorter than
    # one table's work deferred that table on every run, and runs never got anywhere.
    carry: bool = False

    def call_limit(self) -> float:
        """How long the next LanceDB call may take: on object storage, no longer than the budget."""
        if not is_object_store(self.store.uri):
            return self.call_timeout
        return min(self.call_timeout, max(self.deadline - self.clock(), 0.1))

    def stop_reason(self) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            return "canceled"
        if not self.carry and self.clock() >= self.deadline:
            return "budget exhausted"
        return None


class _BudgetSpent(Exception):
    """A call on object storage outlived the run's budget (it keeps running in its thread)."""


def _ordered(names: Sequence[str], resume_at: str | None) -> list[str]:
    # Start where the last run stopped, so a budget too small for all
    # tables still reaches every table over successive runs.
    names = list(dict.fromkeys(names))
    if resume_at in names:
        i = names.index(resume_at)
        return names[i:] + names[:i]
    return names


# The longest the table listing may take, or the run's budget when larger (and never past
# `call_timeout`): not counted in the budget (a slow listing deferred every table), but
# bounded: on a store that accepts connections and never answers, `maintain --budget 3`
# waited as long as the stall lasted, before its budget had even started.
LIST_SECONDS = 30.0


def _list_tables(store: ProjectionStore, limit: float) -> list[str]:
    try:
        return _call_with_deadline(store.table_names, limit, (str(store.uri), "\0tables"))
    except CallTimedOut:
        raise ProjectionError(f"could not list the tables of {store.uri} within {limit:g} s "
                              "(is its storage answering?); nothing was maintained") from None


def maintain(
    uri_or_store: str | os.PathLike[str] | ProjectionStore | Any,
    *,
    tables: Sequence[str] | None = None,
    key: str = "id",
    budget_seconds: float = 30.0,
    cleanup_older_than: timedelta = timedelta(minutes=10),
    tombstone_retention: timedelta = timedelta(hours=1),
    min_live_token: int | None = None,
    index_threshold: int = 50_000,
    cancel: threading.Event | None = None,
    call_timeout: float = 300.0,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    storage_options: dict[str, str] | None = None,
) -> MaintenanceReport:
    """Maintain the projected tables of a database, within a time budget.

    `uri_or_store` is a URI, a local directory, a LanceDB connection or a
    ProjectionStore. `tables` limits the run (default: every table, starting
    at the persisted `resume_at`). Returns a report with one outcome per
    table: `optimized`, `deferred` (budget spent, canceled, or a lost commit
    race; with the reason), `skipped` (absent, unchanged since the last run,
    or a previous call still running) or `failed` (with the error).
    Never raises for a table's failure; raises only when the database
    itself cannot be listed. `storage_options` reach an object store when
    a URI is given (a store brings its own).
    """
    if cleanup_older_than <= timedelta(0):
        raise ValueError("cleanup_older_than must be positive: 0 breaks concurrent readers")
    started = clock()
    store = (
        uri_or_store if isinstance(uri_or_store, ProjectionStore)
        else ProjectionStore(uri_or_store, key=key, storage_options=storage_options)
    )
    if tables is not None:
        check_table_names(tables)  # before anything runs, or is recorded as failing
    local = None if store.uri is None else local_path(store.uri)
    if local is not None and not os.path.isdir(local):
        # No projection there yet (nothing was ever projected): connecting would create one.
        return MaintenanceReport((), None, clock() - started, False)
    state = read_maintenance_state(store.uri) if store.uri is not None else {"tables": {}}
    listed = _list_tables(store, min(call_timeout, max(budget_seconds, LIST_SECONDS))) \
        if tables is None else None
    names = list(tables) if tables is not None else listed or []
    order = _ordered(names, state.get("resume_at"))
    run = _Run(
        store,
        store.key,
        # From here, not from `started`: listing the tables (connecting) can take longer
        # than a small budget, and a run that starts nothing never gets anywhere.
        clock() + budget_seconds,
        cleanup_older_than,
        tombstone_retention,
        min_live_token,
        index_threshold,
        cancel,
        call_timeout,
        clock,
        wall_clock(),
        state.get("tables", {}),
    )
    outcomes: list[TableOutcome] = []
    resume_at: str | None = None
    for i, name in enumerate(order):
        # The first table is started whatever budget is left (only a cancel, or a budget
        # of 0, "nothing may start", stops it): checked before it too, a budget spent
        # listing the tables (under a millisecond, or a slow object store) deferred every
        # table on every run.
        run.carry = i == 0 and budget_seconds > 0
        stop = run.stop_reason()
        if stop is not None:
            resume_at = name
            outcomes.extend(TableOutcome(n, "deferred", stop) for n in order[i:])
            break
        run.carry = i == 0  # started: the first table goes through (see `_Run.carry`)
        outcome = _maintain_table(run, name)
        outcomes.append(outcome)
        if outcome.outcome == "deferred" and outcome.reason in ("canceled", "budget exhausted"):
            resume_at = name
            outcomes.extend(TableOutcome(n, "deferred", outcome.reason) for n in order[i + 1 :])
            break
        log.log(
            logging.WARNING if outcome.outcome == "failed" else logging.DEBUG,
            "maintenance of table %r: %s (%s)",
            name,
            outcome.outcome,
            outcome.reason,
        )
    canceled = cancel is not None and cancel.is_set()
    touch_resume = tables is None or resume_at is not None or state.get("resume_at") in names
    # A table that does not exist is not remembered (a typo would be "failing" for ever),
    # and a full run forgets tables that are gone.
    kept = [o for o in outcomes if o.reason != NO_SUCH_TABLE]
    _save_state(store.uri, kept, resume_at, wall_clock(), touch_resume=touch_resume,
                known=None if listed is None else set(listed))
    return MaintenanceReport(tuple(outcomes), resume_at, clock() - started, canceled)


NO_SUCH_TABLE = "table does not exist"


def check_table_names(tables: Sequence[str]) -> None:
    """`ValueError` naming the first name no handler could have written (`TABLE_NAME_RE`:
    `..` or `.x` reached LanceDB, which failed the table or called it missing)."""
    bad = [t for t in tables if not isinstance(t, str) or not TABLE_NAME_RE.fullmatch(t)]
    if bad:
        raise ValueError(f"invalid table name {bad[0]!r}: letters, digits, '_', '-' and '.', "
                         "not starting with '-' or '.', at most 128 characters")


def _maintain_table(run: _Run, name: str) -> TableOutcome:
    started = run.clock()
    slot = (run.store.uri or "", name)
    if _busy(slot):
        return TableOutcome(name, "skipped", "a previous maintenance call is still running")
    before: int | None = None
    removed = 0
    indexed = False

    def call(fn: Callable[[], T]) -> T:
        limit = run.call_limit()
        try:
            return _call_with_deadline(fn, limit, slot)
        except CallTimedOut:
            if limit < run.call_timeout:
                raise _BudgetSpent from None
            raise

    def write(fn: Callable[[], T]) -> T:
        # Keep this process's merges off the table while maintenance commits,
        # so the rewrite is not preempted (see ProjectionStore.exclusive).
        lock = run.store.exclusive(name)
        if not lock.acquire(timeout=run.call_timeout):
            raise CallTimedOut(f"table stayed busy with writes for {run.call_timeout:g}s")
        try:
            return call(fn)
        finally:
            lock.release()

    def done(outcome: Outcome, reason: str, after: int | None = None) -> TableOutcome:
        return TableOutcome(name, outcome, reason, run.clock() - started, before, after, removed, indexed)

    try:
        run.store.check_endpoint()  # it rewrites the table: the same check as a write's
        conn = run.store.connection
        tbl = call(lambda: _open_table(conn, name))
        if tbl is None:
            if damaged_table_dir(run.store.uri, name):
                # Its directory is there but LanceDB finds no table: damaged, not absent.
                return done("failed", f"{name}.lance exists but is not a readable table "
                                      "(damaged: its _versions/ or manifest missing?)")
            return done("skipped", NO_SUCH_TABLE)
        before = int(tbl.version)
        prev = run.state.get(name) or {}
        last_success = prev.get("last_success")
        unchanged = (
            prev.get("version_after") == before
            and isinstance(last_success, int | float)
            and run.wall - last_success < run.cleanup_older_than.total_seconds()
        )

        schema_names = set(tbl.schema.names)
        doomed = 0
        if run.min_live_token is not None and WRITTEN_AT_COLUMN in schema_names:
            cutoff = run.wall - run.tombstone_retention.total_seconds()
            where = (
                f"{DELETED_COLUMN} = true AND {FENCE_COLUMN} < {int(run.min_live_token)}"
                f" AND {WRITTEN_AT_COLUMN} < {cutoff!r}"
            )
            # Count first: a delete that matches nothing still commits a version.
            doomed = call(lambda: _count_rows(tbl, where))
        if unchanged and not doomed:
            return done("skipped", "unchanged since the last maintenance", before)
        if doomed:
            write(lambda: _delete_rows(tbl, where))
            removed = doomed
        if (stop := run.stop_reason()) is not None:
            return done("deferred", stop, int(tbl.version))

        # The key the table was made with (its schema's primary key): a table keyed on
        # `path` never got its index when the store's default key ("id") was asked for.
        key = primary_key_of(tbl.schema) or run.store.key_of(name)
        if key in schema_names and not call(lambda: _has_index_on(tbl, key)):
            rows = call(lambda: _count_rows(tbl, None))
            if rows >= run.index_threshold:
                write(lambda: _create_key_index(tbl, key))
                indexed = True
        if (stop := run.stop_reason()) is not None:
            return done("deferred", stop, int(tbl.version))

        write(lambda: _optimize(tbl, run.cleanup_older_than))
        after = int(tbl.version)
        parts = ["compacted and cleaned up"]
        if removed:
            parts.append(f"removed {removed} tombstones")
        if indexed:
            parts.append(f"indexed {key!r}")
        return done("optimized", "; ".join(parts), after)
    except _BudgetSpent:  # the call goes on in its thread; the table is skipped until it ends
        return done("deferred", "budget exhausted")
    except CallTimedOut as exc:
        return done("failed", str(exc))
    except Exception as exc:
        if is_conflict(exc):
            return done("deferred", f"lost a commit race, retried next run: {_one_line(exc)}")
        return done("failed", _one_line(exc))


# --- the beat


class MaintenanceBeat(Beat):
    """A throttled background maintainer the worker pokes after each committed batch.

    `note_commit(table)` counts commits; `maybe_run()` never blocks: it wakes
    a background thread that runs `maintain` on the tables that are due. A
    table is due once it has commits and either `interval` seconds passed
    since its last run (trailing edge: the run happens even if the worker
    goes quiet) or `commit_threshold` commits piled up. One run at a time,
    so at most one maintenance per table at a time within a process;
    between processes a lost race is benign.

    `min_live_token` is an int, or a callable returning one (or None), asked
    at the start of each run; it must be safe to call from another thread.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | ProjectionStore | Any,
        *,
        interval: float = 60.0,
        commit_threshold: int = 100,
        budget_seconds: float = 10.0,
        cleanup_older_than: timedelta = timedelta(minutes=10),
        tombstone_retention: timedelta = timedelta(hours=1),
        min_live_token: int | Callable[[], int | None] | None = None,
        index_threshold: int = 50_000,
        call_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(interval=interval, commit_threshold=commit_threshold, clock=clock)
        # One store for every run: its connection is opened once, lazily.
        self._target = target if isinstance(target, ProjectionStore) else ProjectionStore(target)
        self._options: dict[str, Any] = {
            "budget_seconds": budget_seconds,
            "cleanup_older_than": cleanup_older_than,
            "tombstone_retention": tombstone_retention,
            "index_threshold": index_threshold,
            "call_timeout": call_timeout,
        }
        self._min_live_token = min_live_token

    def _run(self, tables: list[str]) -> MaintenanceReport | None:
        try:
            token = self._min_live_token
            min_token = token() if callable(token) else token
            return maintain(
                self._target, tables=tables, min_live_token=min_token, cancel=self._cancel, **self._options
            )
        except Exception as exc:  # the beat must outlive any single bad run
            log.warning("maintenance beat run failed: %s", _one_line(exc))
            return MaintenanceReport(
                tuple(TableOutcome(t, "failed", _one_line(exc)) for t in tables), None, 0.0
            )

    def __enter__(self) -> MaintenanceBeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CallTimedOut",
    "MaintenanceBeat",
    "MaintenanceReport",
    "TableOutcome",
    "is_conflict",
    "maintain",
    "read_maintenance_state",
    "state_path",
]
