"""The handler slots of one worker run: the `concurrency` cap, and who waits for a slot.

Shared by the per-job path (`Pipeline._run_one`) and both kinds of runners
(`runners.py`, `async_runners.py`), which keep a slot across jobs. A run
waiting for a slot is counted (`contended`) and wakes parked runners
(`on_wait`), so a runner gives its slot up at its next job boundary instead of
holding it through a backlog: slots go first come, first served, as a plain
limiter would hand them out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.lowlevel


class Slots:
    """`concurrency` handler slots; `waiters` counts runs waiting for one."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.limiter = anyio.CapacityLimiter(concurrency)
        self.isolating = anyio.Lock()  # one rescued job gathers every slot at a time
        self.waiters = 0
        self.on_wait: Callable[[], None] | None = None  # wakes parked runners

    def contended(self) -> bool:
        """Whether a run waits for a slot (a runner between jobs gives its own up)."""
        return self.waiters > 0

    def _waiting(self) -> None:
        self.waiters += 1
        if self.on_wait is not None:
            self.on_wait()  # a parked runner gives its slot up now

    async def take(self) -> None:
        """One slot; counted while it waits."""
        try:
            self.limiter.acquire_nowait()  # free: no runner need give one up
        except anyio.WouldBlock:
            pass
        else:
            try:  # as `acquire()` would: a run cut off before it starts does not start
                await anyio.lowlevel.checkpoint_if_cancelled()
            except BaseException:
                self.limiter.release()
                raise
            return
        self._waiting()
        try:
            await self.limiter.acquire()
        finally:
            self.waiters -= 1

    def release(self) -> None:
        self.limiter.release()

    @contextlib.asynccontextmanager
    async def every(self) -> AsyncIterator[None]:
        """Every slot at once, for the block. A job that was running when a worker died
        (`rescues`) runs alone: if it kills this worker too, it is the only one running
        here, so recovery charges it alone instead of the batch mates beside it (issue 10)."""
        taken: list[object] = []
        try:
            async with self.isolating:
                self._waiting()
                try:
                    for _ in range(self.concurrency):
                        borrower = object()
                        await self.limiter.acquire_on_behalf_of(borrower)
                        taken.append(borrower)
                finally:
                    self.waiters -= 1
            yield
        finally:
            for borrower in taken:
                self.limiter.release_on_behalf_of(borrower)
