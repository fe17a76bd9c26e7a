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
