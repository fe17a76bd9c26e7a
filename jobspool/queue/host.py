"""`WorkerHost`: what the claim-run-settle pipeline is handed by the worker that runs it.

Three parts, each a few names: the configuration (kinds, batch size, lease,
per-kind policies), the supervisor (stop and hurry flags, `supervise` for a
failure of our own machinery, the start/end/hung notes a process pool
listens to, `publish` of counters) and the projection sink (the store the
batch's writes go through, `note_commits` for its maintenance). `Worker`
(`worker.py`) is the one implementation; the pipeline imports only this, so
the runtime's modules import one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI
    from jobspool.queue.context import Context
    from jobspool.queue.machine import RetryPolicy
    from jobspool.queue.report import Counters


class WorkerHost(Protocol):
    # configuration
    @property
    def spool(self) -> SpoolAPI: ...

    @property
    def kinds(self) -> frozenset[str]: ...

    @property
    def handlers(self) -> Mapping[str, Any]: ...

    @property
    def keys(self) -> Mapping[str, str]: ...

    @property
    def owner(self) -> str: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def lease_seconds(self) -> float: ...

    @property
    def grace_seconds(self) -> float: ...

    def is_async(self, kind: str) -> bool: ...

    def timeout_for(self, kind: str) -> float | None: ...

    def retries(self, kind: str, exc: BaseException) -> bool: ...

    def retry_policy(self, kind: str) -> RetryPolicy | None: ...

    def max_attempts_for(self, kind: str) -> int | None: ...

    # supervisor
    @property
    def stopping(self) -> bool: ...

    @property
    def hurrying(self) -> bool: ...

    def stop(self) -> None: ...

    async def supervise(self, exc: BaseException, counters: Counters) -> None: ...

    def publish(self, counters: Counters, *, final: bool = False) -> None: ...

    def note_start(self, ctx: Context) -> None: ...

    def note_end(self, ctx: Context) -> None: ...

    def note_hung(self, ctx: Context) -> None: ...

    # projection sink
    def projection_store(self) -> Any: ...

    def note_commits(self, store: Any, tables: list[str]) -> None: ...
