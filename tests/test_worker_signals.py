"""`jobspool worker` under SIGTERM/SIGINT: stop claiming, finish or release, exit 0.

After the signal no job may be lost or left leased: every job is completed,
or back in ready/retryable, and `run-until-idle` finishes the rest. The
handlers log each run (see tests/apps/simple.py) so a job handled twice shows.
Timeouts only guard against hangs.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from jobspool.queue.liveness import LIVE_DIR, LIVE_SUFFIX
from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _env(log: Path) -> dict[str, str | None]:
    return {"JOBSPOOL_TEST_LOG": str(log)}


def _worker(root: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return start_jobspool("worker", "--app", "tests.apps.simple:app", "--json", *args,
                          root=root, env=_env(log))


def _count(root: Path, state: str) -> int:
    d = root / state
    return sum(1 for _ in d.iterdir()) if d.is_dir() else 0


def _handlers_running(root: Path) -> int | None:
    """How many handlers the spool's live processes say they are running (their liveness
    marks, which a worker updates as each handler starts and ends); None until one reports."""
    reported = None
    for mark in (root / LIVE_DIR).glob(f"*{LIVE_SUFFIX}"):
        try:
            doc = orjson.loads(mark.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue  # caught mid-rewrite: the next poll reads it whole
        if isinstance(doc, dict) and isinstance(doc.get("running"), list):
            reported = (reported or 0) + len(doc["running"])
    return reported


def _stop(proc: subprocess.Popen[bytes], sig: int, timeout: float = 30.0
          ) -> tuple[int, dict[str, Any], str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"worker did not exit within {timeout} s of {signal.Signals(sig).name}")
    text = err.decode(errors="replace")
    assert "Traceback" not in text, text
    assert proc.returncode == 0, (f"exit {proc.returncode} after {signal.Signals(sig).name} "
                                  f"(negative: killed by the signal); stderr: {text[-500:]}")
    return proc.returncode, orjson.loads(out), text


def _logged(log: Path) -> Counter[str]:
    if not log.exists():
        return Counter()
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def _assert_nothing_lost_or_leased(root: Path, ids: list[str]) -> dict[str, list[str]]:
    on_disk = job_files(root)
    assert set(on_disk) == set(ids), "a job file disappeared"
    assert not list((root / "leased").iterdir()), "a job was left leased"
    for job_id, where in on_disk.items():
        assert len(where) == 1, f"{job_id} is in {where}"
        assert where[0] in ("completed", "ready", "retryable"), f"{job_id} is in {where}"
    return on_disk


def _drain(root: Path, log: Path) -> dict[str, Any]:
    done = run_jobspool("run-until-idle", "--app", "tests.apps.simple:app", "--json",
                        root=root, env=_env(log))
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = done.json()
    return report


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_batch_finishes_running_handlers_releases_the_rest_and_exits_0(
        tmp_path: Path, sig: int) -> None:
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    n = 30
    with make_spool(root) as spool:
        ids = [j.id for j in spool.enqueue_many("slow", [{"sleep": 0.3} for _ in range(n)])]
    proc = _worker(root, log, "--concurrency", "2", "--batch-size", "8")
    wait_until(lambda: _count(root, "completed") >= 3, 30, proc=proc)
    code, report, _ = _stop(proc, sig)

    assert code == 0
    assert 3 <= report["completed"] < n
    assert report["lease_lost"] == 0
    on_disk = _assert_nothing_lost_or_leased(root, ids)
    completed = {i for i, where in on_disk.items() if where == ["completed"]}
    assert len(completed) == report["completed"]
    # Every handler that ran was allowed to finish and its job completed: the log lists
    # exactly the completed jobs, each once.
    assert _logged(log) == Counter({i: 1 for i in completed})
    with make_spool(root, create=False) as spool:
        for job in spool.jobs(state="ready"):
            assert job.attempts == 0, "a released job must not lose an attempt"

    # The jobs left behind are finished by the next worker, each exactly once overall.
    rest = _drain(root, log)
    assert rest["completed"] == n - len(completed)
    assert _logged(log) == Counter({i: 1 for i in ids})
    with make_spool(root, create=False) as spool:
        assert spool.stats().counts["completed"] == n
        assert all(j.attempts == 1 for j in spool.jobs())


def test_handlers_past_the_grace_period_are_released_with_their_attempt_counted(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    with make_spool(root) as spool:
        ids = [j.id for j in spool.enqueue_many("slow", [{"sleep": 30} for _ in range(4)])]
    proc = _worker(root, log, "--concurrency", "2", "--batch-size", "4", "--grace", "0.5")
    wait_until(lambda: _count(root, "leased") == 4, 30, proc=proc)
    # Two handlers started (concurrency 2), the other two jobs wait unstarted in the batch.
    wait_until(lambda: _handlers_running(root) == 2, 30, "two handlers to start", proc=proc)
    # Exits 0 without waiting for the 30 s handlers (the guard timeout is far below that):
    # a handler still running in an abandoned thread after its job was released could
    # otherwise run side by side with the next worker that claims the job.
    code, report, _ = _stop(proc, signal.SIGTERM, timeout=10.0)
    assert code == 0
    assert report["completed"] == 0
    # The two that ran count their attempt; the two that never started go back uncounted.
    assert (report["interrupted"], report["released"]) == (2, 2)
    assert report["retried"] == 0 and report["dead_lettered"] == 0
    on_disk = _assert_nothing_lost_or_leased(root, ids)
    assert all(where == ["ready"] for where in on_disk.values())
    with make_spool(root, create=False) as spool:
        jobs = list(spool.jobs())
    assert all(job.state is JobState.READY for job in jobs)
    # The two runs cut off count their attempt (issue 11: a job that keeps taking its
    # worker down cannot loop forever); the two that never started do not.
    cut = [j for j in jobs if j.attempts == 1]
    assert len(cut) == 2 and all("interrupted" in (j.last_error or "") for j in cut)
    assert all(j.attempts == 0 and j.last_error is None for j in jobs if j not in cut)
    assert _logged(log) == Counter()


def test_sigterm_to_an_idle_worker_exits_0_with_a_json_report(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    with make_spool(root) as spool:
        job = spool.enqueue("work")
    proc = _worker(root, log)
    wait_until(lambda: _count(root, "completed") == 1, 30, proc=proc)
    # Its handler has ended and been recorded as ended: the worker is back to claiming.
    wait_until(lambda: _handlers_running(root) == 0, 30, "the worker to go idle", proc=proc)
    code, report, _ = _stop(proc, signal.SIGTERM)
    assert code == 0
    assert report["completed"] == 1
    assert report["claimed"] == 1
    assert _logged(log) == Counter({job.id: 1})


def test_a_worker_started_on_a_busy_spool_keeps_serving_new_jobs(tmp_path: Path) -> None:
    """`worker` runs forever: jobs enqueued after it went idle are picked up too."""
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    with make_spool(root) as spool:
        spool.enqueue("work")
    proc = _worker(root, log)
    try:
        wait_until(lambda: _count(root, "completed") == 1, 30, proc=proc)
        time.sleep(0.6)  # past the poll back-off's first steps
        with make_spool(root) as spool:
            late = spool.enqueue("work")
        wait_until(lambda: _count(root, "completed") == 2, 30, proc=proc)
    finally:
        code, report, _ = _stop(proc, signal.SIGTERM)
    assert code == 0
    assert report["completed"] == 2
    assert _logged(log)[late.id] == 1


def test_sigterm_to_run_until_idle_strands_no_lease(tmp_path: Path) -> None:
    """Scripts run `run-until-idle` under `timeout`, CI runners and `docker stop`, which
    send SIGTERM. Like `worker`, it should stop claiming, settle or release what it holds,
    and exit cleanly, instead of leaving leases to expire (and attempts to be counted)."""
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    with make_spool(root) as spool:
        ids = [j.id for j in spool.enqueue_many("slow", [{"sleep": 0.3} for _ in range(20)])]
    proc = start_jobspool("run-until-idle", "--app", "tests.apps.simple:app", "--json",
                          "--concurrency", "2", "--batch-size", "4", root=root, env=_env(log))
    wait_until(lambda: _count(root, "completed") >= 2, 30, proc=proc)
    code, report, _ = _stop(proc, signal.SIGTERM)
    assert code == 0
    assert report["completed"] >= 2
    _assert_nothing_lost_or_leased(root, ids)
    rest = _drain(root, log)
    assert rest["completed"] + report["completed"] == 20
    assert _logged(log) == Counter({i: 1 for i in ids})
