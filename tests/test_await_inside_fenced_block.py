"""An async handler that awaits inside its own `ctx.fenced()` block, beside rule-abiding
code on the same event loop (found by an async API probe).

The block is open on the loop's thread while its handler is suspended. Another handler's
block, opened meanwhile, was refused with a RuntimeError charged to *its* job (dead-lettered
at max_attempts=1) while the rule-breaker completed; a task of the user's with no block at
all had its AsyncSpool call refused as "awaited inside the fenced block of job 'a'". Now:
the other handler's run is given back uncounted (it runs again once the block is over), the
user's call waits for the block, and the handler that awaited inside its block is the one
that fails, saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import AsyncSpool, JobState, Worker
from jobspool.errors import FencedBlockBusy


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_handler_awaiting_in_its_block_fails_and_no_one_else(tmp_path: Path,
                                                                  backend: str) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool") as s:
            innocent_entered = anyio.Event()

            async def sloppy(job: Any, ctx: Any) -> str:
                with ctx.fenced():
                    await anyio.sleep(0.5)  # breaks the rule: other tasks run meanwhile
                return "ok"

            async def innocent(job: Any, ctx: Any) -> str:
                await anyio.sleep(0.1)  # inside the sloppy block's await
                with ctx.fenced():
                    innocent_entered.set()
                return "ok"

            async def web_request() -> None:
                await anyio.sleep(0.2)  # likewise: no block of its own
                seen["web"] = (await s.enqueue("email", job_id="e1")).state

            await s.enqueue("sloppy", job_id="a", max_attempts=1)
            await s.enqueue("innocent", job_id="b", max_attempts=1)
            async with anyio.create_task_group() as tg:
                tg.start_soon(web_request)
                await Worker(s, {"sloppy": sloppy, "innocent": innocent},
                             concurrency=2).arun_until_idle(wait_for_retries=5)
            seen["a"] = await s.get("a")
            seen["b"] = await s.get("b")
            seen["entered"] = innocent_entered.is_set()

    anyio.run(main, backend=backend)
    assert seen["web"] is JobState.READY  # the user's call waited for the block, then ran
    a, b = seen["a"], seen["b"]
    assert a.state is JobState.DEAD_LETTER, a
    assert "awaited inside its fenced block" in (a.last_error or ""), a.last_error
    # The innocent job ran again once the block was over, its refused run not counted.
    assert b.state is JobState.COMPLETED and b.attempts == 1, b
    assert seen["entered"]


def test_the_refusal_names_the_block_that_is_open() -> None:
    exc = FencedBlockBusy("b", "a")
    assert isinstance(exc, RuntimeError)
    assert "'a'" in str(exc) and "'b'" in str(exc) and "awaited" in str(exc)


def test_blocks_of_one_job_ending_out_of_order_leave_no_mark(tmp_path: Path) -> None:
    # Two tasks of one handler, each awaiting inside a block of its own, the first to open
    # ending first: the thread's mark was restored out of order and named job 'a' for good;
    # every later block of another job was refused, its run deferred every 0.5 s, for ever.
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool") as s:
            async def sloppy(job: Any, ctx: Any) -> None:
                async def part(first: float, inside: float) -> None:
                    await anyio.sleep(first)
                    with ctx.fenced():
                        await anyio.sleep(inside)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(part, 0, 0.2)
                    tg.start_soon(part, 0.05, 0.4)

            async def later(job: Any, ctx: Any) -> str:
                with ctx.fenced():
                    return "entered"

            await s.enqueue("sloppy", job_id="a", max_attempts=1)
            await Worker(s, {"sloppy": sloppy}).arun_until_idle()
            await s.enqueue("later", job_id="b", max_attempts=1)
            with anyio.fail_after(60):  # a hang guard: it runs at once
                await Worker(s, {"later": later}).arun_until_idle(wait_for_retries=5)
            seen["b"] = await s.get("b")

    anyio.run(main)
    assert seen["b"].state is JobState.COMPLETED and seen["b"].result == "entered"


async def _sloppy(job: Any, ctx: Any) -> None:
    with ctx.fenced():
        await anyio.sleep(0.5)  # breaks the rule


def _beside_sloppy(root: Path, backend: str, handler: Any, **run: Any) -> dict[str, Any]:
    """Jobs 'a' (awaits inside its block) and 'b' (`handler(spool)`), run together."""
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSpool(root) as s:
            await s.enqueue("sloppy", job_id="a", max_attempts=1)
            await s.enqueue("other", job_id="b", max_attempts=1)
            await Worker(s, {"sloppy": _sloppy, "other": handler(s)},
                         concurrency=2).arun_until_idle(**run)
            seen["a"], seen["b"] = await s.get("a"), await s.get("b")

    anyio.run(main, backend=backend)
    return seen


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_block_refused_inside_a_task_group_goes_back_uncounted(tmp_path: Path,
                                                                  backend: str) -> None:
    # Raised in a task of the handler's, the refusal reached the worker as an ExceptionGroup
    # and the innocent job was dead-lettered.
    def innocent(s: AsyncSpool) -> Any:
        async def handler(job: Any, ctx: Any) -> str:
            async def write() -> None:
                await anyio.sleep(0.1)
                with ctx.fenced():
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
            return "written"
        return handler

    seen = _beside_sloppy(tmp_path / "spool", backend, innocent, wait_for_retries=5)
    assert seen["b"].state is JobState.COMPLETED and seen["b"].attempts == 1, seen["b"]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_handler_that_only_reads_waits_out_the_block(tmp_path: Path, backend: str) -> None:
    # `get` (and every read) was refused at once as "awaited inside the fenced block" while
    # another handler's block was open: the reading job was dead-lettered.
    def reader(s: AsyncSpool) -> Any:
        async def handler(job: Any, ctx: Any) -> str:
            await anyio.sleep(0.1)
            await s.stats()
            return (await s.get("a")).kind
        return handler

    seen = _beside_sloppy(tmp_path / "spool", backend, reader)
    assert seen["b"].state is JobState.COMPLETED and seen["b"].result == "sloppy", seen["b"]


def test_a_call_from_a_task_its_block_awaits_is_refused_not_hung(tmp_path: Path) -> None:
    # A task started before the block carries no mark of it: sent to its thread at once,
    # its call waited for the block's lock, and the block for the call, for ever.
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool") as s:
            async def handler(job: Any, ctx: Any) -> None:
                done = anyio.Event()

                async def child() -> None:
                    await anyio.sleep(0.05)
                    await s.enqueue("next", job_id="child-made")
                    done.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(child)
                    with ctx.fenced():
                        await done.wait()

            await s.enqueue("h", job_id="a", max_attempts=1)
            with anyio.fail_after(120):  # a hang guard: it is refused after 10 s
                await Worker(s, {"h": handler}).arun_until_idle()
            seen["a"] = await s.get("a")
            seen["child"] = await s.stats()

    anyio.run(main)
    assert seen["a"].state is JobState.DEAD_LETTER
    assert "waited 10 s for the fenced block of job 'a'" in (seen["a"].last_error or ""), \
        seen["a"].last_error


def test_a_block_ended_by_its_own_exception_still_fails_its_job(tmp_path: Path) -> None:
    # The charge came after the block's normal end only: a handler whose block ended by an
    # exception it then caught completed, its neighbour's block refused meanwhile.
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool") as s:
            async def sloppy(job: Any, ctx: Any) -> str:
                try:
                    with ctx.fenced():
                        await anyio.sleep(0.5)
                        raise LookupError("cache miss")
                except LookupError:
                    return "fallback"

            async def innocent(job: Any, ctx: Any) -> str:
                await anyio.sleep(0.1)
                with ctx.fenced():
                    return "ok"

            await s.enqueue("sloppy", job_id="a", max_attempts=1)
            await s.enqueue("innocent", job_id="b", max_attempts=1)
            await Worker(s, {"sloppy": sloppy, "innocent": innocent},
                         concurrency=2).arun_until_idle(wait_for_retries=5)
            seen["a"], seen["b"] = await s.get("a"), await s.get("b")

    anyio.run(main)
    assert seen["a"].state is JobState.DEAD_LETTER, seen["a"]
    assert "awaited inside its fenced block" in (seen["a"].last_error or "")
    assert seen["b"].state is JobState.COMPLETED and seen["b"].attempts == 1
