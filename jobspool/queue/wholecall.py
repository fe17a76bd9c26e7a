"""A call in a worker thread that a cancellation never cuts in half.

anyio shields a thread's call from its own cancel scopes (the caller waits for it, then
is cancelled), not from asyncio's `task.cancel()` (`asyncio.wait_for`,
`asyncio.timeout`, a failing `TaskGroup` sibling, a server cancelling a request or its
lifespan at shutdown): the caller got `CancelledError` at once while the call went on
in its thread. What it did then had no owner:

- an enqueue landed after the caller was told "cancelled": a retry ran the job twice;
- a worker's claim leased jobs that never reached its hand: they stayed leased, an
  attempt charged, to be taken back only once the leases expired (with
  `max_attempts=1`, dead-lettered unrun);
- a worker's settle was still completing jobs while the way out released them: the
  release won the race, and every finished handler ran again.

Here the caller waits for the call to finish, hands what it returned to `landed` (the
worker takes the leases into its hand, to give them back uncounted), then raises the
cancellation. A cancellation that came before the call began raises with nothing done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")


def on_asyncio() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def whole_in_thread(call: Callable[[], T], *,
                          limiter: anyio.CapacityLimiter | None = None,
                          landed: Callable[[T], None] | None = None) -> T:
    """`anyio.to_thread.run_sync(call)`; a cancellation meanwhile is raised once it is done,
    after `landed(result)` when it returned."""
    if not on_asyncio():
        # trio cancels through scopes only, which anyio's thread call already waits out.
        return await _checked(await anyio.to_thread.run_sync(call, limiter=limiter), landed)
    import asyncio

    # Cancelled before it began (a cancel scope already cancelled or past its deadline, a
    # cancel asked of the task): raised here, with nothing done. The thread's task starts
    # outside the caller's scope, so without this the call ran and the caller was told
    # "cancelled"; trio's path checks first too. One loop turn first:
    # `asyncio.timeout(0)` (a deadline already passed) cancels from a callback scheduled
    # on the loop, not yet run when the call starts.
    await asyncio.sleep(0)
    await anyio.lowlevel.checkpoint_if_cancelled()
    result, cancelled = await _through_cancels(
        asyncio.ensure_future(anyio.to_thread.run_sync(call, limiter=limiter)))
    if cancelled is not None:
        if landed is not None:
            landed(result)
        raise cancelled
    return await _checked(result, landed)


async def _through_cancels(task: asyncio.Future[T]) -> tuple[T, asyncio.CancelledError | None]:
    """`task`'s result, waited for whatever cancels the caller meanwhile, with the first
    such cancellation (for the caller to raise once it has dealt with the result). What the
    task raised is raised, the caller's cancellation instead when there was one."""
    import asyncio

    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError as exc:
            if task.done() and task.cancelled():
                raise  # the task itself was cancelled (the loop is closing)
            cancelled = exc  # it goes on: wait for it first
        except BaseException:
            if cancelled is not None:
                raise cancelled from None  # done (it raised): the caller was cancelled
            raise


async def _checked(result: T, landed: Callable[[T], None] | None) -> T:
    """`result`, unless a cancellation came while the thread ran: raised here, once the
    call is done, after `landed(result)`. Without this checkpoint the caller got the
    result as if nothing had happened."""
    try:
        await anyio.lowlevel.checkpoint()
    except BaseException:
        if landed is not None:
            landed(result)
        raise
    return result


async def whole(work: Callable[[], Awaitable[T]]) -> T:
    """`await work()` to its end whatever cancels the caller meanwhile (then raised after
    it): the worker's way out, which gives back what the run held. A cancel scope's
    shield keeps anyio's cancellations out, not asyncio's `task.cancel()`: a second
    cancel (the first began the way out) ended it at its next await, every lease it was
    giving back left held, an attempt charged."""
    if not on_asyncio():
        return await work()
    import asyncio

    result, cancelled = await _through_cancels(asyncio.ensure_future(work()))
    if cancelled is not None:
        raise cancelled
    return result
