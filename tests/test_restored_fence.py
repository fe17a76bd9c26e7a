"""A backup of a live spool restored over it: its `.lock` and `fence` are older than the
leases in `leased/`.

Before: the counter went on from the restored files, and the next claims handed out
tokens 1, 2, 3 again — the tokens of leases still held, so a stale holder's settle or
projection write passed the fence — until someone ran `recover`. Now a process's first
claim reads the largest token in `leased/` and goes on above it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from jobspool import Spool
from tests.spools import make_spool


def test_tokens_go_on_above_the_leases_after_an_old_fence_and_lock_are_restored(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    backup = tmp_path / "backup"
    backup.mkdir()
    with make_spool(root) as first:
        first.enqueue_many("k", [{"i": i} for i in range(5)], job_ids=[f"j{i}" for i in range(5)])
        (early,) = first.claim()
        for name in (".lock", "fence"):
            shutil.copy2(root / name, backup / name)  # the backup, taken while live
        held = [first.claim()[0], first.claim()[0]]
    assert [lease.token for lease in held] == [early.token + 1, early.token + 2]
    for name in (".lock", "fence"):
        shutil.copy2(backup / name, root / name)  # restored (times kept, as cp -a does)
    spool: Spool = make_spool(root)
    try:
        (later,) = spool.claim()
        assert later.token > max(lease.token for lease in held)
        # The holders of the restored-over leases are still fenced against each other.
        assert spool.complete(held[0]).state.value == "completed"
    finally:
        spool.close()
