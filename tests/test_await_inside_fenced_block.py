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
