"""Audit of issue 13: a read-only user pointed at a spool they were not granted access to
(new spools are private, 0700) gets one line that says how to grant it, not just EACCES."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import Spool
from tests.test_readonly import _as_reader


@pytest.fixture
def private_root() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="jobspool-private-"))
    os.chmod(base, 0o755)  # others may reach the spool's directory, not into it
    root = base / "spool"
    with Spool(root) as spool:
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
    got = _as_reader(["--root", str(private_root), *command])
    assert got["code"] == 2, got
    (line,) = got["err"].splitlines()
    assert line.startswith("jobspool: error: cannot read ")
    assert "Permission denied" in line and f"chmod -R o+rX {private_root}" in line
    assert "access='group'" in line
