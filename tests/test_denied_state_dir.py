"""A state directory the worker's user may not search (`sudo rm -rf completed && sudo mkdir
completed`, or a chmod) must fail the settle or the cancel and keep the job, not delete it
(found by a hand-damage probe): after the failed rename, "is the new copy there?" was asked
with an lstat that failed for want of permission and counted as "there", so the old copy
was removed, the job reported settled, and no copy of it was left anywhere.

Run as root, the commands drop to `nobody` in a forked child (root bypasses permissions);
without root, the directory is made unsearchable with chmod."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import JobState
from tests.cli_harness import run_cli
from tests.forked_cli import deny_to_caller, forked_cli, reachable_root
from tests.spools import make_spool

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def root() -> Iterator[Path]:
    with reachable_root() as path:
        yield path


def _warm(root: Path, *args: str) -> None:
    """Run the command once in this process on a scratch spool: the child `nobody` becomes
    may not read the interpreter's own files (forked_cli.py)."""
    scratch = root.parent / "scratch"
    run_cli("--root", str(scratch), "init")
    run_cli("--root", str(scratch), *args)


def _allow(root: Path, state: str) -> None:
    os.chmod(root / state, 0o700)
    if AS_ROOT:
        os.chown(root / state, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)


@pytest.mark.parametrize(("state", "app"), [("completed", "tests.apps.simple:only_work"),
                                            ("dead_letter", "tests.apps.simple:app")])
def test_a_settle_into_an_unsearchable_directory_keeps_every_job(
        root: Path, state: str, app: str) -> None:
    kind = "work" if state == "completed" else "boom"
    with make_spool(root, max_attempts=1) as spool:
        ids = [spool.enqueue(kind, {}, job_id=f"a{i}").id for i in range(3)]
    argv = ["--root", str(root), "run-until-idle", "--app", app]
    _warm(root, "run-until-idle", "--app", app)
    deny_to_caller(root, state)
    got = forked_cli(argv, as_nobody=True)
    # (the handler's own traceback is logged for the `boom` jobs: the CLI ends in one line)
    assert got["code"] != 0, got["err"]
    assert got["err"].strip().splitlines()[-1].startswith("jobspool: error: "), got["err"]
    assert not re.search(r"[1-9]\d* of \d+ settled anyway", got["err"]), got["err"]
    _allow(root, state)
    with make_spool(root) as spool:
        for job_id in ids:  # raised JobNotFound: deleted from every directory
            assert spool.get(job_id).state in (JobState.READY, JobState.LEASED, JobState(state))
        spool.recover()
        assert spool.fsck().ok


def test_a_cancel_into_an_unsearchable_directory_keeps_the_job(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="c1")
    _warm(root, "cancel", "nothing-here")
    deny_to_caller(root, "canceled")
    got = forked_cli(["--root", str(root), "cancel", "c1"], as_nobody=True)
    assert got["code"] != 0 and "Traceback" not in got["err"], got["err"]
    _allow(root, "canceled")
    with make_spool(root) as spool:
        assert spool.get("c1").state is JobState.READY
