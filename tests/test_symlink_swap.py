"""A state directory (or `tmp/`) swapped for a symlink under an open spool is refused at the
next write, as at open (DESIGN §2: "a symlink in their place is refused with SpoolError
naming it, since it could send writes outside the spool"). Before, a long-lived spool (a
worker's, a producer's) wrote job files through it, outside the spool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobspool.errors import SpoolError
from tests.spools import make_spool


@pytest.mark.parametrize(("swapped", "write"), [
    ("ready", "enqueue"), ("leased", "claim"), ("retryable", "enqueue_delayed"),
    ("prepared", "prepare"), ("canceled", "cancel"), ("tmp", "enqueue")])
def test_a_directory_swapped_for_a_symlink_is_refused_at_the_next_write(
        tmp_path: Path, swapped: str, write: str) -> None:
    root, outside = tmp_path / "spool", tmp_path / "outside"
    outside.mkdir()
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="pre")
        target = root / swapped
        for name in os.listdir(target):  # keep what it held (tmp/pool/ among it)
            os.rename(target / name, outside / name)
        target.rmdir()
        target.symlink_to(outside)
        with pytest.raises(SpoolError) as caught:
            if write == "enqueue":
                spool.enqueue("k", {}, job_id="new")
            elif write == "enqueue_delayed":
                spool.enqueue("k", {}, job_id="new", delay=5)
            elif write == "claim":
                spool.claim(limit=5)
            elif write == "prepare":
                spool.prepare("k", {}, job_id="new")
            else:
                spool.cancel("pre")
        assert str(target) in str(caught.value) and "symlink" in str(caught.value)
    assert not any(name.endswith(".json") for name in os.listdir(outside)
                   if name not in ("pre.json",)), os.listdir(outside)


def test_a_fence_file_swapped_for_a_symlink_is_refused_then_quarantined_by_recover(
        tmp_path: Path) -> None:
    """It said "a symlink where a job file belongs" (and recover told to run recover),
    and a claim raised a bare OSError."""
    from jobspool import JobState
    from jobspool.queue.fence import FENCE_FILE

    root, outside = tmp_path / "spool", tmp_path / "outside"
    outside.write_text("0")
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="j")
        (root / FENCE_FILE).unlink()
        (root / FENCE_FILE).symlink_to(outside)
        with pytest.raises(SpoolError, match="a symlink where the fence file belongs"):
            spool.claim()
        assert spool.get("j").state is JobState.READY
        spool.recover()
        assert not (root / FENCE_FILE).is_symlink()
        (lease,) = spool.claim()
        assert lease.job_id == "j"
    assert outside.read_text() == "0"  # never written through
