"""Job files placed by hand (restored from a backup or from quarantine) are noticed.

Such a file bumps no generation counter, so a claim index that only follows
changes made through the spool would never see it. The claim index stats
its directories now and then and relists them when they moved behind its
back. Deadlines here only guard against hangs; they are not latency claims.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.errors import CorruptFileWarning, LeaseLost
from tests.cli_harness import start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

GUARD_SECONDS = 60.0


def _stage_job_file(tmp_path: Path, job_id: str, kind: str = "work") -> Path:
    """A valid ready job file made by another spool: what a backup would hold."""
    with make_spool(tmp_path / "backup") as other:
        other.enqueue(kind, {"n": 1}, job_id=job_id)
    return tmp_path / "backup" / "ready" / f"{job_id}.json"


def test_a_job_file_copied_into_ready_by_hand_is_claimed_by_a_running_worker_process(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    log = tmp_path / "handled.log"
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="through-the-spool")
    proc = start_jobspool("worker", "--app", "tests.apps.simple:app", "--json",
                          "--no-maintenance", root=root, env={"JOBSPOOL_TEST_LOG": str(log)})
    try:
        # Readiness: the worker has listed ready/ and run what it found there.
        wait_until(lambda: (root / "completed" / "through-the-spool.json").exists(),
                   GUARD_SECONDS, "the worker to run the first job", proc=proc)
        shutil.copyfile(_stage_job_file(tmp_path, "by-hand"), root / "ready" / "by-hand.json")
        wait_until(lambda: (root / "completed" / "by-hand.json").exists(),
                   GUARD_SECONDS, "the worker to run the file placed by hand", proc=proc)
    finally:
        proc.terminate()
        proc.communicate(timeout=GUARD_SECONDS)
    assert proc.returncode == 0
    handled = [line.split()[0] for line in log.read_text().splitlines()]
    assert handled.count("by-hand") == 1
    with make_spool(root) as spool:
        assert spool.get("by-hand").state is JobState.COMPLETED


def test_a_spool_whose_index_is_current_claims_a_file_placed_behind_its_back(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="first")
        assert [lease.job_id for lease in spool.claim()] == ["first"]
        assert spool.claim() == []  # the index is current and ready/ is empty
        shutil.copyfile(_stage_job_file(tmp_path, "restored"), root / "ready" / "restored.json")
        claimed: list[str] = []
        wait_until(lambda: bool(claimed.extend(lease.job_id for lease in spool.claim()))
                   or bool(claimed), GUARD_SECONDS)
        assert claimed == ["restored"]
        assert spool.get("restored").state is JobState.LEASED


def test_a_half_written_file_is_claimed_once_its_copy_completes(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    source = _stage_job_file(tmp_path, "slow-copy")
    with make_spool(root) as spool:
        assert spool.claim() == []
        target = root / "ready" / "slow-copy.json"
        target.write_bytes(b"")  # the copy has created the file but not written it yet
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", CorruptFileWarning)
            wait_until(lambda: spool.claim() == [] and any(
                issubclass(w.category, CorruptFileWarning) for w in seen), GUARD_SECONDS)
        # Writing the data changes the file, not the directory: the index must look again.
        target.write_bytes(source.read_bytes())
        claimed: list[str] = []
        wait_until(lambda: bool(claimed.extend(lease.job_id for lease in spool.claim()))
                   or bool(claimed), GUARD_SECONDS)
        assert claimed == ["slow-copy"]


def test_a_lease_on_a_hand_damaged_file_names_the_file_not_a_gone_job(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("k", job_id="j1")
        (lease,) = spool.claim()
        path = spool.root / "leased" / "j1.json"
        path.write_bytes(path.read_bytes()[:-20])  # a hand's edit gone wrong
        with pytest.raises(LeaseLost) as caught:
            spool.complete(lease)
        assert str(path) in str(caught.value) and "recover" in str(caught.value)
        assert "gone" not in str(caught.value)
