"""An old copy of a job put back by hand (a backup restored into one state directory)
beside its current copy is never claimed, by a process that opens the spool afterwards
without running `recover` first as much as by one that was running all along.

DESIGN §2/§6: of two copies of a job, the higher revision is the job. Claiming the old
one would run finished work again, undo a dead-letter or cancel decision, or take a
lease another worker holds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from tests.spools import make_spool


def _backup_ready_copy(root: Path, job_id: str, tmp_path: Path) -> Path:
    saved = tmp_path / f"{job_id}.rev1.json"
    shutil.copyfile(root / "ready" / f"{job_id}.json", saved)
    return saved


@pytest.mark.parametrize("end", ["completed", "dead_letter", "canceled"])
def test_a_restored_ready_copy_of_a_finished_job_is_not_claimed(tmp_path: Path, end: str) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("echo", {"n": 1}, job_id="j")
        saved = _backup_ready_copy(root, "j", tmp_path)
        if end == "canceled":
            spool.cancel("j")
        else:
            [lease] = spool.claim(kinds="echo")
            if end == "completed":
                spool.complete(lease, {"first": True})
            else:
                spool.fail(lease, "broken", retryable=False)
        assert spool.get("j").state.value == end
    shutil.copyfile(saved, root / "ready" / "j.json")  # the operator restores ready/

    with make_spool(root) as fresh:  # a new process: no recover, no watcher that saw it
        assert fresh.claim(kinds="echo") == []
        job = fresh.get("j")
        assert job.state.value == end
        if end == "completed":
            assert job.result == {"first": True}
    assert not (root / "ready" / "j.json").exists()  # the stale copy is retired


def test_a_restored_ready_copy_does_not_take_a_live_lease(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("echo", {}, job_id="j")
        saved = _backup_ready_copy(root, "j", tmp_path)
        [held] = spool.claim(kinds="echo", owner="w1", lease_seconds=600)
        shutil.copyfile(saved, root / "ready" / "j.json")
        with make_spool(root) as other:
            assert other.claim(kinds="echo", owner="w2") == []
            assert other.get("j").state is JobState.LEASED
        done = spool.complete(held, {"by": "w1"})  # the holder is not fenced off
        assert done.state is JobState.COMPLETED


def test_a_hand_copy_of_equal_revision_in_a_terminal_directory_wins(tmp_path: Path) -> None:
    """Copies of equal revision: the terminal one is the job (what `list`, `show` and
    `recover` keep), so the claim leaves the ready one alone too."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("echo", {}, job_id="j")
    text = (root / "ready" / "j.json").read_text()
    (root / "dead_letter" / "j.json").write_text(
        text.replace('"state":"ready"', '"state":"dead_letter"'))
    with make_spool(root) as fresh:
        assert fresh.get("j").state is JobState.DEAD_LETTER
        assert fresh.claim(kinds="echo") == []


def test_a_restored_copy_is_not_run_by_run_until_idle(tmp_path: Path) -> None:
    """The same through a Worker, as `run-until-idle` in a script runs it."""
    from jobspool import Worker

    root = tmp_path / "spool"
    runs: list[str] = []
    with make_spool(root) as spool:
        spool.enqueue("echo", {}, job_id="j")
        saved = _backup_ready_copy(root, "j", tmp_path)
        Worker(spool, handlers={"echo": lambda job, ctx: runs.append(job.id)}).run_until_idle()
    shutil.copyfile(saved, root / "ready" / "j.json")
    with Spool(root) as fresh:
        report = Worker(fresh, handlers={"echo": lambda job, ctx: runs.append(job.id)}
                        ).run_until_idle()
    assert runs == ["j"]
    assert report.claimed == 0
