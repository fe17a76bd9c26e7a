"""`Lifecycle`: what the claim-run-settle pipeline asks of the worker that runs it.

Only the run's lifecycle: the stop and hurry flags, `stop` (the pipeline
stops its worker when the supervisor gives up), the start/end/hung notes a
process pool listens to, and `publish` of the run's counters. The rest a
pipeline is handed as values: its `WorkerConfig`, `Supervisor` and
`ProjectionSink`. `Worker` (`worker.py`) is the one implementation; the
pipeline imports only this, so the runtime's modules import one way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobspool.queue.context import Context
    from jobspool.queue.report import Counters


class Lifecycle(Protocol):
    @property
    def stopping(self) -> bool:
        """No new claims: `stop()` was asked (or a signal came)."""
        ...

    @property
    def hurrying(self) -> bool:
        """Cut off every running handler now, without waiting for the grace period."""
        ...

    def stop(self) -> None: ...

    def on_stop(self, wake: Callable[[], None] | None) -> None:
        """Call `wake` (from any thread) when `stop` or `hurry` is asked; None unsets it.
        An idle pipeline sleeps until a job arrives or this wakes it, not in short polls
        (optional: without it, the pipeline polls its stop flags every 50 ms)."""
        ...

    def publish(self, counters: Counters, *, final: bool = False) -> None: ...

    def note_start(self, ctx: Context) -> None: ...

    def note_end(self, ctx: Context) -> None: ...

    def note_began(self, ctx: Context) -> None:
        """In a time-limited sync handler's thread, as the handler begins."""
        ...

    def note_returned(self, ctx: Context) -> None:
        """In a sync handler's thread, as it returns (the loop may be held up)."""
        ...

    def note_hung(self, ctx: Context) -> None: ...
