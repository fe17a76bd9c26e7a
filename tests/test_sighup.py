"""SIGHUP (the terminal a worker ran in closed: an ssh session that dropped) stops a worker
as SIGTERM does, its running handler finishing within the grace; before, it killed the
worker mid-handler and its lease was left to expire. A worker started under `nohup`
(SIGHUP ignored) keeps ignoring it. Deadlines only guard against hangs."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobspool import JobState
from tests.cli_harness import reap, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
APP = "tests.apps.simple:app"
GUARD = 60.0


@pytest.mark.parametrize("processes", [None, "1"])
def test_sighup_stops_a_worker_gracefully(tmp_path: Path, processes: str | None) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("slow", {"sleep": 1.0, "started": str(tmp_path / "started")}, job_id="s1")
    extra = ["--processes", processes] if processes else []
    proc = start_jobspool("worker", "--app", APP, *extra, root=root)
    try:
        wait_until((tmp_path / "started").exists, GUARD, "the handler to start", proc=proc)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    text = err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "SIGHUP" in text
    with make_spool(root) as spool:
        job = spool.get("s1")
    assert (job.state, job.attempts, job.rescues) == (JobState.COMPLETED, 1, 0)


def test_a_worker_under_nohup_keeps_ignoring_sighup(tmp_path: Path) -> None:
    root, served = tmp_path / "spool", tmp_path / "served.log"
    with make_spool(root) as spool:
        spool.enqueue("work", {"log": str(served)}, job_id="w1")
    proc = start_jobspool("worker", "--app", APP, "--poll", "0.2", root=root,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        # Started and serving: it ran a job. A fixed 2 s was not always enough for a loaded
        # machine to start the process, and a SIGTERM before its handlers were set killed it.
        wait_until(served.exists, GUARD, "the worker to serve a job", proc=proc)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, "SIGHUP stopped a worker that ignores it"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=GUARD)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGTERM did not stop the worker")
    finally:
        reap(proc)
    assert proc.returncode == 0
