"""SIGKILL against real `jobspool worker` processes (the CLI, the Worker pipeline, durable).

The lower-level SIGKILL test (`test_crash_sigkill.py`) kills loops of bare
spool calls; this one kills the program users run, mid-batch, with its
heartbeats, group settles and recycled staging files, and then does what a
service manager would: `jobspool recover`, then `jobspool run-until-idle`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import job_files, read_raw
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _worker(root: Path, log: Path) -> subprocess.Popen[bytes]:
    return start_jobspool("worker", "--app", "tests.apps.simple:app", "--kinds", "work",
                          "--concurrency", "4", "--batch-size", "40", root=root,
                          env={"JOBSPOOL_TEST_LOG": str(log)}, stdout=subprocess.DEVNULL)


def _run(root: Path, log: Path, *args: str) -> None:
    done = run_jobspool(*args, root=root, env={"JOBSPOOL_TEST_LOG": str(log)})
    assert done.code == 0, done.err


def test_killed_worker_processes_lose_no_job_and_settle_each_exactly_once(
        tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("JOBSPOOL_CRASH_SEED", "4242")))
    root, log = tmp_path / "spool", tmp_path / "handled.log"
    with make_spool(root, lease_seconds=1.0, max_attempts=10_000, max_rescues=None,
               keep_terminal=100_000, retry_base_seconds=0.01, retry_max_seconds=0.05) as spool:
        ids = [j.id for k in range(4)
               for j in spool.enqueue_many("work", [{"k": k, "i": i} for i in range(500)])]
    workers = [_worker(root, log) for _ in range(3)]
    kills_mid_work = 0
    try:
        # Let them get going before the first kill.
        wait_until(lambda: len(os.listdir(root / "completed")) >= 200, 60,
                   "the workers to complete 200 jobs")
        for _ in range(8):
            time.sleep(rng.uniform(0.05, 0.3))
            n = rng.randrange(len(workers))
            if os.listdir(root / "ready") or os.listdir(root / "leased"):
                kills_mid_work += 1
            workers[n].send_signal(signal.SIGKILL)
            workers[n].communicate()
            _run(root, log, "recover")  # what ExecStartPre does, beside the live siblings
            workers[n] = _worker(root, log)
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
            w.communicate()
    assert kills_mid_work > 0, "no kill landed while work was left: the test proved nothing"

    time.sleep(1.1)  # every lease of the killed workers has expired
    _run(root, log, "recover")
    _run(root, log, "run-until-idle", "--app", "tests.apps.simple:app", "--kinds", "work")
    fsck = run_jobspool("fsck", root=root, env={"JOBSPOOL_TEST_LOG": str(log)}, timeout=60)
    assert fsck.returncode == 0, fsck.err

    where = job_files(root)
    assert sorted(where) == sorted(ids), "a job was lost or invented"
    assert Counter(tuple(s) for s in where.values()) == Counter({("completed",): len(ids)})
    assert [n for n in os.listdir(root / "tmp") if n != "pool"] == []
    runs = {(job_id, int(token)) for job_id, _, token, _ in
            (line.split() for line in log.read_text().splitlines())}
    assert {job_id for job_id, _ in runs} == set(ids), "a completed job was never handled"
    for job_id in ids:
        raw = read_raw(root, "completed", job_id)
        # The completion on disk is the result of a run that really handled the job,
        # under the token it held (a run killed before settling never completes it).
        assert (job_id, raw["result"]["token"]) in runs
        assert raw["lease"] is None
