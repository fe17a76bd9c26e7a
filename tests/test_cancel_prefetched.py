"""A job canceled while it waits in a worker's hand (claimed in a batch, not started yet)
is never started, on both stores; requeued meanwhile, it runs once, not twice at a time.

Before, the handler of every canceled job of the prefetched batch ran anyway (only its
result was discarded), and a cancel + requeue had the old lease's handler run beside the
new one. A job that waited over `RECHECK_SECONDS` asks the store before it starts.
Deadlines only guard against hangs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from jobspool import JobState, Worker
from jobspool.queue.context import RECHECK_SECONDS
from tests.spools import make_spool
from tests.waiting import wait_until

GUARD = 60.0


@pytest.mark.parametrize("handler_kind", ["sync", "async"])
@pytest.mark.parametrize("then_requeue", [False, True])
def test_a_job_canceled_while_waiting_in_hand_does_not_start(
        store_root: str | Path, handler_kind: str, then_requeue: bool) -> None:
    runs: Counter[str] = Counter()
    gate = threading.Event()

    def work(job, ctx):  # type: ignore[no-untyped-def]
        runs[job.id] += 1
        if job.id == "first":
            gate.wait(GUARD)

    async def awork(job, ctx):  # type: ignore[no-untyped-def]
        import anyio.to_thread

        runs[job.id] += 1
        if job.id == "first":
            await anyio.to_thread.run_sync(gate.wait, GUARD)

    with make_spool(store_root) as spool:
        spool.enqueue("w", {}, job_id="first", priority=-1)
        rest = [spool.enqueue("w", {}, job_id=f"j{i}").id for i in range(5)]
        worker = Worker(spool, handlers={"w": work if handler_kind == "sync" else awork},
                        concurrency=1, batch_size=10)
        thread = threading.Thread(target=worker.run_until_idle, daemon=True)
        thread.start()
        try:
            wait_until(lambda: runs["first"] == 1, GUARD, "the first handler to start")
            assert spool.get("j0").state is JobState.LEASED  # prefetched, waiting in hand
            for job_id in rest:
                spool.cancel(job_id)
                if then_requeue:
                    spool.requeue(job_id)
            time.sleep(RECHECK_SECONDS + 0.3)  # they waited long enough to be asked about
        finally:
            gate.set()
            thread.join(GUARD)
        assert not thread.is_alive()
        if then_requeue:
            # Given back by the operator, claimed anew: each ran once, by its new lease.
            assert runs == Counter(dict.fromkeys(["first", *rest], 1))
            assert {spool.get(j).state for j in rest} == {JobState.COMPLETED}
        else:
            assert runs == Counter({"first": 1})
            assert {spool.get(j).state for j in rest} == {JobState.CANCELED}
            assert {spool.get(j).attempts for j in rest} == {1}  # the claim's, never a run
