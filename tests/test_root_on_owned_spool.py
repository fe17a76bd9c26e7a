"""A command run as root on a spool another user owns acts as that user: what it writes
stays the owner's, so the owner's worker can read and reuse every file.

Before, `sudo jobspool cancel/requeue/enqueue` on a service account's spool wrote
root-owned 0600 files: job files the service could not read, and recycled files in
`tmp/pool/` it could not reopen, so its worker failed five times on EACCES and stopped
while `fsck` and `health` said all was well. A recycled file the user cannot open (left
by such an older run) is now skipped, not fatal.

Run as root, these drop to `nobody` in forked children (root would bypass permissions,
and the test process itself must stay root); without root there is no root command to
test, so the owner-side half runs alone.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import run_cli
from tests.forked_cli import forked_cli
from tests.spools import make_spool

AS_ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="jobspool-owned-"))
    os.chmod(path, 0o755)  # outside pytest's private temp tree: another user can reach it
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture(autouse=True)
def _warm(base: Path) -> None:
    """Every module the commands import, loaded in this process (root's own spool, so no
    change of user) before a forked child drops its rights and can no longer read them."""
    warm = base / "warm"
    for argv in (["init"], ["enqueue", "work", "{}"], ["cancel", "--state", "ready"],
                 ["requeue", "--state", "canceled"], ["list", "--json"],
                 ["run-until-idle", "--app", "tests.apps.simple:app", "--json"], ["fsck"]):
        code, _out, err = run_cli("--root", str(warm), *argv)
        assert code == 0, err


def _forked(argv: list[str], *, as_nobody: bool,
            code_dirs: list[str] | None = None) -> dict[str, Any]:
    """The CLI in a forked child (as `nobody` when asked and we are root). `code_dirs`:
    where the child is to believe its Python lives (the owner's access to it decides
    whether root may switch to the owner)."""
    def believe() -> None:
        from jobspool.cli import owner

        owner._code_dirs = lambda: code_dirs  # type: ignore[assignment]  # noqa: SLF001

    return forked_cli(argv, as_nobody=as_nobody,
                      before=None if code_dirs is None else believe)


def _users_dir(path: Path) -> Path:
    """An empty directory of the user's (`nobody`'s when we are root) to init a spool in."""
    path.mkdir()
    if AS_ROOT:
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


def _owners(root: Path) -> set[int]:
    return {os.lstat(os.path.join(d, n)).st_uid
            for d, dirs, files in os.walk(root) for n in [*dirs, *files]}


def test_root_commands_on_a_users_spool_leave_every_file_to_that_user(base: Path) -> None:
    root = _users_dir(base / "spool")
    made = _forked(["--root", str(root), "init"], as_nobody=True)
    assert made["code"] == 0, made
    for i in range(6):
        assert _forked(["--root", str(root), "enqueue", "work", "{}", "--id", f"j{i}"],
                       as_nobody=True)["code"] == 0
    # The operator, as root: bulk cancel and requeue (retired files recycled, new ones
    # written) and a new job; with a Python the owner may read (a system install: no
    # directory of it is out of the owner's reach).
    for argv in (["cancel", "--state", "ready"], ["requeue", "--state", "canceled"],
                 ["enqueue", "work", "{}", "--id", "by-root"]):
        done = _forked(["--root", str(root), *argv], as_nobody=False, code_dirs=[])
        assert done["code"] == 0, done
        assert done["uid"] == (NOBODY.pw_uid if AS_ROOT else os.geteuid())
    assert _owners(root) == {NOBODY.pw_uid if AS_ROOT else os.geteuid()}
    # The owner's worker: every job, the root-written one too, readable and run.
    ran = _forked(["--root", str(root), "run-until-idle", "--app", "tests.apps.simple:app",
                   "--json"], as_nobody=True)
    assert ran["code"] == 0, ran
    assert orjson.loads(ran["out"])["completed"] == 7
    assert _forked(["--root", str(root), "fsck"], as_nobody=True)["code"] == 0


def test_a_recycled_file_the_user_cannot_open_is_skipped_not_fatal(base: Path) -> None:
    root = _users_dir(base / "spool")
    assert _forked(["--root", str(root), "init"], as_nobody=True)["code"] == 0
    for i in range(3):
        assert _forked(["--root", str(root), "enqueue", "work", "{}", "--id", f"j{i}"],
                       as_nobody=True)["code"] == 0
    # What an older version run as root left: files of root's, 0600, in the pool.
    pool = root / "tmp" / "pool"
    for i in range(8):
        stray = pool / f"left-by-root-{i}.tmp"
        stray.write_bytes(b"x" * 100)
        os.chmod(stray, 0o600)
    ran = _forked(["--root", str(root), "run-until-idle", "--app", "tests.apps.simple:app",
                   "--json"], as_nobody=True)
    assert ran["code"] == 0, ran
    assert orjson.loads(ran["out"])["completed"] == 3
    with make_spool(root) as spool:
        assert {j.state for j in spool.jobs()} == {JobState.COMPLETED}


def test_root_is_refused_in_one_line_when_the_owner_cannot_read_this_python(
        base: Path) -> None:
    """Switching to an owner who cannot read the interpreter (one under root's private home,
    `/root/.pyenv`) made the command die at its next import with a traceback; it is
    refused before anything is written. Commands that only read stay root and work."""
    root = _users_dir(base / "spool")
    assert _forked(["--root", str(root), "init"], as_nobody=True)["code"] == 0
    assert _forked(["--root", str(root), "enqueue", "work", "{}", "--id", "j1"],
                   as_nobody=True)["code"] == 0
    private = base / "private-python"
    private.mkdir(mode=0o700)
    before = _owners(root)
    done = _forked(["--root", str(root), "cancel", "j1"], as_nobody=False,
                   code_dirs=[str(private)])
    if AS_ROOT:
        assert done["code"] == 2, done
        assert done["err"].count("\n") == 1 and "run this command as nobody" in done["err"]
        assert "Traceback" not in done["err"]
        assert _owners(root) == before
        with make_spool(root) as spool:
            assert spool.get("j1").state is JobState.READY  # nothing was done
    else:
        assert done["code"] == 0  # no root to switch from: the owner's own command
    listed = _forked(["--root", str(root), "list", "--json"], as_nobody=False,
                     code_dirs=[str(private)])
    assert listed["code"] == 0, listed
    assert [j["id"] for j in orjson.loads(listed["out"])] == ["j1"]
