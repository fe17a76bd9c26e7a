"""A quarantine killed between writing its reason file and moving the bad file leaves the
reason alone in quarantine/; `recover` removes it (and quarantines the file again, with a
reason of its own). Found by a probe: SIGKILLs during `recover` left reason files that no
listing showed and no later pass removed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.spools import make_spool

pytestmark = pytest.mark.filterwarnings("ignore::jobspool.errors.CorruptFileWarning")


def test_recover_removes_a_reason_file_left_without_its_file(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    qdir = root / "quarantine"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="fine")
        (root / "ready" / "bad1.json").write_bytes(b"garbage")
        first = spool.recover()
        assert first.quarantined == ("ready/bad1.json",)
        [reason] = [p for p in qdir.iterdir() if p.name.endswith(".reason")]
        # The state a kill between the two steps leaves: a second bad file still in place,
        # and its reason file (a copy of a real one) in quarantine/ with nothing beside it.
        (root / "ready" / "bad2.json").write_bytes(b"more garbage")
        orphan = qdir / "1-2-3.ready.bad2.json.reason"
        shutil.copy(reason, orphan)

        report = spool.recover()
        assert report.quarantined == ("ready/bad2.json",)
        assert report.temp_files_removed == (f"quarantine/{orphan.name}",)
        assert not orphan.exists()
        names = {p.name for p in qdir.iterdir()}
        assert len(names) == 4  # two files, each with its reason
        assert all(n + ".reason" in names for n in names if not n.endswith(".reason"))
        assert not spool.recover().changed  # nothing left to do
        assert spool.fsck().ok


def test_a_quarantined_file_named_like_a_reason_is_kept_with_its_reason(tmp_path: Path) -> None:
    """Found by a probe of the fix above: `ready/notes.reason` quarantined as
    `<...>.ready.notes.reason` was taken for an orphan reason and deleted, then its own
    reason in the next pass."""
    root = tmp_path / "spool"
    qdir = root / "quarantine"
    with make_spool(root) as spool:
        (root / "ready" / "notes.reason").write_bytes(b"important notes")
        assert spool.recover().quarantined == ("ready/notes.reason",)
        for _ in range(2):
            assert spool.recover().temp_files_removed == ()
        kept = sorted(p.name for p in qdir.iterdir())
        assert len(kept) == 2 and kept[1] == kept[0] + ".reason"
        assert (qdir / kept[0]).read_bytes() == b"important notes"
