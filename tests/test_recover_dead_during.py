"""A worker that claims after `recover` scanned the spool and dies while it runs.

Before: the recovery removed the liveness file of every dead process at its end, this
one's too, though its leases were never in the scan: the next `recover` reclaimed
nothing, fsck and health saw nothing, and its jobs sat `leased` for a full lease
(600 s in the probe) before running again. Now a dead process's
file stays while a lease in `leased/` names it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState
from jobspool.queue import liveness
from jobspool.recovery import recover as recover_mod
from tests.spools import make_spool


def _claim_and_die(root: Path, n: int) -> None:
    pid = os.fork()
    if pid == 0:  # a worker: claims, then is SIGKILLed (no cleanup at all)
        try:
            with make_spool(root, lease_seconds=600) as spool:
                spool.claim(limit=n)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_leases_of_a_process_that_died_during_recovery_are_reclaimed_by_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=600) as spool:
        spool.enqueue_many("k", [{}] * 5, job_ids=[f"j{i}" for i in range(5)])
        real = recover_mod._reclaim  # noqa: SLF001 - the seam between scan and reclaim

        def reclaim_after_a_death(journal: Any, scan: Any) -> Any:
            _claim_and_die(root, 3)  # after the scan, before the reclaim step
            return real(journal, scan)

        with monkeypatch.context() as m:
            m.setattr(recover_mod, "_reclaim", reclaim_after_a_death)
            first = spool.recover()
        assert first.leases_returned == () and first.leases_reclaimed == ()
        assert sum(j.state is JobState.LEASED for j in spool.jobs()) == 3
        second = spool.recover()  # the dead worker's leases, at once, not in 600 s
        assert len(second.leases_reclaimed) + len(second.leases_returned) == 3
        assert not any(j.state is JobState.LEASED for j in spool.jobs())
        assert liveness.dead_marks(root) == []  # its file goes once no lease names it
