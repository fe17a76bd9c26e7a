"""Worker processes SIGKILLed at random moments, restarted, then recovery and a drain.

Several processes (`tests/crash_child.py`) claim, heartbeat, fail, release and
complete jobs through the public API, and run `recover()` when they start
— beside their live siblings. The test kills them at random moments, again
and again, and restarts them. At the end the survivors are killed too, and a
last process recovers and drains the spool.

Then: every job is completed, each in exactly one file in `completed/`,
nothing is left in `tmp/` (apart from the pool of recycled files), `fsck` is
clean, and — from the workers' own logs, an independent record — no job was
ever completed twice under the same fencing token. A job may run twice (a
worker killed after its handler ran but before `complete` returned), and so
appear completed in two logs under two tokens; it is completed once in the
spool. The deadlines guard against hangs only.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from tests.helpers_spool import job_files, read_raw, tmp_leftovers
from tests.spools import make_spool
from tests.subproc import cli_env

CHILD = Path(__file__).resolve().parent / "crash_child.py"


def _start(root: Path, logs: Path, n: int, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(CHILD), str(root), str(logs / f"{n}.log"),
                             str(seed), f"w{n}"], env=cli_env(), stderr=subprocess.PIPE)


def _parse_logs(logs: Path) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            # A SIGKILL may cut the last line of a log short: keep only whole records.
            if len(parts) == 3 and parts[0] in "CFRLE" and parts[2].isdigit():
                out.append((parts[0], parts[1], int(parts[2])))
    return out


def _drain(spool: Spool, log: list[tuple[str, str, int]]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leases = spool.claim(limit=100)
        if not leases:
            if not any(os.listdir(spool.root / s.value) for s in
                       (JobState.READY, JobState.RETRYABLE, JobState.LEASED)):
                return
            time.sleep(0.01)  # retry backoff of a few milliseconds
            continue
        for lease, outcome in zip(leases, spool.complete_many([(le, None) for le in leases]),
                                  strict=True):
            assert not isinstance(outcome, BaseException), outcome
            log.append(("C", lease.job_id, lease.token))
    raise AssertionError("the drain did not finish")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_workers_killed_at_random_moments_lose_nothing_and_complete_nothing_twice(
        tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("JOBSPOOL_CRASH_SEED", "20240611")))
    jobs, procs, kills = 2000, 3, 10
    root = tmp_path / "spool"
    logs = tmp_path / "logs"
    logs.mkdir()
    # A short lease so that the jobs of a killed worker come back within the test; no
    # dead-lettering (a job may be interrupted many times); retries due almost at once.
    spool = make_spool(root, lease_seconds=1.0, max_attempts=10_000, max_rescues=None,
                  keep_terminal=100_000,
                  retry_base_seconds=0.002, retry_max_seconds=0.02)
    ids = [j.id for start in range(0, jobs, 500)
           for j in spool.enqueue_many("work", [{"i": i} for i in range(start, start + 500)])]
    spool.close()
    assert len(set(ids)) == jobs

    seq = 0
    children: dict[int, subprocess.Popen[bytes]] = {}
    for n in range(procs):
        children[n] = _start(root, logs, seq, rng.randrange(1 << 30))
        seq += 1
    killed_mid_work = 0
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.02, 0.25))
            victims = rng.sample(sorted(children), k=1 if rng.random() < 0.7 else 2)
            for n in victims:
                if os.listdir(root / "ready") or os.listdir(root / "leased"):
                    killed_mid_work += 1
                children[n].send_signal(signal.SIGKILL)
                children[n].communicate()  # reaps it and closes its pipe
                children[n] = _start(root, logs, seq, rng.randrange(1 << 30))
                seq += 1
        for n, child in children.items():
            try:
                _, err = child.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                child.kill()
                _, err = child.communicate()
            assert child.returncode in (0, -signal.SIGKILL), (n, child.returncode, err.decode())
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert killed_mid_work > 0, "no kill landed while work was left: the test proved nothing"

    # The last process: a clock in the future so that every lease of the dead has expired.
    final = make_spool(root, clock=lambda: time.time() + 10.0)
    try:
        final.recover()
        drained: list[tuple[str, str, int]] = []
        _drain(final, drained)
        report = final.fsck()
        assert report.ok, report.problems
        assert not final.recover().changed
    finally:
        final.close()

    where = job_files(root)
    assert sorted(where) == sorted(ids), "a job was lost or invented"
    assert {tuple(states) for states in where.values()} == {("completed",)}, (
        Counter(tuple(s) for s in where.values()))
    for job_id in ids:
        raw = read_raw(root, "completed", job_id)
        assert raw["state"] == "completed" and raw["lease"] is None
    assert tmp_leftovers(root) == []
    assert list((root / "quarantine").iterdir()) == []

    records = _parse_logs(logs) + drained
    completions = [(job_id, token) for tag, job_id, token in records if tag == "C"]
    twice = [k for k, v in Counter(completions).items() if v > 1]
    assert twice == [], f"completed twice under the same token: {twice[:5]}"
    tokens = [token for tag, _, token in records if tag in "CFR"]
    # Tokens are unique per claim: an acknowledged outcome names each token once at most.
    assert len(tokens) == len(set(tokens)), "a fencing token was handed out twice"
    reruns = sum(1 for v in Counter(j for j, _ in completions).values() if v > 1)
    # Not an assertion of zero: a run after a kill is legitimate. Reported for the curious.
    print(f"kills mid-work={killed_mid_work} restarts={seq - procs} jobs completed in two "
          f"logs={reruns} acknowledged completions={len(completions)}")
