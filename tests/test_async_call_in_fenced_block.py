"""An AsyncSpool call awaited inside a fenced block is refused at once, in one line.

Found by a lock-order probe: the call runs on another thread. On the file spool it waited
for the spool lock the block (on the loop's thread) holds, for ever: the handler's time
limit could not end it, nor could anything else. On PostgreSQL it ran outside the block's
transaction, unfenced. The docs already said never to await inside a fenced block.
"""

from __future__ import annotations

import anyio
import pytest

from jobspool import AsyncSpool, Context, Job, JobState, Spool, Worker


def test_an_async_handler_awaiting_the_spool_inside_its_fenced_block_fails_its_job(
        any_spool: Spool) -> None:
    aspool = AsyncSpool(any_spool)

    async def handler(job: Job, ctx: Context) -> None:
        with ctx.fenced():
            await aspool.enqueue("follow-up", {})

    job = any_spool.enqueue("k", {}, max_attempts=1)
    report = Worker(any_spool, {"k": handler}, maintenance=False).run_until_idle()
    assert report.dead_lettered == 1
    dead = any_spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert "AsyncSpool call awaited inside the fenced block" in (dead.last_error or "")
    assert list(any_spool.jobs(kind="follow-up")) == []


def test_awaiting_the_spool_inside_spool_fenced_is_refused(any_spool: Spool) -> None:
    # On PostgreSQL (found by a regression probe) the enqueue ran outside the block's
    # transaction: it stayed although the block rolled back.
    aspool = AsyncSpool(any_spool)
    any_spool.enqueue("k", {}, job_id="j")
    [lease] = any_spool.claim()

    async def main() -> None:
        with pytest.raises(ValueError, match="rolled back"), any_spool.fenced(lease):
            with pytest.raises(RuntimeError, match="inside a fenced block"):
                await aspool.enqueue("other", {})
            raise ValueError("rolled back")
        assert (await aspool.get("j")).state is JobState.LEASED  # after the block: fine
        assert await aspool.jobs(kind="other") == []

    anyio.run(main)
