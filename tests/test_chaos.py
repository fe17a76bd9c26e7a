"""Chaos: four `jobspool worker` processes over 2,000 jobs while a driver deletes `.lock`,
SIGKILLs workers and starts new ones (each after `jobspool recover`).

Deleting `.lock` is the operator reflex of issue 10 item 3: a process that
opens the path afterwards locks a new inode while the running workers hold
the old one. The lock must notice (re-check that the file it locked is the
one at the path) or two processes hold "the" lock at once, which used to
hand out fencing tokens twice, run jobs twice and overwrite job files with
other jobs' contents.

What is observed, independently of the spool's own bookkeeping, through
`tests/apps/ledger.py` (kind `fenced`), which appends to an `O_APPEND` log:
`run <id> <token> <pid>` when a run starts, `commit <id> <token> <pid>`
from inside `ctx.fenced()` (under the spool lock, lease checked), and
returns `{"token": ctx.token}` as the job's result. Then:

- no fencing token is handed to two runs;
- no job is lost: every id is in `completed/`, in exactly one directory;
- no job runs to completion twice. A job may *start* twice (its worker was
  killed mid-run, then `recover` gave it back), but only one completion may
  be accepted, and it must be the job's last run: a run with a larger token
  than the accepted one was claimed after the completion (the job ran
  again), and an accepted token below the largest means an older run's
  completion overwrote a newer one's. Independently, the fenced commits of
  each job appear in strictly increasing token order (a stale holder never
  commits after a newer one), and the last commit is the accepted run's;
- every file in every state directory holds the job its name says, in that
  state, and `fsck` is clean.

The deadline only guards against a hang; it is never a performance claim.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import STATE_DIRS, job_files, read_raw, tmp_leftovers
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

JOBS = 2000
WORKERS = 4
APP = "tests.apps.ledger:app"


def _worker(root: Path, log: Path) -> subprocess.Popen[bytes]:
    # Workers' logs go to a file: a pipe nobody reads until the end could fill and stall them.
    with open(root.parent / "workers.err", "ab") as err:
        return start_jobspool("worker", "--app", APP, "--kinds", "fenced", "--concurrency",
                              "4", "--batch-size", "20", "--no-maintenance", root=root,
                              env={"JOBSPOOL_TEST_LOG": str(log)}, stdout=subprocess.DEVNULL,
                              stderr=err)


def _run(root: Path, log: Path, *args: str) -> str:
    done = run_jobspool(*args, root=root, env={"JOBSPOOL_TEST_LOG": str(log)}, timeout=180)
    assert done.code == 0, f"jobspool {' '.join(args)} exited {done.code}: {done.err!r}"
    return done.err


def _delete_lock(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / ".lock")


def _busy(root: Path) -> bool:
    return bool(os.listdir(root / "ready")) or bool(os.listdir(root / "leased"))


def test_deleting_the_lock_and_killing_workers_never_doubles_a_token_loses_or_reruns_a_job(
        tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("JOBSPOOL_CHAOS_SEED", "1010")))
    root, log = tmp_path / "spool", tmp_path / "ledger.log"
    with make_spool(root, lease_seconds=2.0, max_attempts=10_000, max_rescues=None,
               keep_terminal=100_000, retry_base_seconds=0.01, retry_max_seconds=0.05) as spool:
        ids = [j.id for k in range(4)
               for j in spool.enqueue_many("fenced", [{"k": k, "i": i} for i in range(JOBS // 4)])]
    assert len(set(ids)) == JOBS

    workers = [_worker(root, log) for _ in range(WORKERS)]
    deletions_mid_work = kills_mid_work = 0
    try:
        wait_until(lambda: len(os.listdir(root / "completed")) >= 50, 90,
                   "the workers to get going (50 completions)")
        for _ in range(12):
            if not _busy(root):
                break
            _delete_lock(root)
            deletions_mid_work += 1
            time.sleep(rng.uniform(0.02, 0.15))
            n = rng.randrange(len(workers))
            if _busy(root):
                kills_mid_work += 1
            workers[n].send_signal(signal.SIGKILL)
            workers[n].wait()
            _delete_lock(root)  # again: the recover and the new worker open a fresh .lock
            _run(root, log, "recover")  # what ExecStartPre does, beside the live siblings
            workers[n] = _worker(root, log)
            time.sleep(rng.uniform(0.02, 0.15))
    finally:
        for w in workers:
            if w.returncode is None:
                w.send_signal(signal.SIGKILL)
                w.wait()
    assert deletions_mid_work >= 3 and kills_mid_work >= 3, (
        f"the chaos landed {deletions_mid_work} lock deletions and {kills_mid_work} kills "
        "while work was left: the test proved little")

    _run(root, log, "recover")
    _run(root, log, "run-until-idle", "--app", APP, "--kinds", "fenced", "--no-maintenance",
         "--wait-retries", "10")
    fsck = run_jobspool("--json", "fsck", root=root)
    report = orjson.loads(fsck.stdout)
    assert fsck.returncode == 0 and report["ok"] and report["problems"] == [], report
    assert tmp_leftovers(root) == []

    _assert_every_file_holds_its_job(root)
    where = job_files(root)
    assert sorted(where) == sorted(ids), "jobs appeared or vanished"
    lost = [(j, where[j]) for j in ids if where[j] != ["completed"]]
    assert not lost, f"{len(lost)} jobs not completed exactly once on disk: {lost[:10]}"
    _assert_ledger(root, log, ids)


def _assert_every_file_holds_its_job(root: Path) -> None:
    wrong = []
    for state in STATE_DIRS:
        for name in os.listdir(root / state):
            job_id = name.removesuffix(".json")
            raw = read_raw(root, state, job_id)
            if (raw.get("id"), raw.get("state")) != (job_id, state):
                wrong.append(f"{state}/{name} holds {raw.get('id')!r} in {raw.get('state')!r}")
    assert not wrong, f"{len(wrong)} files hold another job: {wrong[:10]}"


def _assert_ledger(root: Path, log: Path, ids: list[str]) -> None:
    runs: dict[str, list[int]] = defaultdict(list)
    commits: dict[str, list[int]] = defaultdict(list)
    run_tokens: list[int] = []
    for line in log.read_text().splitlines():
        what, job_id, token, _pid = line.split()
        (runs if what == "run" else commits)[job_id].append(int(token))
        if what == "run":
            run_tokens.append(int(token))
    twice = len(run_tokens) - len(set(run_tokens))
    assert twice == 0, f"{twice} fencing tokens were handed to two runs"

    rerun, overwritten, unordered = [], [], []
    for job_id in ids:
        accepted = read_raw(root, "completed", job_id).get("result")
        assert isinstance(accepted, dict) and runs[job_id], (
            f"job {job_id} completed with {accepted!r} after runs {runs[job_id]}")
        token = accepted["token"]
        assert token in runs[job_id], f"job {job_id}: accepted token {token} never ran"
        if max(runs[job_id]) > token:
            rerun.append((job_id, runs[job_id], token))
        mine = commits[job_id]
        if any(b <= a for a, b in itertools.pairwise(mine)):
            unordered.append((job_id, mine))
        if not mine or mine[-1] != token:
            overwritten.append((job_id, mine, token))
    assert not rerun, (f"{len(rerun)} jobs ran again after their completion was accepted: "
                       f"{rerun[:5]}")
    assert not unordered, (f"{len(unordered)} jobs had a stale run commit after a newer one: "
                           f"{unordered[:5]}")
    assert not overwritten, (f"{len(overwritten)} jobs' accepted completion is not their last "
                             f"fenced commit: {overwritten[:5]}")
