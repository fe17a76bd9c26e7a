"""`jobspool prune` SIGKILLed at every removal of its run, on a spool holding the copies a
crash leaves (a job's old `leased/` file beside its `completed/` one).

Found by a crash probe (2026-12-04): pruning removed the completed copy before the old
leased one, so a prune killed between the two left only the stale copy, an expired lease
of a finished job. `recover` (or the next worker) then took the lease back and the job
ran again, while `fsck` called the spool consistent. Now the stale copies are removed, and
flushed, first: at every kill, a job is either still completed or gone for good.
The kill comes from the kernel (`strace -e inject=...:signal=SIGKILL:when=N`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_harness import run_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool
from tests.subproc import REPO, cli_env

pytestmark = pytest.mark.slow

IDS = [f"j{i}" for i in range(6)]
CALLS = "unlink,unlinkat,rename,renameat,renameat2"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tpl")
    root = base / "spool"
    with make_spool(root, durable=True, lease_seconds=60.0) as spool:
        for job_id in IDS:
            spool.enqueue("k", {}, job_id=job_id)
        leases = spool.claim(limit=len(IDS))
        for lease in leases:
            shutil.copy(root / "leased" / f"{lease.job_id}.json", base / lease.job_id)
            spool.complete(lease, {"token": lease.token})
    for job_id in IDS:  # what a crash between publishing and retiring leaves
        shutil.copy(base / job_id, root / "leased" / f"{job_id}.json")
    return root


def _prune_killed_at(root: Path, n: int) -> int:
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={CALLS}",
           "-e", f"inject={CALLS}:signal=SIGKILL:when={n}",
           sys.executable, "-m", "jobspool", "--root", str(root), "prune", "--keep", "0"]
    done = subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, timeout=120)
    return done.returncode


def test_a_prune_killed_at_any_removal_never_leaves_a_finished_job_to_run_again(
        template: Path, tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace is required (.ci/run installs it)")
    reached = 0
    for n in range(1, 60):
        root = tmp_path / f"s{n}"
        shutil.copytree(template, root, symlinks=True)
        if _prune_killed_at(root, n) == 0:
            break  # the prune finished before its n-th removal: every step was covered
        reached += 1
        where = job_files(root)
        orphaned = [j for j, states in where.items() if "completed" not in states]
        assert not orphaned, f"kill at removal {n}: only a stale copy left: {where}"
        assert run_jobspool("recover", root=root).code == 0
        after = job_files(root)
        assert all(states == ["completed"] for states in after.values()), (
            f"kill at removal {n}: {after}")
        assert run_jobspool("fsck", root=root).code == 0
    assert reached >= 6  # the sweep really killed the prune at many steps
