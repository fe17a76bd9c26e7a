"""Several `jobspool run-until-idle` processes drain one spool: each job handled exactly once.

Two independent ways to detect a double run: (1) the handler of every process
appends `<job_id> <pid> <token> <attempt>` to that process's own log file
($JOBSPOOL_TEST_LOG), and the logs together must name every job exactly once;
(2) the spool at the end holds every job in `completed/` only, with one
attempt, and a result naming the pid whose log lists it. The subprocess
timeouts only guard against hangs.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool

pytestmark = pytest.mark.slow


def _run_until_idle(root: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return start_jobspool("run-until-idle", "--app", "tests.apps.simple:app", "--json", *args,
                          root=root, env={"JOBSPOOL_TEST_LOG": str(log)})


def _finish(procs: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode(errors="replace")
            assert b"Traceback" not in err, err.decode(errors="replace")
            reports.append(orjson.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return reports


def _read_logs(logs: list[Path]) -> list[tuple[str, int, int, int, int]]:
    """(job_id, pid, token, attempt, log index) for every line of every log."""
    lines = []
    for i, log in enumerate(logs):
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            job_id, pid, token, attempt = line.split()
            lines.append((job_id, int(pid), int(token), int(attempt), i))
    return lines


def test_three_processes_handle_every_job_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    n = 600
    with make_spool(root) as spool:
        ids = [j.id for j in spool.enqueue_many("work", [{"i": i} for i in range(n)])]
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    procs = [_run_until_idle(root, log, "--batch-size", "10", "--concurrency", "4")
             for log in logs]
    reports = _finish(procs)

    # Each process's report is one JSON document; together they account for every job.
    assert sum(r["completed"] for r in reports) == n
    assert sum(r["claimed"] for r in reports) == n
    assert all(r["lease_lost"] == 0 and r["retried"] == 0 and r["dead_lettered"] == 0
               for r in reports)

    # Way 1: the handlers' own logs name every job exactly once.
    lines = _read_logs(logs)
    counts = Counter(job_id for job_id, *_ in lines)
    assert set(counts) == set(ids)
    assert [job_id for job_id, c in counts.items() if c > 1] == []
    tokens = [token for _, _, token, _, _ in lines]
    assert len(set(tokens)) == n  # one fencing token per run, never shared
    assert all(attempt == 1 for _, _, _, attempt, _ in lines)
    pid_of = {job_id: pid for job_id, pid, *_ in lines}
    token_of = {job_id: token for job_id, _, token, *_ in lines}
    # Every log was written by one process only, and no two logs share a process.
    pids_per_log = [{pid for _, pid, _, _, idx in lines if idx == i} for i in range(3)]
    assert all(len(p) <= 1 for p in pids_per_log)

    # Way 2: the spool agrees, file by file.
    on_disk = job_files(root)
    assert set(on_disk) == set(ids)
    assert all(where == ["completed"] for where in on_disk.values())
    assert not list((root / "leased").iterdir())
    with make_spool(root, create=False) as spool:
        for job in spool.jobs():
            assert job.state is JobState.COMPLETED
            assert job.attempts == 1
            assert job.result["pid"] == pid_of[job.id]
            assert job.result["token"] == token_of[job.id]
        assert spool.stats().counts["completed"] == n
        assert spool.fsck().ok


def test_processes_with_different_apps_split_the_kinds_and_report_the_rest(
        tmp_path: Path) -> None:
    """A process whose app lacks a kind leaves those jobs alone and says so."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        work = [j.id for j in spool.enqueue_many("work", [{"i": i} for i in range(40)])]
        slow = [j.id for j in spool.enqueue_many("slow", [{"sleep": 0.01} for _ in range(20)])]
    log = tmp_path / "only-work.log"
    only = run_jobspool("run-until-idle", "--app", "tests.apps.simple:only_work", "--json",
                        root=root, env={"JOBSPOOL_TEST_LOG": str(log)})
    assert only.returncode == 0, only.stderr
    report = only.json()
    assert report["completed"] == 40
    assert report["unhandled"] == {"slow": 20}
    with make_spool(root, create=False) as spool:
        assert all(spool.get(i).state is JobState.COMPLETED for i in work)
        assert all(spool.get(i).state is JobState.READY and spool.get(i).attempts == 0
                   for i in slow)
    # The full app picks up what was left.
    (full,) = _finish([_run_until_idle(root, tmp_path / "full.log")])
    assert full["completed"] == 20
    assert full["unhandled"] == {}
    with make_spool(root, create=False) as spool:
        assert spool.stats().counts["completed"] == 60


def test_processes_settle_retries_and_dead_letters_exactly_once(tmp_path: Path) -> None:
    """Flaky jobs retry (each attempt claimed by whichever process is free), poison
    jobs dead-letter once; nobody completes a job twice or loses one."""
    root = tmp_path / "spool"
    with make_spool(root, retry_base_seconds=0.05, retry_max_seconds=0.2) as spool:
        flaky = [j.id for j in spool.enqueue_many("flaky", [{} for _ in range(10)])]
        poison = [j.id for j in spool.enqueue_many("poison", [{} for _ in range(5)])]
        work = [j.id for j in spool.enqueue_many("work", [{} for _ in range(60)])]
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    reports = _finish([_run_until_idle(root, log, "--batch-size", "5", "--wait-retries", "10")
                       for log in logs])
    # Each process waits for retries due within 10 s, so together they finish everything.
    assert sum(r["dead_lettered"] for r in reports) == 5
    assert sum(r["completed"] for r in reports) == 70
    assert sum(r["retried"] for r in reports) == 20  # two retries per flaky job
    lines = _read_logs(logs)
    counts = Counter(job_id for job_id, *_ in lines)
    assert counts == Counter({i: 1 for i in flaky + work})  # poison never logs
    with make_spool(root, create=False) as spool:
        for i in flaky:
            job = spool.get(i)
            assert job.state is JobState.COMPLETED and job.attempts == 3
        for i in poison:
            job = spool.get(i)
            assert job.state is JobState.DEAD_LETTER and job.attempts == 1
            assert "poison pill" in (job.last_error or "")
        assert not list((root / "leased").iterdir())
