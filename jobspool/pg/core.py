"""`PgCore`: what the PostgreSQL store's statement modules need of the spool they serve.

`leasing.py`, `produce.py`, `admin.py` and `migrate.py` type against this
protocol, not against `PgSpool` (which imports them), so the store's modules
import one way; `PgSpool` is the implementation mypy checks against it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.db import Database
    from jobspool.queue.job import Job
    from jobspool.queue.machine import RetryPolicy
    from jobspool.queue.states import JobState


class PgCore(Protocol):
    db: Database
    channel: str
    display: str
    next_sweep: float
    sweep_enabled: bool
    unnoted_starts: set[int]  # leases of rescued jobs whose start to record (leasing.py)

    @property
    def lease_seconds(self) -> float: ...

    @property
    def max_job_bytes(self) -> int: ...

    @property
    def max_rescues(self) -> int | None: ...

    @property
    def max_due(self) -> int | None: ...

    @property
    def max_lag_seconds(self) -> float | None: ...

    @property
    def keep_terminal(self) -> int: ...

    @property
    def keep_dead(self) -> int: ...

    @property
    def keep_terminal_seconds(self) -> float | None: ...

    @property
    def prepare_grace_seconds(self) -> float: ...

    @property
    def policy(self) -> RetryPolicy: ...

    @property
    def rng(self) -> random.Random: ...

    def now(self) -> float: ...

    def get(self, job_id: str) -> Job: ...

    def check_writable(self, action: str) -> None: ...

    def follow_clock(self, database_now: float) -> None: ...

    def now_param(self) -> float | None: ...

    def admit(self, n: int, conn: psycopg.Connection[Any] | None = None) -> None: ...

    def landed(self, n: int, written: bool) -> None: ...

    def log_swept(self, swept: list[tuple[str, str]]) -> None: ...

    def note_terminal(self, n: int) -> None: ...

    def fence_value(self) -> int: ...

    def jobs(self, state: JobState | str | None = None, kind: str | None = None
             ) -> Iterator[Job]: ...

    def mutate_job(self, job_id: str, decide: Callable[[Job, float], Job | None], *,
                missing: Callable[[], Any] | None = None, what: str = "update") -> Any: ...
