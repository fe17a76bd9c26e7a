"""A spool directory its owner may not write (a mode changed by hand) is reported by
`health` when the owner asks: every worker failed its loop there while health said ok. A
reader of a read-only spool is not told about its own access (as before).

As root, in forked children dropped to `nobody` (root may write anything); without root,
as ourselves."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.cli_harness import run_cli
from tests.forked_cli import forked_cli

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="jobspool-unwritable-"))
    os.chmod(path, 0o777)  # nobody makes its spool in here
    try:
        yield path
    finally:
        for dirpath, dirs, _files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)
        shutil.rmtree(path)


def test_health_reports_a_state_directory_its_owner_may_not_write(base: Path) -> None:
    root = base / "spool"
    warm = base / "warm"  # every module health needs, loaded before a child drops rights
    assert run_cli("init", root=warm).code == 0
    assert run_cli("health", "--json", root=warm).code == 0
    made = forked_cli(["--root", str(root), "init"], as_nobody=True)
    assert made["code"] == 0, made
    assert forked_cli(["--root", str(root), "health"], as_nobody=True)["code"] == 0
    os.chmod(root / "ready", 0o555)
    got = forked_cli(["--root", str(root), "health", "--json"], as_nobody=True)
    assert got["code"] == 2, got
    codes = [r["code"] for r in orjson.loads(got["out"])["reasons"]]
    assert codes == ["state_dir_not_writable"]
    if AS_ROOT:  # another user's health: not about its own access
        assert forked_cli(["--root", str(root), "health"], as_nobody=False)["code"] == 0
    os.chmod(root / "leased", 0o555)
    got = forked_cli(["--root", str(root), "health", "--json"], as_nobody=True)
    (reason,) = orjson.loads(got["out"])["reasons"]
    assert reason["message"].startswith("2 directories of the spool"), reason  # "directorys"
