"""Issue 10, audited: an operator deleting a spool's scratch directories does not stop it.

Found in the audit: after `rm -rf <root>/tmp` (cleaning "temporary files", as
one does) every command that writes refused the spool — `jobspool: error:
spool directory .../tmp is missing` — `recover` included, with no word of
the remedy. `tmp/` (staging and recycled files), `quarantine/` and `live/`
hold nothing a job depends on: a writer recreates them. A missing state
directory is real damage (its jobs are gone): it is still refused, with the
command that recreates it.
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


@pytest.mark.parametrize("name", ["tmp", "quarantine", "live"])
def test_deleting_a_scratch_directory_stops_no_command(tmp_path: Path, name: str) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("record", {}, job_id="j1")
    shutil.rmtree(root / name)
    proc = run_jobspool("enqueue", "record", "{}", "--id", "j2", root=root)
    assert proc.returncode == 0, proc.stderr
    assert (root / name).is_dir()
    proc = run_jobspool("recover", root=root)
    assert proc.returncode == 0, proc.stderr
    proc = run_jobspool("run-until-idle", "--app", "tests.apps.ledger:app", "--no-maintenance",
                        root=root)
    assert proc.returncode == 0, proc.stderr
    assert job_files(root) == {"j1": ["completed"], "j2": ["completed"]}
    assert run_jobspool("fsck", root=root).returncode == 0


def test_a_deleted_state_directory_is_refused_naming_the_remedy(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("record", {}, job_id="j1")
    shutil.rmtree(root / "retryable")
    proc = run_jobspool("recover", root=root)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(root / "retryable") in lines[0], lines[0]
    assert f"jobspool --root {root} init" in lines[0], lines[0]
    assert run_jobspool("init", root=root).returncode == 0  # the remedy it names
    assert run_jobspool("recover", root=root).returncode == 0
    assert job_files(root) == {"j1": ["ready"]}


def test_a_deleted_spool_json_is_recreated_by_init_after_workers_ran(tmp_path: Path) -> None:
    # Found in the audit: every command refused the spool naming `jobspool init`, and init
    # refused it too ("not empty and is not a spool ... it holds metrics"): the entries a
    # running spool gains (metrics/, progress/, schedules.json, index/) were not known as
    # a spool's own, so nothing short of writing spool.json by hand brought it back.
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("record", {}, job_id="j1")
    run = run_jobspool("run-until-idle", "--app", "tests.apps.ledger:app", root=root)
    assert run.returncode == 0, run.stderr
    for name in ("progress", "index"):
        (root / name).mkdir(exist_ok=True)
    (root / "schedules.json").write_bytes(b'{"v": 1, "last_tick": {}}')
    with make_spool(root) as spool:
        spool.enqueue("record", {}, job_id="j2")
    (root / "spool.json").unlink()
    refused = run_jobspool("enqueue", "record", "{}", "--id", "j3", root=root)
    assert refused.returncode == 2 and "jobspool init" in refused.stderr, refused.stderr
    init = run_jobspool("init", root=root)
    assert init.returncode == 0, init.stderr
    proc = run_jobspool("run-until-idle", "--app", "tests.apps.ledger:app", root=root)
    assert proc.returncode == 0, proc.stderr
    assert job_files(root) == {"j1": ["completed"], "j2": ["completed"]}


_CLAIM_ONE = """
import sys
from jobspool import Spool
with Spool(sys.argv[1]) as spool:
    spool.enqueue("record", {}, job_id=sys.argv[2])
    [lease] = spool.claim(limit=1)
    spool.complete(lease)
    print(lease.token)
"""


def test_a_deleted_fence_file_is_restored_from_the_live_counter(tmp_path: Path) -> None:
    # Found in the audit: the next process to open the spool wrote `fence` back as 0, so
    # after a reboot (here: a new `.lock`, whose shared counter starts from the file) the
    # tokens started over at 1 and a token was handed out twice.
    root = tmp_path / "spool"

    def claim_one(job_id: str) -> int:
        proc = subprocess.run([sys.executable, "-c", _CLAIM_ONE, str(root), job_id],
                              cwd=REPO, env=cli_env(), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout)

    make_spool(root).close()
    first = claim_one("a")
    (root / "fence").unlink()  # the operator slip
    second = claim_one("b")  # reopens the spool: the file is written again
    (root / ".lock").unlink()  # what a reboot does to the shared counter
    third = claim_one("c")
    assert first < second < third, (first, second, third)
