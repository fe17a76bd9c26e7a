"""The handler slots of one worker run: the `concurrency` cap, and who waits for a slot.

Shared by the per-job path (`Pipeline._run_one`) and both kinds of runners
(`runners.py`, `async_runners.py`), which keep a slot across jobs. A run
waiting for a slot is counted (`contended`) and wakes parked runners
(`on_wait`), so a runner gives its slot up at its next job boundary instead of
holding it through a backlog. Each wait says which job it is for (`seq`, its
place in claim order): a runner between jobs gives its slot up only to a wait
for an earlier job, so a batch mixing sync and async handlers runs in claim
order (priority first) instead of one runner's queue after the other's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.lowlevel


class Slots:
    """`concurrency` handler slots; `waiters` counts runs waiting for one.

    A freed slot goes to the waiting run for the earliest job in claim order (ties: the
    first to wait), not to the first to wait: per-job runs, started one per job as a batch
    is claimed, queued ahead of the runners and took every slot in turn, so a batch's jobs
    with a time limit all ran before its sync and async ones, whatever their priority.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._free = concurrency
        self.isolating = anyio.Lock()  # one rescued job gathers every slot at a time
        self.waiters = 0
        # Each wait's claim-order place and the event that hands it a slot, keyed by a
        # token per wait (in the order they began). Read from runner threads (`contended`):
        # `min` over a copy, which the GIL keeps whole.
        self._waits: dict[object, tuple[float, anyio.Event]] = {}
        self._granted: set[object] = set()  # handed a slot, not yet resumed
        # Claim-order places of runs started this turn, not yet waiting (`expect`).
        self._expected: list[float] = []
        self.on_wait: Callable[[], None] | None = None  # wakes parked runners

    def contended(self, before: float | None = None) -> bool:
        """Whether a run waits for a slot (a parked runner gives its own up); with `before`,
        one for a job earlier in claim order than that (a runner between jobs gives its
        slot up to it, and keeps it otherwise)."""
        if before is None:
            return self.waiters > 0
        waits = [w[0] for w in list(self._waits.values())] + list(self._expected)
        return min(waits, default=math.inf) < before

    def expect(self, seqs: list[float]) -> None:
        """Runs for the jobs at these places were started this turn: until each waits for
        its slot (its first step, a turn later: `take`) or `forget` says they had their
        turn, count them as waiting. Runners already going (a sync one parked with its
        slot and woken on its own thread by the claim, an async one between jobs) looked
        in that gap, saw no wait for an earlier job, and ran a later one first: a sync
        job of a claim started before an earlier async one (a flake in CI, reproduced
        every time by holding the loop for a moment after a claim)."""
        self._expected.extend(seqs)

    def forget(self, seqs: list[float]) -> None:
        """The runs `expect`ed for these places had their first step: any not waiting now
        (an async runner whose queue another emptied) is not counted any more."""
        for seq in seqs:
            with contextlib.suppress(ValueError):
                self._expected.remove(seq)

    async def take(self, seq: float = -math.inf) -> None:
        """One slot for the job at claim-order place `seq` (by default ahead of all);
        counted while it waits."""
        key, event = object(), anyio.Event()
        self._waits[key] = (seq, event)
        self.forget([seq])  # expected until now
        self.waiters += 1
        try:
            if self._free > 0:
                # Free slots go out after one turn of the loop, to the earliest jobs among
                # the runs started beside this one (a claim starts them all in one turn,
                # per-job runs before the runners): taken at once, the first started got
                # a slot whatever its place.
                await anyio.lowlevel.checkpoint()
                self._hand_out()
            if key not in self._granted:
                if self.on_wait is not None:
                    self.on_wait()  # a parked runner gives its slot up now
                await event.wait()
        except BaseException:
            self._waits.pop(key, None)
            if key in self._granted:  # handed one as it was cut off: it goes on
                self._granted.discard(key)
                self.release()
            raise
        finally:
            self.waiters -= 1
        self._granted.discard(key)

    def release(self) -> None:
        """Give a slot back: to the wait for the earliest job, if any waits."""
        self._free += 1
        self._hand_out()

    def _hand_out(self) -> None:
        while self._free > 0 and self._waits:
            key = min(self._waits, key=lambda k: self._waits[k][0])  # ties: the first to wait
            _, event = self._waits.pop(key)
            self._free -= 1
            self._granted.add(key)
            event.set()

    @contextlib.asynccontextmanager
    async def every(self) -> AsyncIterator[None]:
        """Every slot at once, for the block. A job that was running when a worker died
        (`rescues`) runs alone: if it kills this worker too, it is the only one running
        here, so recovery charges it alone instead of the batch mates beside it (issue 10)."""
        taken = 0
        try:
            async with self.isolating:
                for _ in range(self.concurrency):
                    await self.take()  # ahead of every job: each runner gives its slot up
                    taken += 1
            yield
        finally:
            for _ in range(taken):
                self.release()
