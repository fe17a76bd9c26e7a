"""Permissions taken away from parts of a spool, met by producers (probe findings):
- `tmp/pool/` that cannot be listed made `Spool.enqueue` raise a bare PermissionError
  (not a `JobspoolError`) on the pool's first use in a process;
- a state directory that cannot be searched made `enqueue --id` say the id "is taken by
  an unreadable file" that did not exist, and suggest `recover`.

Run as root, the calls drop to `nobody` in a forked child (root bypasses permissions);
without root, the directory is made unreadable with chmod."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import Spool
from tests.cli_harness import run_cli
from tests.forked_cli import deny_to_caller, forked_call, forked_cli, reachable_root
from tests.spools import make_spool

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def root() -> Iterator[Path]:
    with reachable_root() as path:
        yield path


def test_an_unlistable_pool_fails_an_enqueue_with_a_jobspool_error(root: Path) -> None:
    make_spool(root).close()
    (root / "tmp" / "pool").mkdir(parents=True, exist_ok=True)
    deny_to_caller(root, "tmp/pool")

    def enqueue() -> None:
        with Spool(root) as spool:
            spool.enqueue("work", {})

    said = forked_call(lambda: enqueue() or {}, as_nobody=True).get("raised", "ok")
    assert said.startswith("jobspool.errors."), said  # WriteFailed, one line
    assert "tmp/pool" in said and "\n" not in said


def test_an_unsearchable_state_directory_is_named_not_an_unreadable_file(
        root: Path) -> None:
    make_spool(root).close()
    run_cli("--root", str(root.parent / "scratch"), "init")  # warm the CLI's imports
    run_cli("--root", str(root.parent / "scratch"), "enqueue", "k", "--id", "warm")
    deny_to_caller(root, "canceled")
    got = forked_cli(["--root", str(root), "enqueue", "k", "--id", "brand-new-id"],
                     as_nobody=True)
    assert got["code"] != 0, got
    last = got["err"].strip().splitlines()[-1]
    assert "canceled" in last and "Permission denied" in last, got["err"]
    assert "taken by an unreadable file" not in got["err"]
