"""Files keep the spool's mode when the process umask changes after the spool was opened.

The umask is read once per process (from /proc, not changing it): a handler's
`os.umask(0o077)` (common before writing private temporary files) left the job files it
enqueued at 0600 in a group-read spool, unreadable by the group's health checks; under
umask 0777 a job file got mode 0: never run, skipped by `stats` and `list`, and
quarantined by `recover`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import Spool, Worker


@pytest.fixture()
def restore_umask() -> Iterator[None]:
    old = os.umask(0o022)
    os.umask(old)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("access, expected", [("group-read", 0o640), ("private", 0o600)])
def test_a_later_umask_does_not_change_job_file_modes(tmp_path: Path, restore_umask: None,
                                                      access: str, expected: int) -> None:
    os.umask(0o022)
    with Spool(tmp_path / "s", access=access) as spool:
        spool.enqueue("k", {}, job_id="before")

        def handler(job: object, ctx: object) -> None:
            os.umask(0o777)
            spool.enqueue("child", {}, job_id="child")

        assert Worker(spool, {"k": handler}).run_until_idle().completed == 1
        assert _mode(tmp_path / "s" / "ready" / "child.json") == expected
        assert _mode(tmp_path / "s" / "completed" / "before.json") == expected
        assert spool.get("child").state.value == "ready"
