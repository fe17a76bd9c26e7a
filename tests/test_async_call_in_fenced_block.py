"""An AsyncSpool call awaited inside a fenced block is refused at once, in one line.

Found by a lock-order probe: the call runs on another thread. On the file spool it waited
for the spool lock the block (on the loop's thread) holds, for ever: the handler's time
limit could not end it, nor could anything else. On PostgreSQL it ran outside the block's
transaction, unfenced. The docs already said never to await inside a fenced block.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from pathlib import Path
from typing import Any

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


def test_a_sync_handler_handing_the_spool_to_the_loop_inside_its_block_fails_its_job(
        any_spool: Spool) -> None:
    # The sync form of the same hang (left by the previous fix): the handler's thread holds
    # the block and waits on the loop, whose call waits for the block's lock.
    aspool = AsyncSpool(any_spool)

    def handler(job: Job, ctx: Context) -> None:
        with ctx.fenced():
            anyio.from_thread.run(aspool.enqueue, "follow-up", {})

    job = any_spool.enqueue("k", {}, max_attempts=1)
    report = Worker(any_spool, {"k": handler}, maintenance=False).run_until_idle()
    assert report.dead_lettered == 1
    dead = any_spool.get(job.id)
    assert "AsyncSpool call awaited inside the fenced block" in (dead.last_error or "")
    assert list(any_spool.jobs(kind="follow-up")) == []


def test_a_thread_started_inside_a_block_may_call_the_loop_after_it(any_spool: Spool) -> None:
    # What the block's code hands on keeps a copy of its context: the block's mark in it ends
    # with the block, so a call made after the block is not refused.
    aspool = AsyncSpool(any_spool)
    after_block = []

    def late_call(ended: anyio.Event) -> None:
        anyio.from_thread.run(ended.wait)
        after_block.append(anyio.from_thread.run(aspool.enqueue, "follow-up", {}).kind)

    async def handler(job: Job, ctx: Context) -> None:
        ended = anyio.Event()
        async with anyio.create_task_group() as tg:
            with ctx.fenced():
                tg.start_soon(anyio.to_thread.run_sync, late_call, ended)
            ended.set()

    any_spool.enqueue("k", {}, max_attempts=1)
    report = Worker(any_spool, {"k": handler}, maintenance=False).run_until_idle()
    assert report.completed == 1
    assert after_block == ["follow-up"]


def test_a_plain_spool_call_handed_to_a_worker_thread_inside_a_block_fails_its_job(
        make_spool: Any) -> None:
    # The same wait through a plain `Spool` call: the handler's block awaits, on the loop, a
    # call run in a worker thread, which waited for the block's own lock for ever (a
    # regression probe; no time limit: nothing ended it). Refused at the lock, in one line.
    spool = make_spool()

    async def enqueue_in_a_thread() -> None:
        await anyio.to_thread.run_sync(lambda: spool.enqueue("follow-up", {}))

    def handler(job: Job, ctx: Context) -> None:
        with ctx.fenced():
            anyio.from_thread.run(enqueue_in_a_thread)

    job = spool.enqueue("k", {}, max_attempts=1)
    report = Worker(spool, {"k": handler}, maintenance=False).run_until_idle()
    assert report.dead_lettered == 1
    error = spool.get(job.id).last_error or ""
    assert "handed to another thread from inside the fenced block" in error
    assert list(spool.jobs(kind="follow-up")) == []
    spool.enqueue("after", {})  # the lock is free again


def test_a_block_may_write_another_spool_whose_lock_another_thread_holds(
        make_spool: Any, tmp_path: Path) -> None:
    # Found by a probe of the refusal above: any call carrying the block's mark was refused
    # when any other thread held the lock it asked for, another spool's too.
    spool = make_spool()
    other = make_spool(tmp_path / "other")
    asking, held = threading.Event(), threading.Event()

    def hold_other() -> None:
        with other.journal.lock.hold():
            held.set()
            asking.wait(60)
            threading.Event().wait(0.2)  # the block's enqueue waits for it meanwhile

    def handler(job: Job, ctx: Context) -> None:
        with ctx.fenced():
            asking.set()
            other.enqueue("copied", {"of": job.id})

    holder = threading.Thread(target=hold_other)
    holder.start()
    assert held.wait(60)
    spool.enqueue("k", {}, job_id="j", max_attempts=1)
    report = Worker(spool, {"k": handler}, maintenance=False).run_until_idle()
    holder.join(60)
    assert report.completed == 1, spool.get("j").last_error
    assert [j.kind for j in other.jobs()] == ["copied"]


def test_work_a_block_hands_off_without_waiting_for_it_gets_the_lock_after_the_block(
        make_spool: Any) -> None:
    # Handed to an executor with the block's context and not awaited inside the block: the
    # block does not wait for it, so it waits for the block to end, and is not refused.
    spool = make_spool()
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def handler(job: Job, ctx: Context) -> str:
        with ctx.fenced():
            later = pool.submit(contextvars.copy_context().run, spool.enqueue, "follow-up", {})
        return later.result(60).kind

    spool.enqueue("k", {}, job_id="j", max_attempts=1)
    report = Worker(spool, {"k": handler}, maintenance=False).run_until_idle()
    pool.shutdown()
    assert report.completed == 1, spool.get("j").last_error
    assert spool.get("j").result == "follow-up"
