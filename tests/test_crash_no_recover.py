"""A worker SIGKILLed at every rename of its run, then another worker on the same spool
with no `recover` in between — what happens on a live spool, where the other workers
keep going after one dies and nobody runs recovery.

The kill comes from the kernel (`strace -e inject=rename:signal=SIGKILL:when=N`), at
the N-th rename of the first run, for every N it reaches. Then, as a service manager
would, a second `run-until-idle` drains the spool (the first run's leases expire first).
Checked:

- a job whose completion was on disk when the first worker died is never run again
  (it was, at several N: the claim took the old leased copy a crash left beside it);
- the second run drains everything: every job ends completed (it once stopped, idle,
  with a job due whose claim the crash had cut off);
- after `recover`, every job is in one directory and `fsck` is clean.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from tests.cli_harness import run_jobspool
from tests.helpers_spool import STATE_DIRS, job_files
from tests.spools import make_spool
from tests.subproc import REPO, cli_env

pytestmark = pytest.mark.slow

APP = "tests.apps.ledger:app"
IDS = [f"j{i}" for i in range(4)]
LEASE = 1.0


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tpl") / "spool"
    with make_spool(root, lease_seconds=LEASE, max_attempts=100) as spool:
        for job_id in IDS:
            spool.enqueue("record", {}, job_id=job_id)
    return root


def _run(root: Path, log: Path, *, kill_at: int | None = None) -> int:
    """`run-until-idle` (under strace, killed at the kill_at-th rename); the CLI's pid."""
    cmd = ["run-until-idle", "--app", APP, "--concurrency", "1", "--batch-size", "2",
           "--no-maintenance", "--wait-retries", "5"]
    prefix: list[str] = []
    if kill_at is not None:
        prefix = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename,renameat2",
                  "-e", f"inject=rename,renameat2:signal=SIGKILL:when={kill_at}"]
    env = cli_env(JOBSPOOL_TEST_LOG=str(log))
    done = subprocess.run([*prefix, *_python_cli(root), *cmd], cwd=REPO, env=env,
                          capture_output=True, timeout=120)
    return done.returncode


def _python_cli(root: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "jobspool", "--root", str(root)]


def _completed_on_disk(root: Path) -> set[str]:
    """Jobs whose newest copy is in completed/ (what a reader, and recovery, would say)."""
    newest: dict[str, tuple[int, str]] = {}
    for state in STATE_DIRS:
        for f in (root / state).glob("*.json"):
            revision = orjson.loads(f.read_bytes())["revision"]
            if f.stem not in newest or revision > newest[f.stem][0]:
                newest[f.stem] = (revision, state)
    return {j for j, (_, s) in newest.items() if s == "completed"}


def _runs(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("run ")]


def test_no_completed_job_runs_again_and_the_next_worker_drains_all(
        template: Path, tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace is required (.ci/run installs it)")
    reached = 0
    for n in range(1, 40):
        root, log = tmp_path / f"s{n}", tmp_path / f"runs{n}.log"
        shutil.copytree(template, root, symlinks=True)
        rc = _run(root, log, kill_at=n)
        if rc == 0:
            break  # the run finished before its n-th rename: every step was covered
        reached += 1
        done_before = _completed_on_disk(root)
        first = len(_runs(log))
        time.sleep(LEASE + 0.2)  # the dead worker's leases expire
        assert _run(root, log) == 0, f"kill at rename {n}: the second run failed"
        again = [j for j in _runs(log)[first:] if j in done_before]
        assert not again, (f"kill at rename {n}: completed before the crash, run again: "
                           f"{again}")
        where = job_files(root)
        assert all("completed" in where.get(j, []) for j in IDS), (
            f"kill at rename {n}: not drained: {where}")
        assert run_jobspool("recover", root=root).code == 0
        assert all(job_files(root)[j] == ["completed"] for j in IDS), job_files(root)
        assert run_jobspool("fsck", root=root).code == 0
    assert reached >= 10  # the sweep really killed the run at many steps
