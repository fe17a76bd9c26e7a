"""`SpoolAPI`: what the worker, the async facade and the CLI need from a spool.

Two stores implement it: the file spool (`jobspool.queue.spool.Spool`) and
the PostgreSQL store (`jobspool.pg.spool.PgSpool`); `Spool(root)` picks one
from `root`. Everything above this line of the layering — `Worker`,
`AsyncSpool`, schedules, metrics — is typed against this protocol, so
mypy checks both stores keep the same surface, and a third store is a
class that satisfies it. The state machine (`machine.py`) stays outside
the stores: each asks it what a transition writes and persists the answer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from jobspool.errors import JobspoolError, LeaseLost
    from jobspool.queue.backlog import Waiting
    from jobspool.queue.job import EnqueueResult, Job, Lease, Reservation
    from jobspool.queue.layout import SpoolSettings
    from jobspool.queue.states import JobState


class ArrivalWatcher(Protocol):
    """Wakes an idle worker when a job may have arrived (inotify, LISTEN/NOTIFY)."""

    @property
    def active(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...

    def close(self) -> None: ...


class HoldsLock(Protocol):
    """The spool's mutation lock (a file spool's `.lock`; a process-local one elsewhere)."""

    def hold(self) -> AbstractContextManager[Any]: ...


@runtime_checkable
class SpoolAPI(Protocol):
    """The public surface every store offers (DESIGN §5 and §9, plus the batched forms)."""

    @property
    def root(self) -> Path: ...  # a local directory (for a database: per-process artifacts)

    @property
    def lease_seconds(self) -> float: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def retry_base_seconds(self) -> float: ...

    @property
    def retry_max_seconds(self) -> float: ...

    @property
    def keep_terminal(self) -> int: ...

    @property
    def keep_dead(self) -> int: ...

    @property
    def prepare_grace_seconds(self) -> float: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def settings(self) -> SpoolSettings: ...

    @property
    def durable(self) -> bool: ...

    @property
    def overlap_settles(self) -> bool: ...  # whether a worker settles while it claims

    @property
    def access(self) -> str: ...

    @property
    def lock(self) -> HoldsLock: ...

    def close(self) -> None: ...

    def now(self) -> float: ...

    # producing
    def enqueue(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, on_conflict: str = "keep",
                unique_states: Iterable[JobState | str] | None = None,
                timeout: float | None = None) -> Job: ...

    def enqueue_result(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                       delay: float = 0.0, run_at: float | datetime | None = None,
                       priority: int = 0, max_attempts: int | None = None,
                       on_conflict: str = "keep",
                       unique_states: Iterable[JobState | str] | None = None,
                       timeout: float | None = None) -> EnqueueResult: ...

    def enqueue_many(self, kind: str, payloads: Iterable[Any], *,
                     job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                     run_at: float | datetime | None = None, priority: int = 0,
                     max_attempts: int | None = None, on_conflict: str = "keep",
                     unique_states: Iterable[JobState | str] | None = None,
                     timeout: float | None = None) -> list[Job]: ...

    def enqueue_many_results(self, kind: str, payloads: Iterable[Any], *,
                             job_ids: Sequence[str | None] | None = None, delay: float = 0.0,
                             run_at: float | datetime | None = None, priority: int = 0,
                             max_attempts: int | None = None, on_conflict: str = "keep",
                             unique_states: Iterable[JobState | str] | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]: ...

    def prepare(self, kind: str, payload: Any = None, *, job_id: str | None = None,
                delay: float = 0.0, run_at: float | datetime | None = None, priority: int = 0,
                max_attempts: int | None = None, timeout: float | None = None
                ) -> Reservation: ...

    def commit(self, reservation: Reservation) -> Job: ...

    def abort(self, reservation: Reservation) -> Job | None: ...

    # leasing
    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None,
              exclude: Collection[str] = ()) -> list[Lease]: ...

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease: ...

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]: ...

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]: ...

    def complete(self, lease: Lease, result: Any = None) -> Job: ...

    def complete_many(self, items: Sequence[tuple[Lease, Any]]
                      ) -> list[Job | JobspoolError]: ...

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job: ...

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]: ...

    def release(self, lease: Lease, *, delay: float = 0.0,
                reason: str | None = None) -> Job: ...

    def fenced(self, lease: Lease) -> AbstractContextManager[Lease]: ...

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None: ...

    def waiting(self) -> dict[str, Waiting]: ...

    def note_running(self, tokens: Iterable[int], *, started: bool) -> None: ...

    def min_live_token(self) -> int: ...

    def fence_value(self) -> int: ...

    def arrival_watcher(self) -> ArrivalWatcher: ...

    def stop_retrying(self, stop: bool = True) -> None: ...  # shutting down: fail fast

    # schedules (jobspool.schedules): the last fired tick of each schedule
    def schedule_marks(self, *, rules: bool = False) -> dict[str, int]: ...

    def hold_schedule_marks(self) -> AbstractContextManager[dict[str, int]]: ...

    # administration and reading
    def cancel(self, job_id: str) -> Job: ...

    def requeue(self, job_id: str) -> Job: ...

    def requeue_all(self, state: JobState | str = ...) -> list[Job]: ...

    def get(self, job_id: str) -> Job: ...

    def jobs(self, state: JobState | str | None = None, kind: str | None = None
             ) -> Iterator[Job]: ...

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: float = 0.05) -> Job: ...

    def stats(self, *, by_kind: bool = False) -> Any: ...

    def recover(self, replay: Any = None) -> Any: ...

    def prune(self, keep: int | None = None, older_than: float | None = None, *,
              keep_dead: int | None = None) -> Any: ...

    def health(self, **options: Any) -> Any: ...

    def fsck(self) -> Any: ...
