"""An AsyncSpool call cancelled before it began writes nothing and raises the cancellation,
on both event loops. On asyncio the operation's thread ran as its own task, outside the
caller's cancel scope: a scope already cancelled (or `move_on_after(0)`) still wrote the
job and then told the caller "cancelled", so a retry under a new id ran it twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from jobspool import AsyncSpool, JobState, Spool

BACKENDS = ["asyncio", "trio"]


def _ready(root: Path) -> int:
    with Spool(root) as spool:
        return spool.stats().counts[JobState.READY.value]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_in_a_scope_cancelled_before_it_writes_nothing(tmp_path: Path,
                                                              backend: str) -> None:
    root = tmp_path / "s"
    outcomes: list[str] = []

    async def main() -> None:
        async with AsyncSpool(root) as spool:
            for i in range(3):
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await spool.enqueue("k", {"i": i})
                    outcomes.append("returned")
            with anyio.move_on_after(0):
                await spool.enqueue_many("k", [{"i": 9}])
                outcomes.append("returned")
            with anyio.CancelScope() as scope:
                scope.cancel()
                await spool.prepare("k", {"i": 10})
                outcomes.append("returned")

    anyio.run(main, backend=backend)
    assert outcomes == []
    assert _ready(root) == 0
    with Spool(root) as spool:
        assert spool.stats().total == 0


def test_an_asyncio_task_cancelled_before_the_call_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"

    async def main() -> str:
        async with AsyncSpool(root) as spool:
            async def body() -> str:
                me = asyncio.current_task()
                assert me is not None
                me.cancel()
                await spool.enqueue("k", {"i": 1})
                return "returned"

            try:
                return await asyncio.create_task(body())
            except asyncio.CancelledError:
                return "cancelled"

    assert asyncio.run(main()) == "cancelled"
    assert _ready(root) == 0


@pytest.mark.parametrize("method", ["enqueue", "enqueue_many", "prepare", "cancel"])
def test_an_asyncio_timeout_already_past_writes_nothing(tmp_path: Path, method: str) -> None:
    """`asyncio.timeout(0)` cancels from a loop callback not yet run when the call starts."""
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue("k", {"i": 0}, job_id="there")
    calls = {"enqueue": ("k", {"i": 1}), "enqueue_many": ("k", [{"i": 2}]),
             "prepare": ("k", {"i": 3}), "cancel": ("there",)}

    async def main() -> str:
        async with AsyncSpool(root) as spool:
            try:
                async with asyncio.timeout(0):
                    await getattr(spool, method)(*calls[method])
            except TimeoutError:
                return "timed out"
            return "returned"

    assert asyncio.run(main()) == "timed out"
    with Spool(root) as spool:
        assert [j.id for j in spool.jobs()] == ["there"]
        assert spool.get("there").state is JobState.READY  # type: ignore[union-attr]


def test_a_call_that_began_still_finishes_and_is_found(tmp_path: Path) -> None:
    """The promise for a cancellation while the thread runs is unchanged: the operation
    completes (here: it is on disk once the scope is left)."""
    root = tmp_path / "s"

    async def main() -> None:
        async with AsyncSpool(root) as spool:
            with anyio.CancelScope() as scope:
                async def cancel_soon() -> None:
                    await anyio.sleep(0)
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_soon)
                    await spool.enqueue("k", {"i": 1}, job_id="began")

    anyio.run(main, backend="asyncio")
    with Spool(root) as spool:
        job = spool.get("began")
        assert job is not None and job.state is JobState.READY
