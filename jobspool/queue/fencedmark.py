"""Which fenced block, if any, the code now running was handed from.

`ctx.fenced()` marks its block in a context variable: anyio carries it into what the block's
code hands work to (a coroutine a sync handler runs on the loop with
`anyio.from_thread.run`, a function run in a worker thread with `anyio.to_thread.run_sync`,
a task it starts). A spool call made there runs on another thread than the block's, which
holds the file spool's lock and waits for that call: it would wait for ever, so such calls
are refused instead (`AsyncSpool`, `SpoolLock.acquire`). The mark is a list, emptied as the
block ends: a copy of the context outlives the block in a thread the block started.
"""

from __future__ import annotations

import contextvars

FENCED_CALLER: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "jobspool_fenced_caller", default=None)


def handed_from() -> str | None:
    """The job id of the open fenced block the running code was handed from, if any."""
    caller = FENCED_CALLER.get()
    return caller[0] if caller else None
