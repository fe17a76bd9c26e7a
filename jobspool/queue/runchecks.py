"""What a worker run checks before it starts: its options, and where it is called from
(a sync run inside a running event loop would block that loop)."""

from __future__ import annotations

import sys

from jobspool.errors import InvalidType
from jobspool.queue.arguments import check_flag


def check_run_options(progress: object, handle_signals: object) -> None:
    """A run's options checked before it claims: `progress=5` ran every job, then raised
    "'int' object is not callable" in an ExceptionGroup; `handle_signals="no"` (truthy)
    took over SIGTERM."""
    check_flag("handle_signals", handle_signals)
    if progress is not None and not callable(progress):
        raise InvalidType(f"progress must be a callable taking the run's report, or None; "
                          f"got {progress!r:.80}", field="progress")


def in_event_loop() -> bool:
    """Whether this thread is running an async event loop (asyncio or trio).

    Asked of the loops themselves, not through `sniffio`: anyio no longer depends on it,
    so a plain `pip install jobspool` has no sniffio and `run_until_idle` died importing
    it. A trio run has imported trio already, so trio is looked for only when loaded.
    """
    import asyncio

    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True
