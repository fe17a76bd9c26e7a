"""A batch the spool refuses leaves no payload on disk: its staged files go back to the
pool emptied. A batch refused by a full disk kept up to `pool_size` files of its payloads
in `tmp/pool/`, so the disk stayed full and `recover` freed nothing (a producers probe: 61
files, 1.8 MB of a 2 MB disk)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import jobspool.queue.store as store
from jobspool.errors import DuplicateJob, WriteFailed
from tests.spools import make_spool

BIG = {"text": "y" * 30_000}


def _pool_bytes(root: Path) -> tuple[int, int]:
    files = [p for p in (root / "tmp" / "pool").iterdir() if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def test_a_batch_cut_short_by_a_full_disk_leaves_its_payloads_nowhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    real = store.os_write
    written = [0]

    def full_after_ten(fd: int, data: memoryview) -> int:
        written[0] += 1
        if written[0] > 10:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    with make_spool(root) as spool:
        monkeypatch.setattr(store, "os_write", full_after_ten)
        with pytest.raises(WriteFailed, match="No space left"):
            spool.enqueue_many("k", [BIG] * 40, job_ids=[f"a{i}" for i in range(40)])
        monkeypatch.undo()
        count, size = _pool_bytes(root)
        assert count >= 10 and size == 0  # recycled, emptied
        assert list(spool.jobs()) == []
        spool.enqueue("k", {"small": 1}, job_id="after")  # the pool is reused as before
        assert spool.get("after").payload == {"small": 1}


def test_a_batch_refused_for_a_conflict_leaves_what_it_refused_nowhere(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="taken")
        with pytest.raises(DuplicateJob):
            spool.enqueue_many("k", [BIG, BIG], job_ids=["free", "taken"], on_conflict="error")
        assert _pool_bytes(root)[1] == 0
        assert [j.id for j in spool.jobs()] == ["taken"]
