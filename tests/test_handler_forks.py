"""A handler that forks a helper process: whatever way the child leaves the handler
(`sys.exit`, a return, an exception), it exits there. Caught as the job's failure, the
child went on running the worker's code with a copy of its leases and never exited."""

from __future__ import annotations

import os
import sys
import time

import pytest

from jobspool import Context, Job, JobState, Spool, Worker
from tests.waiting import wait_until

CHILD_WAYS = {
    "exit0": (lambda: sys.exit(0), 0),
    "exit3": (lambda: sys.exit(3), 3),
    "returns": (lambda: None, 0),
    "raises": (lambda: (_ for _ in ()).throw(ValueError("in the child")), 1),
}


@pytest.mark.parametrize("way", sorted(CHILD_WAYS))
def test_a_forked_child_leaving_the_handler_exits(spool: Spool, way: str) -> None:
    leave, code = CHILD_WAYS[way]
    children: list[int] = []

    def forks(job: Job, ctx: Context) -> dict[str, int]:
        pid = os.fork()
        if pid == 0:
            leave()
            return {"child": os.getpid()}
        children.append(pid)
        time.sleep(0.2)
        return {"child": pid}

    job = spool.enqueue("forks", {}, max_attempts=1)
    spool.enqueue("later", {})  # work the child must not take
    report = Worker(spool, {"forks": forks, "later": lambda j, c: "parent"}, concurrency=1,
                    batch_size=1, maintenance=False).run_until_idle()
    assert report.completed == 2 and report.dead_lettered == 0
    assert spool.get(job.id).state is JobState.COMPLETED
    (pid,) = children
    status: list[int] = []

    def reaped() -> bool:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(st)
        return bool(done)

    wait_until(reaped, 30.0, "the handler's child to exit")
    assert os.waitstatus_to_exitcode(status[0]) == code
