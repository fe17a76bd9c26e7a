"""A worker process killed (SIGKILL) after its handler returned, while the job's writes were
being merged into the projection: the death is charged to the job (a rescue, an attempt),
so a merge that kills its process every time ends in dead_letter instead of running
uncounted for ever. Found by a new-user pass: the job went back to `ready`, attempts 0, on
every `recover` and every restart of a pool's child."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from jobspool import JobState
from tests.cli_harness import run_jobspool, start_jobspool
from tests.spools import make_spool

APP = "tests.apps.merge_killer:app"


def _env(tmp_path: Path) -> dict[str, str | None]:
    return {"JOBSPOOL_TEST_PROJECTION": str(tmp_path / "projection")}


def test_recover_charges_a_job_whose_merge_killed_its_worker(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("write", job_id="poison", max_attempts=3)
    env = _env(tmp_path)
    for round_ in range(1, 4):
        died = run_jobspool("--root", root, "run-until-idle", "--app", APP,
                            "--wait-retries", "120", env=env)
        assert died.returncode == -signal.SIGKILL, died.stderr
        assert run_jobspool("--root", root, "recover", env=env).returncode == 0
        with make_spool(root) as spool:
            job = spool.get("poison")
        assert job.rescues == round_  # charged: its handler had run, its writes were in flight
        if round_ < 3:
            assert job.state is JobState.RETRYABLE
    assert job.state is JobState.DEAD_LETTER  # out of attempts, not looping for ever


def test_a_pool_charges_a_job_whose_merge_killed_its_child(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("write", job_id="poison", max_attempts=2)
    pool = start_jobspool("--root", root, "worker", "--app", APP, "--processes", "1",
                          env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 90
        state = None
        while time.monotonic() < deadline:
            with make_spool(root) as spool:
                state = spool.get("poison").state
            if state is JobState.DEAD_LETTER:
                break
            time.sleep(0.2)
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.communicate(timeout=60)
    assert state is JobState.DEAD_LETTER
    with make_spool(root) as spool:
        job = spool.get("poison")
    assert job.rescues >= 1 and "died" in (job.last_error or "")
