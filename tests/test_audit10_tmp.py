"""Issue 10 item 8, audited: what `recover` leaves in `tmp/` is a live writer's, nothing else.

Found in the audit: a stray *directory* in `tmp/` (a person's `tmp/old/`, with
files in it) was skipped by recovery for good, and a staging file an older
version named `<pid>.<n>.stage` (before writers had a random identity) was
kept for ten minutes as if its writer might still be alive, though no live
writer of this version names a file that way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_harness import run_jobspool
from tests.helpers_spool import job_files, tmp_leftovers
from tests.spools import make_spool


def test_recover_removes_a_stray_directory_in_tmp_and_keeps_the_pool(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="kept")
        old = root / "tmp" / "old"
        (old / "deeper").mkdir(parents=True)
        (old / "partial.json").write_bytes(b'{"id": "par')
        (old / "deeper" / "x.tmp").write_bytes(b"x")
        report = spool.recover()
    assert "tmp/old" in report.temp_files_removed, report.temp_files_removed
    assert not old.exists()
    assert (root / "tmp" / "pool").is_dir()
    assert tmp_leftovers(root) == []
    assert job_files(root) == {"kept": ["ready"]}


def test_recover_removes_an_older_versions_pid_named_staging_file_at_once(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="kept")
    stale = root / "tmp" / "12345.7.stage"  # an older version's name: `<pid>.<n>.stage`
    stale.write_bytes(b'{"id": "half-written"')
    proc = run_jobspool("recover", root=root)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists(), "an older version's staging file outlived recover"
    assert tmp_leftovers(root) == []


def test_a_live_producers_staging_file_still_survives_recover(tmp_path: Path) -> None:
    # The other side of the rule above: this process is alive and holds its liveness lock.
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        [staged] = spool.store.prestage([b'{"staged": "by a live producer"}'])
        proc = run_jobspool("recover", root=root)
        assert proc.returncode == 0, proc.stderr
        assert os.path.exists(staged)
        spool.store.discard([staged])


def test_a_stray_in_tmp_that_resists_removal_is_left_with_a_warning_not_a_failed_recover(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What recover cannot remove from `tmp/` (a directory holding what this user may not
    delete) must not fail every boot's recover; the other strays still go."""
    import shutil

    from jobspool.queue import store as store_mod

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="kept")
        stuck = root / "tmp" / "stuck"
        (stuck / "inner").mkdir(parents=True)
        (root / "tmp" / "4242.9.tmp").write_bytes(b"")
        real_rmtree = shutil.rmtree

        def refusing(path: object, *args: object, **kwargs: object) -> None:
            if str(path).endswith("stuck"):
                raise PermissionError(13, "Permission denied", str(path))
            real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(store_mod.shutil, "rmtree", refusing)
        report = spool.recover()
    assert "tmp/4242.9.tmp" in report.temp_files_removed
    assert "tmp/stuck" not in report.temp_files_removed and stuck.is_dir()
    assert "could not remove" in caplog.text and "left in place" in caplog.text
    assert job_files(root) == {"kept": ["ready"]}


def test_recover_removes_a_fifo_and_a_symlink_in_tmp_without_following_it(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me")
    with make_spool(root) as spool:
        os.mkfifo(root / "tmp" / "4242.10.tmp")
        os.symlink(outside, root / "tmp" / "link")
        report = spool.recover()
    assert {"tmp/4242.10.tmp", "tmp/link"} <= set(report.temp_files_removed)
    assert not os.path.lexists(root / "tmp" / "link")
    assert (outside / "precious").read_bytes() == b"keep me"
