"""A worker paused (SIGSTOP) past its leases does not start, when it resumes, the handlers
of jobs whose leases ran out meanwhile: another worker may have taken and finished them
(found by a chaos run: the old run started 2 ms after SIGCONT and repeated side effects
made outside the projection). Its result would be discarded anyway. It says it was paused, rather than blaming its event
loop ("blocked ... by the worker's own code", as it did before 2026-12-04)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from jobspool import JobState
from tests.cli_harness import start_jobspool
from tests.spools import make_spool


def test_a_resumed_worker_does_not_start_jobs_whose_leases_ran_out(tmp_path: Path) -> None:
    root, log = tmp_path / "spool", tmp_path / "runs.log"
    log.touch()
    with make_spool(root) as spool:
        for i in range(3):
            spool.enqueue("slow", job_id=f"j{i}")
    worker = start_jobspool("worker", "--app", "tests.apps.pausable:app", "--concurrency", "1",
                            "--lease-seconds", "1", root=root,
                            env={"JOBSPOOL_TEST_LOG": str(log)})
    try:
        deadline = time.monotonic() + 120  # hang guards only
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.send_signal(signal.SIGSTOP)  # mid-run of the first job, the others queued
        first = log.read_text().split()[0]
        taken = []
        with make_spool(root) as spool:
            while len(taken) < 3 and time.monotonic() < deadline:
                for lease in spool.claim(kinds="slow", limit=3, lease_seconds=60.0):
                    spool.complete(lease, "taken over")
                    taken.append(lease.job_id)
                time.sleep(0.1)
        assert sorted(taken) == ["j0", "j1", "j2"]
        time.sleep(1.5)  # paused well past the 1 s a stall must last to be reported
        worker.send_signal(signal.SIGCONT)
        time.sleep(2.0)  # time to start the queued jobs, as it did
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    started = [line.split()[0] for line in log.read_text().splitlines()]
    assert started == [first]  # nothing started after the pause
    said = err.decode(errors="replace")
    assert "this worker process did not run for" in said and "event loop blocked" not in said, \
        said
    with make_spool(root) as spool:
        assert all(spool.get(f"j{i}").result == "taken over" for i in range(3))
        assert all(spool.get(f"j{i}").state is JobState.COMPLETED for i in range(3))
