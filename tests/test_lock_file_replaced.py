"""A spool whose `.lock` was replaced by a directory is reported by every command.

Found by an operator-slip probe (`rm .lock; mkdir .lock`): readers open a directory
without a word, so `health` said ok and `fsck` "consistent" while every writer was refused
with "Is a directory" and no fix named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_harness import one_error_line, run_jobspool
from tests.spools import make_spool


@pytest.mark.parametrize("command", [("health",), ("fsck",), ("stats",), ("recover",),
                                     ("enqueue", "work", "{}")])
def test_every_command_names_a_lock_that_is_a_directory_and_how_to_fix_it(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {"n": 1}, job_id="kept")
    (root / ".lock").unlink()
    (root / ".lock").mkdir()
    r = run_jobspool("--root", root, *command, timeout=60)
    assert r.returncode == 2
    line = one_error_line(r)
    assert "is not a regular file" in line and "rmdir" in line
    # The fix the message names: the directory moved away, a writer recreates the file.
    (root / ".lock").rmdir()
    assert run_jobspool("--root", root, "recover").returncode == 0
    assert run_jobspool("--root", root, "health").returncode == 0
    with make_spool(root, create=False) as spool:
        assert spool.get("kept").payload == {"n": 1}


@pytest.mark.parametrize("command", [("health",), ("stats",), ("list",), ("recover",)])
def test_a_fifo_at_the_lock_path_is_refused_not_waited_on(tmp_path: Path,
                                                          command: tuple[str, ...]) -> None:
    # Found by a regression probe: a reader's open of a FIFO blocks until a writer comes,
    # so read-only commands hung before the check could refuse it.
    import os

    root = tmp_path / "spool"
    with make_spool(root):
        pass
    (root / ".lock").unlink()
    os.mkfifo(root / ".lock")
    r = run_jobspool("--root", root, *command, timeout=60)  # a hang fails, not passes
    assert r.returncode == 2
    assert "is not a regular file" in one_error_line(r)
