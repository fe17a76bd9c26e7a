"""A leased job moved out by another process (cancel, an expired lease's sweep) is written
in its new directory first and removed from `leased/` after: a crash between the two, a
removal that failed, or an operator restoring a backup of `leased/X.json` left the old
lease readable beside the newer copy. Its stale holder could then heartbeat, fail,
release and complete the job, at a revision above the cancel's: the cancel was undone.
Found by an operator probe; DESIGN §4 says such a holder changes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from jobspool.errors import LeaseLost
from jobspool.queue.job import Lease
from tests.spools import make_spool
from tests.subproc import cli_env

# A canceling process killed (SIGKILL) as it is about to remove the old `leased/X.json`.
_CANCEL_THEN_DIE = textwrap.dedent("""
    import os, signal, sys
    import jobspool.queue.store as store
    from jobspool import Spool

    real_unlink, real_replace = store.os_unlink, store.os_replace

    def die_at_old_lease(path, *args, **kwargs):
        if str(path).endswith("leased/X.json"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(path, *args, **kwargs)

    def die_at_old_lease_move(src, dst, *args, **kwargs):
        if str(src).endswith("leased/X.json"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *args, **kwargs)

    store.os_unlink, store.os_replace = die_at_old_lease, die_at_old_lease_move
    Spool(sys.argv[1]).cancel("X")
""")

SETTLES: dict[str, Callable[[Spool, Lease], object]] = {
    "heartbeat": lambda spool, lease: spool.heartbeat(lease),
    "complete": lambda spool, lease: spool.complete(lease, {"by": "stale holder"}),
    "fail": lambda spool, lease: spool.fail(lease, "stale holder failed it"),
    "release": lambda spool, lease: spool.release(lease),
    "fenced": lambda spool, lease: spool.fenced(lease).__enter__(),
}


def _leased(root: Path) -> tuple[Spool, Lease]:
    spool = make_spool(root, lease_seconds=300)
    spool.enqueue("note", {"n": 1}, job_id="X")
    (lease,) = spool.claim(limit=1)
    return spool, lease


def _assert_still_canceled(spool: Spool, root: Path) -> None:
    assert spool.get("X").state is JobState.CANCELED
    spool.recover()
    job = spool.get("X")
    assert job.state is JobState.CANCELED and job.result is None
    assert not (root / "leased" / "X.json").exists()


@pytest.mark.parametrize("settle", sorted(SETTLES))
def test_a_cancel_killed_before_removing_the_old_lease_stays_a_cancel(
        tmp_path: Path, settle: str) -> None:
    root = tmp_path / "spool"
    spool, lease = _leased(root)
    with spool:
        killed = subprocess.run([sys.executable, "-c", _CANCEL_THEN_DIE, str(root)],
                                env=cli_env(), capture_output=True, timeout=120, check=False)
        assert killed.returncode == -9, killed.stderr
        assert (root / "leased" / "X.json").exists()  # the crash window, as it was left
        with pytest.raises(LeaseLost, match="job is canceled"):
            SETTLES[settle](spool, lease)
        _assert_still_canceled(spool, root)


def test_a_backup_of_a_lease_restored_after_a_cancel_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool, lease = _leased(root)
    with spool:
        shutil.copy2(root / "leased" / "X.json", tmp_path / "X.json.bak")
        spool.cancel("X")
        shutil.copy2(tmp_path / "X.json.bak", root / "leased" / "X.json")  # the slip
        for settle in SETTLES.values():
            with pytest.raises(LeaseLost, match="job is canceled"):
                settle(spool, lease)
        _assert_still_canceled(spool, root)


def test_an_older_leftover_elsewhere_does_not_fence_the_current_holder(tmp_path: Path) -> None:
    # The other way round: a claim killed before removing `ready/X.json` leaves an older
    # copy there; the holder of the newer lease keeps it.
    root = tmp_path / "spool"
    spool, lease = _leased(root)
    with spool:
        with make_spool(tmp_path / "other") as other:
            other.enqueue("note", {"n": 1}, job_id="X")
        shutil.copy2(tmp_path / "other" / "ready" / "X.json", root / "ready" / "X.json")
        assert spool.get("X").state is JobState.LEASED  # revision 1 < the lease's 2
        beat = spool.heartbeat(lease)
        done = spool.complete(beat, {"ok": True})
        assert done.state is JobState.COMPLETED and spool.get("X").result == {"ok": True}
