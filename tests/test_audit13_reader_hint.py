"""Audit of issue 13: a read-only user pointed at a spool they were not granted access to
(new spools are private, 0700) gets one line that says how to grant it (a group-read
spool; a one-time chmod would not cover files written later), not just EACCES."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spools import make_spool
from tests.test_readonly import _as_owner, _as_reader


@pytest.fixture
def private_root() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="jobspool-private-"))
    os.chmod(base, 0o755)  # others may reach the spool's directory, not into it
    root = base / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {})
    if os.geteuid() != 0:  # without root to drop from, make the settings unreadable instead
        os.chmod(root / "spool.json", 0)
    try:
        yield root
    finally:
        if (root / "spool.json").exists():
            os.chmod(root / "spool.json", 0o600)
        shutil.rmtree(base)


@pytest.mark.parametrize("command", [("stats",), ("health",), ("list",)])
def test_a_reader_without_access_is_told_how_to_grant_it_in_one_line(
        private_root: Path, command: tuple[str, ...]) -> None:
    if os.geteuid() == 0:  # as the owner first: every module the command needs is loaded
        assert _as_owner(["--root", str(private_root), *command])["code"] in (0, 2)
    got = _as_reader(["--root", str(private_root), *command])
    assert got["code"] == 2, got
    (line,) = got["err"].splitlines()
    assert line.startswith("jobspool: error: cannot read ")
    assert "Permission denied" in line and "--access group-read" in line


def test_a_writable_dashboard_for_a_reader_is_refused_naming_the_read_only_one(
        tmp_path: Path) -> None:
    import uvicorn  # noqa: F401

    import jobspool.dashboard.app  # noqa: F401 - loaded before the reader drops its rights

    base = Path(tempfile.mkdtemp(prefix="jobspool-reader-"))
    os.chmod(base, 0o755)
    root = base / "spool"
    try:
        make_spool(root, access="group").close()
        for dirpath, _dirs, files in os.walk(root):  # others may read, nobody else may write
            os.chmod(dirpath, 0o755 if os.geteuid() == 0 else 0o555)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644 if os.geteuid() == 0 else 0o444)
        got = _as_reader(["--root", str(root), "dashboard", "--port", "0"])
        assert got["code"] == 2, got
        (line,) = got["err"].splitlines()
        assert "not writable" in line and "dashboard --read-only" in line
    finally:
        for dirpath, _dirs, _files in os.walk(base):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(base)
