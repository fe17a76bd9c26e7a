"""Several OS processes claim and complete jobs from one spool at once.

Two independent ways to detect a double run: (1) every process appends the
ids it completed (with their fencing tokens) to its own log file, and the
logs together must name every job exactly once; (2) the job files at the end
must all sit in `completed/`, each with one attempt, the revision of a job
that ran once, and the result naming the process whose log lists it. Nothing
may be left anywhere else, `tmp/` included (an optional `tmp/pool/` aside).
The deadlines only guard against hangs; they are not performance claims.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.helpers_spool import assert_disk_consistent, disk_counts, tmp_leftovers
from tests.spools import make_spool
from tests.subproc import cli_env
from tests.waiting import wait_until

CHILD = r"""
import os, sys, time
from jobspool import Spool

root, log_path, go, durable, batch, me = sys.argv[1:7]
spool = Spool(root, create=False, durable=durable == "1", lease_seconds=600.0,
              keep_terminal=100_000)
open(go + ".ready" + me, "w").close()  # imported and opened: the test may start everyone
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.002)
with open(log_path, "a") as log:
    while True:
        leases = spool.claim(limit=int(batch), owner="proc-" + me)
        if not leases:
            break
        for lease in leases:
            spool.complete(lease, int(me))
            # Logged only after complete() returned: a double run shows up as a repeat.
            log.write(f"{lease.job_id} {lease.token} {lease.job.attempts}\n")
        log.flush()
spool.close()
"""


def _revision_of_a_job_that_ran_once(tmp_path: Path) -> int:
    s = make_spool(tmp_path / "reference")
    try:
        s.enqueue("work", {"i": 0})
        (lease,) = s.claim()
        return s.complete(lease, 0).revision
    finally:
        s.close()


def _run(tmp_path: Path, *, procs: int, jobs: int, durable: bool) -> None:
    root = tmp_path / "spool"
    # keep_terminal above the job count: retention pruning must not hide the evidence.
    spool = make_spool(root, durable=durable, lease_seconds=600.0, keep_terminal=100_000)
    try:
        spool.enqueue_many("work", [{"i": i} for i in range(jobs)])
    finally:
        spool.close()
    ids = {p.name[: -len(".json")] for p in (root / "ready").iterdir()}
    assert len(ids) == jobs

    go = tmp_path / "go"
    logs = [tmp_path / f"proc-{n}.log" for n in range(procs)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(logs[n]), str(go),
             "1" if durable else "0", str(1 + n % 4), str(n)],
            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for n in range(procs)
    ]
    try:
        # Everyone imported and opened the spool; the go file then starts them together.
        for n, child in enumerate(children):
            wait_until((tmp_path / f"go.ready{n}").exists, 60, f"child {n} to get ready",
                       proc=child)
        go.touch()
        outputs = [c.communicate(timeout=180) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    for c, (_out, err) in zip(children, outputs, strict=True):
        assert c.returncode == 0, err.decode(errors="replace")[-3000:]

    # Way 1: the processes' own logs.
    seen: Counter[str] = Counter()
    owner: dict[str, int] = {}
    tokens: list[int] = []
    for n, log in enumerate(logs):
        lines = log.read_text().splitlines() if log.exists() else []
        mine = []
        for line in lines:
            job_id, token, attempts = line.split()
            seen[job_id] += 1
            owner[job_id] = n
            mine.append(int(token))
            tokens.append(int(token))
            assert attempts == "1", f"{job_id} was on attempt {attempts} in process {n}"
        assert mine == sorted(mine), f"process {n} saw tokens go backwards"
    assert set(seen) == ids, f"missing {len(ids - set(seen))}, unknown {len(set(seen) - ids)}"
    doubles = [j for j, c in seen.items() if c != 1]
    assert doubles == [], f"{len(doubles)} jobs ran more than once, e.g. {doubles[:5]}"
    assert len(set(tokens)) == jobs, "a fencing token was handed out twice"
    workers = Counter(owner.values())
    assert len(workers) >= 2, f"only one process did any work: {workers}"

    # Way 2: the job files themselves.
    on_disk = assert_disk_consistent(root)
    assert on_disk == dict.fromkeys(ids, "completed")
    counts = disk_counts(root)
    assert counts["completed"] == jobs
    assert sum(counts.values()) == jobs
    assert tmp_leftovers(root) == []
    assert list((root / "quarantine").iterdir()) == []
    once = _revision_of_a_job_that_ran_once(tmp_path)
    for job_id in ids:
        raw = orjson.loads((root / "completed" / f"{job_id}.json").read_bytes())
        assert raw["attempts"] == 1, job_id
        assert raw["revision"] == once, (job_id, raw["revision"], once)
        assert raw["result"] == owner[job_id], (job_id, raw["result"], owner[job_id])
    final = max(tokens)
    fence = "".join(ch for ch in (root / "fence").read_text() if ch.isdigit())
    assert int(fence) >= final


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_processes_complete_two_thousand_jobs_exactly_once(tmp_path: Path) -> None:
    _run(tmp_path, procs=4, jobs=2000, durable=False)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_processes_on_a_durable_spool_complete_each_job_exactly_once(
    tmp_path: Path,
) -> None:
    _run(tmp_path, procs=4, jobs=200, durable=True)
