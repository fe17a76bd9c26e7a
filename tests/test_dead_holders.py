"""Leases held by a worker process that died (SIGKILL, a crash) are taken back by the next
idle worker at once, as `recover` does, not when they expire: `run-until-idle` after a
crash, without `recover`, drains those jobs too. Found by trying it: it exited 0 with the
jobs still leased to the dead process, for `lease_seconds`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from jobspool import JobState
from jobspool.queue import liveness
from tests.cli_harness import run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.subproc import cli_env

APP = "tests.apps.crashy:app"


def test_run_until_idle_after_a_crash_drains_what_the_dead_worker_held(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=600.0) as spool:
        spool.enqueue("crash", job_id="bomb")
        for i in range(3):
            spool.enqueue("work", job_id=f"w{i}")
    first = run_jobspool("run-until-idle", "--app", APP, "--concurrency", "1", root=root)
    assert first.returncode == 70  # the handler took its process down, leases held
    with make_spool(root) as spool:
        assert spool.get("bomb").state is JobState.LEASED
    second = run_jobspool("run-until-idle", "--app", APP, root=root)
    assert second.returncode == 0, second.stderr
    with make_spool(root) as spool:
        assert [spool.get(f"w{i}").state for i in range(3)] == [JobState.COMPLETED] * 3
        bomb = spool.get("bomb")
    assert bomb.state is JobState.RETRYABLE and bomb.rescues == 1  # charged: it was running
    assert "dead worker" in second.stderr


def test_an_idle_worker_takes_back_a_dead_siblings_leases_long_before_they_expire(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=600.0) as spool:
        spool.enqueue("crash", job_id="bomb", max_attempts=1)
        spool.enqueue("work", job_id="mate")
    first = run_jobspool("run-until-idle", "--app", APP, "--concurrency", "1", root=root)
    assert first.returncode == 70
    serving = start_jobspool("worker", "--app", APP, root=root)
    try:
        deadline = time.monotonic() + 120  # a hang guard; the leases run for 600 s
        while time.monotonic() < deadline:
            with make_spool(root) as spool:
                states = (spool.get("bomb").state, spool.get("mate").state)
            if states == (JobState.DEAD_LETTER, JobState.COMPLETED):
                break
            time.sleep(0.1)
    finally:
        serving.terminate()
        serving.communicate(timeout=60)
    assert states == (JobState.DEAD_LETTER, JobState.COMPLETED)  # out of its one attempt


_CLAIM_THEN_RAISE = """
import sys
from jobspool import Spool
spool = Spool(sys.argv[1])
spool.claim(kinds="k")
if sys.argv[2] == "settle":
    spool.complete(spool.claim(kinds="k")[0])
raise RuntimeError("consumer crashed")
"""


def test_a_process_that_exits_on_an_exception_holding_leases_is_seen_dead(
        tmp_path: Path) -> None:
    # Found in a README pass: the exit hook removed the process's liveness file however it
    # exited, so an uncaught exception (or sys.exit) with leases held made it "unknown",
    # not dead: its leases waited out lease_seconds, and `migrate` refused.
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=600.0) as spool:
        spool.enqueue("k", job_id="held")
        spool.enqueue("k", job_id="done")
    crashed = subprocess.run([sys.executable, "-c", _CLAIM_THEN_RAISE, str(root), "settle"],
                             env=cli_env(), capture_output=True, timeout=120, check=False)
    assert crashed.returncode == 1 and b"consumer crashed" in crashed.stderr
    with make_spool(root) as spool:
        report = spool.recover()
        assert report.leases_reclaimed == ("held",)
        assert spool.get("held").state is JobState.RETRYABLE
        assert spool.get("done").state is JobState.COMPLETED
        spool.recover()
    assert _others(root) == []  # recover removed the dead one's file


def test_a_process_that_settled_everything_leaves_no_liveness_file(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", job_id="one")
    script = ("import sys; from jobspool import Spool; s = Spool(sys.argv[1]); "
              "s.complete(s.claim()[0])")
    done = subprocess.run([sys.executable, "-c", script, str(root)], env=cli_env(),
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert _others(root) == []


def _others(root: Path) -> list[str]:
    """Liveness files of processes other than this test's own."""
    own = liveness.process_ident() + liveness.LIVE_SUFFIX
    return [p.name for p in (root / "live").iterdir() if p.name != own]


def test_health_names_leases_held_by_a_process_that_is_gone(tmp_path: Path) -> None:
    # Found in an operations probe: health said ok while a job sat leased by a process
    # that had exited, until its lease ran out (600 s); recover took it back at once.
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=600.0) as spool:
        spool.enqueue("k", job_id="held")
        spool.enqueue("k", job_id="done")
        assert spool.health().ok
    crashed = subprocess.run([sys.executable, "-c", _CLAIM_THEN_RAISE, str(root), "settle"],
                             env=cli_env(), capture_output=True, timeout=120, check=False)
    assert crashed.returncode == 1
    with make_spool(root) as spool:
        health = spool.health()
        (reason,) = [r for r in health.reasons if r.code == "dead_holders"]
        assert reason.value == 1 and "(held)" in reason.message and not health.ok
        spool.recover()
        assert "dead_holders" not in spool.health().codes()
