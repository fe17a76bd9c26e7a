"""A worker that dies is charged only for the jobs whose handlers it had started.

Its batch mates that never started go back to `ready` uncounted (no attempt, no
rescue), whether `recover` finds the dead holder (at once: its liveness lock is
free) or a later claim takes the expired leases. Without this, one job that kills
its process dead-letters every job that happened to be claimed with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspool import JobState
from tests.cli_harness import run_jobspool
from tests.spools import make_spool
from tests.subproc import REPO, cli_env

pytestmark = pytest.mark.slow


def _log_env(log: Path) -> dict[str, str | None]:
    return {"JOBSPOOL_TEST_LOG": str(log)}


def _enqueue_a_crash_and_its_mates(root: Path) -> None:
    with make_spool(root, lease_seconds=1.0, max_attempts=3, max_rescues=3,
               retry_base_seconds=0.01, retry_max_seconds=0.01) as s:
        # The crash job sorts first, so with concurrency 1 none of its mates has started.
        s.enqueue("crash", job_id="a-crash", priority=-1)
        for i in range(10):
            s.enqueue("work", job_id=f"w{i:02d}")


@pytest.mark.parametrize("with_recover", [True, False], ids=["recover", "claims"])
def test_a_job_that_kills_its_worker_is_charged_alone_and_its_batch_mates_run_once(
        tmp_path: Path, with_recover: bool) -> None:
    root, log = tmp_path / "spool", tmp_path / "runs.log"
    _enqueue_a_crash_and_its_mates(root)
    for _ in range(12):
        if with_recover:
            assert run_jobspool("recover", root=root, env=_log_env(log)).returncode == 0
        run_jobspool("run-until-idle", "--app", "tests.apps.crashy:app", "--concurrency", "1",
                     "--wait-retries", "3", root=root, env=_log_env(log))
        with make_spool(root) as s:
            if all(j.terminal for j in s.jobs()):
                break
    with make_spool(root) as s:
        crash = s.get("a-crash")
        mates = [s.get(f"w{i:02d}") for i in range(10)]
    assert crash.state is JobState.DEAD_LETTER
    assert [m.state for m in mates] == [JobState.COMPLETED] * 10
    # No batch mate was charged for the crash: one attempt each, never rescued.
    assert [(m.attempts, m.rescues) for m in mates] == [(1, 0)] * 10
    runs = log.read_text().split()
    assert all(runs[0::2].count(m.id) == 1 for m in mates)


def _holder(root: Path, *, start_token: int | None) -> None:
    """A process that claims every job, says it started one handler, then dies."""
    code = textwrap.dedent(f"""
        import os, sys
        from jobspool import Spool
        s = Spool(sys.argv[1], lease_seconds=3600)
        leases = s.claim(limit=10)
        start = {start_token!r}
        if start is not None:
            s.note_running([leases[start].token], started=True)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, cwd=REPO,
                   env=cli_env(), timeout=60)


def test_recover_reclaims_a_dead_holders_leases_at_once_and_charges_only_the_started_one(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600, retry_base_seconds=0.01,
               retry_max_seconds=0.01) as s:
        for i in range(4):
            s.enqueue("work", job_id=f"j{i}")
    _holder(root, start_token=1)
    with make_spool(root) as s:
        assert {j.state for j in s.jobs()} == {JobState.LEASED}  # an hour before expiry
        report = s.recover()
        assert sorted(report.leases_returned) == ["j0", "j2", "j3"]
        assert list(report.leases_reclaimed) == ["j1"]
        got = {j.id: (j.state, j.attempts, j.rescues) for j in s.jobs()}
        mine = f"{s.process_mark().ident}.lock"
        # The dead process's liveness file is gone; only this (live) process's remains.
        assert os.listdir(root / "live") == [mine]
    assert got == {"j0": (JobState.READY, 0, 0), "j1": (JobState.RETRYABLE, 1, 1),
                   "j2": (JobState.READY, 0, 0), "j3": (JobState.READY, 0, 0)}
    assert os.listdir(root / "live") == []  # closed: this process's went with it


def test_recover_leaves_a_live_holders_unexpired_leases_alone(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600) as s:
        s.enqueue("work", job_id="j0")
        s.claim()  # this process holds it and lives on
        report = s.recover()
        assert report.leases_reclaimed == () and report.leases_returned == ()
        assert s.get("j0").state is JobState.LEASED


def test_a_holder_without_a_liveness_file_waits_for_its_lease_to_expire(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600) as s:
        s.enqueue("work", job_id="j0")
    _holder(root, start_token=None)
    for f in (root / "live").iterdir():
        f.unlink()  # an operator cleaned up: nothing proves the holder is gone
    with make_spool(root) as s:
        assert s.recover().leases_returned == ()
        assert s.get("j0").state is JobState.LEASED
