"""A pool child whose supervisor died before the child read its environment (found by a
SIGKILL probe: the supervisor killed while its children were starting, 3 runs of 6).

The child checked that its parent was the supervisor named; reparented already, it took
itself for no pool child and ran on as a standalone `worker` for ever, unsupervised,
claiming jobs (no one settles such a child's death, which is the supervisor's job). A
child whose pool pipe has no reader left is orphaned, not someone else's process: it
stops before it claims anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.queue.poolchild import POOL_FD_ENV, POOL_OWNER_ENV, POOL_PARENT_ENV
from tests.cli_harness import REPO
from tests.spools import make_spool

pytestmark = pytest.mark.slow

# Spawns one child the way `WorkerPool._spawn` does, prints its pid, and dies at once.
_SUPERVISOR = f"""
import os, subprocess, sys
rfd, wfd = os.pipe()
env = dict(os.environ, {POOL_FD_ENV}=str(wfd), {POOL_OWNER_ENV}="host:pool1.0.1",
           {POOL_PARENT_ENV}=str(os.getpid()))
log = open(sys.argv[2], "wb")
p = subprocess.Popen([sys.executable, "-m", "jobspool", "--root", sys.argv[1], "worker",
                      "--app", "tests.apps.simple:app"], env=env, pass_fds=(wfd,),
                     start_new_session=True, stdout=log, stderr=log)
print(p.pid, flush=True)
os._exit(0)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_a_child_orphaned_before_it_started_stops_without_claiming(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("work", [{"i": i} for i in range(20)])
    log = tmp_path / "child.log"
    out = subprocess.run([sys.executable, "-c", _SUPERVISOR, str(root), str(log)], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout.split()[0])
    try:
        deadline = time.monotonic() + 60  # a hang guard only: it stops as it starts
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), f"the orphaned child {pid} is still running: {log.read_text()}"
    finally:
        if not _gone(pid):
            os.kill(pid, 9)
    assert "supervisor is gone" in log.read_text(), log.read_text()
    with make_spool(root) as spool:
        assert spool.stats().counts[JobState.READY.value] == 20  # nothing claimed
        assert not list(spool.jobs(state="leased"))
