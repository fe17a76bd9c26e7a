"""A kind's `Policy(max_attempts=)` holds when the job's worker died running it, on both
stores. A crash records no failure, so the job kept its own limit (the spool's default,
5): a kind limited to one attempt ran a second time after its worker was SIGKILLed, where
one whose job said `max_attempts=1` was dead-lettered (a policy probe)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspool import JobState, Policy, Worker
from tests.spools import make_spool
from tests.subproc import cli_env

# A worker whose handler SIGKILLs its own process: a crash mid-run.
_DIE_RUNNING = textwrap.dedent("""
    import os, signal, sys
    from jobspool import Spool, Worker

    def die(job, ctx):
        os.kill(os.getpid(), signal.SIGKILL)

    Worker(Spool(sys.argv[1], lease_seconds=1.0), {"crash": die}).run_until_idle()
""")


def _crash_running(root: str | Path) -> None:
    done = subprocess.run([sys.executable, "-c", _DIE_RUNNING, str(root)], env=cli_env(),
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr


@pytest.mark.parametrize("limit", [1, 2])
def test_a_kinds_attempt_limit_holds_after_its_worker_died_running_the_job(
        store_root: str | Path, limit: int) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("crash", {}, job_id="j")
    _crash_running(store_root)
    ran: list[str] = []
    with make_spool(store_root) as spool:
        assert spool.get("j").state is JobState.LEASED
        worker = Worker(spool, {"crash": lambda job, ctx: ran.append(job.id)},
                        policies={"crash": Policy(max_attempts=limit)}, lease_seconds=30.0)
        report = worker.run_until_idle(wait_for_retries=30.0)
        job = spool.get("j")
    if limit == 1:  # the crashed run was its one attempt: dead-lettered unrun
        assert ran == [] and report.dead_lettered == 1 and report.completed == 0
        assert job.state is JobState.DEAD_LETTER and job.last_error is not None
        assert "past its kind's max_attempts=1 (a worker died running it)" in job.last_error
    else:  # one attempt left: it runs once more
        assert ran == ["j"] and report.completed == 1 and job.attempts == 2
