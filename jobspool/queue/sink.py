"""Projection sinks: where a settling batch's buffered writes go.

The pipeline is handed a `ProjectionSink` and knows nothing else of the
projection: it calls `apply` (from a worker thread) with the writes of the
jobs whose leases it has just checked, and reads back which jobs' writes were
rejected (their rows can never fit: dead letter) or failed (outcome unknown:
retry, the fenced merge makes the re-run idempotent).

- `LanceSink`: the LanceDB-backed projection a `Worker` writes through —
  opened on first use (lancedb is slow to import), checked before claiming,
  and followed by its maintenance beat after each commit.
- `NoProjection`: a sink for a pipeline that projects nothing; a job that
  writes rows anyway is dead-lettered, its rows never silently dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from jobspool.errors import ProjectionUnusable

if TYPE_CHECKING:
    from jobspool.projection.handler import PendingWrite
    from jobspool.projection.lance import ProjectionStore
    from jobspool.projection.maintenance import MaintenanceBeat
    from jobspool.projection.plan import ApplyResult

log = logging.getLogger("jobspool.queue.worker")


class ProjectionSink(Protocol):
    """What the pipeline needs of a projection."""

    def apply(self, writes: Sequence[PendingWrite]) -> ApplyResult:
        """Commit the writes (one merge per table); blocking, called from a worker thread."""
        ...

    def close(self) -> None:
        """The run is over: stop whatever runs in the background for it."""
        ...


class NoProjection:
    """The sink of a pipeline that projects nothing: writing rows fails the job for good."""

    def apply(self, writes: Sequence[PendingWrite]) -> ApplyResult:
        from jobspool.errors import ProjectionError
        from jobspool.projection.plan import ApplyResult

        rejected = {w.job_id: ProjectionError(f"this worker has no projection: job {w.job_id} "
                                              f"wrote to table {w.table!r}") for w in writes}
        return ApplyResult(failed={}, rejected=rejected, tables={})

    def close(self) -> None:
        return None


def _make_private_dir(path: str | os.PathLike[str]) -> None:
    """Create the spool's own projection directory with the spool root's modes (issue 10):
    LanceDB writes its files with the umask's, so this directory is what keeps them private."""
    import contextlib
    import stat
    from pathlib import Path

    from jobspool.queue.perms import make_dir

    target = Path(path)
    if target.exists():
        return
    with contextlib.suppress(OSError):  # LanceDB makes it itself, and reports what fails
        make_dir(target, stat.S_IMODE(target.parent.stat().st_mode) & 0o2770)


class LanceSink:
    """The LanceDB projection a worker writes through, and its maintenance beat.

    `spec` is what `Worker(projection=...)` was given: a URI, a
    `ProjectionStore`, a raw LanceDB connection, or None for `default_uri`
    (the spool's own projection directory).
    """

    def __init__(self, spec: Any, *, default_uri: str | os.PathLike[str],
                 keys: Mapping[str, str], storage_options: dict[str, str] | None,
                 maintenance: bool = True,
                 min_live_token: Callable[[], int | None] | None = None) -> None:
        # A local path resolved now, against the directory the worker was made in: opened
        # lazily as given, a handler's os.chdir() before the first write moved the whole
        # projection, and a table's rows were split between two directories.
        self.spec = _absolute(spec)
        self.storage_options = storage_options  # checked (check_storage_options)
        self._default_uri = default_uri
        self._keys = dict(keys)
        self._maintenance = maintenance
        self._min_live_token = min_live_token
        self._store: ProjectionStore | None = None
        self._beat: MaintenanceBeat | None = None
        self._fence_checked = False
        self._closes = 0  # `close` calls: an apply begun before one schedules no maintenance

    def store(self) -> ProjectionStore:
        """The projection store (opened on first use)."""
        if self._store is None:
            from jobspool.projection.lance import ProjectionStore

            spec = self.spec
            if isinstance(spec, ProjectionStore):
                self._store = spec
            else:
                if spec is None or _same_path(spec, self._default_uri):
                    # The spool's own index/, named or not: private whatever the umask.
                    _make_private_dir(self._default_uri)
                # `keys` (App.keys): a table keyed on another column than `id` is merged on it.
                self._store = ProjectionStore(
                    spec if spec is not None else self._default_uri,
                    keys=self._keys, storage_options=self.storage_options)
        return self._store

    def before_claims(self, spool: Any) -> None:
        """What a run does before its first claim: the endpoint's check, then the fence."""
        self.check()
        self.keep_fence_above(spool)

    def check(self) -> None:
        """Before claiming: refuse an s3:// projection whose endpoint would lose commits."""
        from jobspool.projection.objectstore import (
            ObjectStoreUnreachable,
            check_conditional_put,
            is_object_store,
        )

        spec = self.spec
        # A ProjectionStore checks its own endpoint; a raw LanceDB connection keeps its options
        # to itself, so it is not checked.
        check = getattr(spec, "check_endpoint", None)
        if check is None and not (isinstance(spec, str) and is_object_store(spec)):
            return
        try:
            if check is not None:
                check()
            else:
                check_conditional_put(spec, self.storage_options)
        except ObjectStoreUnreachable as exc:  # an outage, not a verdict: checked again at first write
            log.warning("%s", exc)

    def keep_fence_above(self, spool: Any) -> None:
        """Before a run's first claim: raise the spool's token counter above every token the
        projection's rows hold (`projection/fencetop.py`). An outage or damage is left to
        the writes, which defer for it; a projection not made yet has no rows."""
        if self._fence_checked:
            return
        if self.spec is None and not os.path.isdir(self._default_uri):
            self._fence_checked = True  # no projection written yet (nor lancedb imported)
            return
        from jobspool.projection.faults import plain
        from jobspool.projection.fencetop import fence_top
        from jobspool.projection.handler import MAX_FENCE

        # Rows fenced past 2**61 are not a spool's tokens (a hand edit, a fence given by
        # hand): followed, the tokens after them would soon pass what a write may carry
        # (2**62) and every projection write would fail from then on, for good. The rows
        # below are followed as ever (ignoring them all for one such row lost every new
        # run's write to an older backup's rows).
        ceiling = MAX_FENCE // 2
        try:
            fence = spool.fence_value()
            top = fence_top(self.store(), fence, ceiling)
            beyond = fence_top(self.store(), max(fence, ceiling))
        except ProjectionUnusable:
            raise  # refused before any job is claimed: it would fail every write
        except Exception as exc:  # advisory: the writes meet the same fault and say so
            log.warning("could not read the projection's highest fencing token: %s: %s",
                        type(exc).__name__, plain(str(exc))[:300])
            return
        self._fence_checked = True
        if beyond is not None:
            log.error("the projection holds a row with fencing token %d, past 2**61: not "
                      "followed (this spool's tokens would run out of room below 2**62); "
                      "writes to that row's key lose to it until it is fixed by hand", beyond)
        if top is not None and spool.keep_tokens_above(top):
            log.warning("the projection holds rows written under tokens up to %d, above this "
                        "spool's fence %d (an older backup of the spool restored?): tokens go "
                        "on above them, so that new runs' writes win", top, fence)

    def apply(self, writes: Sequence[PendingWrite]) -> ApplyResult:
        closes = self._closes
        store = self.store()
        result = store.apply(writes)
        written = [t for t, n in result.tables.items() if n > 0]
        # A commit abandoned by a run that has ended (a hung store, `settle.py`) and landing
        # later started a maintenance thread nothing closed, compacting beside the next run.
        if written and closes == self._closes:
            try:
                self._note_commits(store, written)
            except Exception as exc:  # advisory: the commit landed, its jobs must not retry
                log.warning("could not schedule projection maintenance: %s: %s",
                            type(exc).__name__, exc)
        return result

    def _note_commits(self, store: ProjectionStore, tables: list[str]) -> None:
        """Tell the maintenance beat which tables just got a commit (it never blocks)."""
        if not self._maintenance:
            return
        try:
            from jobspool.projection.maintenance import MaintenanceBeat
        except ImportError:
            return
        if self._beat is None:
            self._beat = MaintenanceBeat(store, min_live_token=self._min_live_token)
        for t in tables:
            self._beat.note_commit(t)
        self._beat.maybe_run()

    def close(self, wait: float = 30.0, give_up: Callable[[], bool] | None = None) -> None:
        """Stop projection maintenance, waiting up to `wait` seconds for a step in progress
        (less if `give_up()` turns true meanwhile)."""
        self._closes += 1
        if self._beat is not None:
            self._beat.close(timeout=wait, give_up=give_up)
            self._beat = None


def _absolute(spec: Any) -> Any:
    """A local path (not a URI, not a store object) as an absolute one; the rest as given."""
    if not isinstance(spec, str | os.PathLike):
        return spec
    text = os.fspath(spec)
    if not isinstance(text, str) or "://" in text or not text:
        return spec
    # `~` expanded as every reader of the projection expands it (`objectstore.local_path`):
    # made absolute alone, "~/idx" became "<cwd>/~/idx", where nothing reads.
    return os.path.abspath(os.path.expanduser(text))


def _same_path(spec: Any, default: str | os.PathLike[str]) -> bool:
    if not isinstance(spec, str | os.PathLike):
        return False
    text = os.fspath(spec)
    text = text[len("file://"):] if text.startswith("file://") else text
    return "://" not in text and os.path.abspath(text) == os.path.abspath(default)

