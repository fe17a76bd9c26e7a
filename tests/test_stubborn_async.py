"""An async handler that swallows every cancellation (catches CancelledError in a loop) is
no longer driven `ABANDON_SECONDS` after it first did: its time limit is recorded
(TimeLimitExceeded) and a stop past its grace gives its job back, instead of the job held
leased (unbeaten, so another worker could run it twice), a core busy and the worker
unstoppable but by SIGKILL. Deadlines only guard against hangs."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from jobspool import JobState, Policy, Worker
from jobspool.errors import TimeLimitExceeded
from tests.spools import make_spool
from tests.waiting import wait_until

GUARD = 60.0
ticks: list[int] = []


async def stubborn(job, ctx):  # type: ignore[no-untyped-def]
    while True:
        try:
            ticks.append(1)
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass


def test_past_its_time_limit_a_stubborn_handler_is_timed_out(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("s", {}, job_id="s1")
        worker = Worker(spool, handlers={"s": stubborn},
                        policies={"s": Policy(timeout=0.3, max_attempts=1)})
        done: list[object] = []
        thread = threading.Thread(target=lambda: done.append(worker.run_until_idle()),
                                  daemon=True)
        thread.start()
        thread.join(GUARD)
        assert not thread.is_alive(), "run_until_idle never returned"
        job = spool.get("s1")
        assert job.state is JobState.DEAD_LETTER
        assert TimeLimitExceeded.__name__ in (job.last_error or "")
        assert "went on through its cancellation" in (job.last_error or "")
        before = len(ticks)
        threading.Event().wait(0.3)
        assert len(ticks) == before  # no longer run


def test_a_stop_past_the_grace_gives_a_stubborn_handlers_job_back(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("s", {}, job_id="s1")
        worker = Worker(spool, handlers={"s": stubborn}, grace_seconds=0.2)
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        before = len(ticks)  # the earlier test's handler ticked into the same list
        thread.start()
        wait_until(lambda: spool.get("s1").state is JobState.LEASED and len(ticks) > before,
                   GUARD, "the handler to start")
        worker.stop()
        thread.join(GUARD)
        assert not thread.is_alive(), "the worker did not stop"
        job = spool.get("s1")
        assert job.state is JobState.READY  # given back: cut off by the shutdown
        assert "interrupted" in (job.last_error or "")
