"""Which fenced block, if any, the code now running was handed from.

`ctx.fenced()` marks its block in a context variable: anyio carries it into what the block's
code hands work to (a coroutine a sync handler runs on the loop with
`anyio.from_thread.run`, a function run in a worker thread with `anyio.to_thread.run_sync`,
a task it starts). A spool call made there runs on another thread than the block's, which
holds the file spool's lock and waits for that call: it would wait for ever. `AsyncSpool`
refuses such calls; `SpoolLock.acquire` waits `HANDED_WAIT_SECONDS` for the block's thread
to let go (work handed off and not awaited, which the block does not wait for, gets the lock
when the block ends), then refuses. The mark is a list, emptied as the block ends: a copy of
the context outlives the block in a thread the block started. It names the block's thread:
a call to a lock some other thread holds (another spool's) is no business of the block's.
"""

from __future__ import annotations

import contextvars

FENCED_CALLER: contextvars.ContextVar[list[tuple[str, int]] | None] = contextvars.ContextVar(
    "jobspool_fenced_caller", default=None)

# How long a spool call handed from inside a fenced block waits for the block's thread to let
# the lock go before it is refused (a block is short; one waiting on the call never ends).
HANDED_WAIT_SECONDS = 10.0


def handed_from() -> str | None:
    """The job id of the open fenced block the running code was handed from, if any."""
    caller = FENCED_CALLER.get()
    return caller[0][0] if caller else None


def refusal() -> RuntimeError:
    """The error for a call handed to another thread by code inside a fenced block that still
    holds the lock: it waited for ever, and the worker with it (a sync handler awaiting, on the
    loop, a call run in a worker thread)."""
    return RuntimeError(f"a spool call handed to another thread from inside the fenced block "
                        f"of job {handed_from()!r}: it would wait for that block's lock for "
                        "ever; call the spool on the block's own thread, or after the block")


def block_thread() -> int | None:
    """The thread of the open fenced block the running code was handed from, if any."""
    caller = FENCED_CALLER.get()
    return caller[0][1] if caller else None
