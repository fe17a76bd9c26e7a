"""A quarantine killed between writing its reason file and moving the bad file leaves the
reason alone in quarantine/; `recover` removes it (and quarantines the file again, with a
reason of its own). Found by a probe: SIGKILLs during `recover` left reason files that no
listing showed and no later pass removed."""

from __future__ import annotations

import os
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


def test_a_fifo_named_like_a_reason_never_blocks_recover_or_the_listing(
        tmp_path: Path) -> None:
    """Found by a probe: reading it to tell whether it was a reason, `recover` hung for good
    holding the spool lock (every enqueue and claim waiting behind it); `quarantine list`
    hung on a FIFO standing in for a file's reason."""
    import subprocess

    from tests.cli_harness import run_jobspool

    root = tmp_path / "spool"
    with make_spool(root):
        pass
    qdir = root / "quarantine"
    os.mkfifo(qdir / "hand.reason")
    (qdir / "x").write_bytes(b"quarantined by hand")
    os.mkfifo(qdir / "x.reason")
    for args in (("recover",), ("quarantine", "list"), ("fsck",)):
        try:
            done = run_jobspool(*args, root=root, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"jobspool {' '.join(args)} hung on a FIFO") from None
        assert "Traceback" not in done.stderr, done.stderr
    assert (qdir / "x").read_bytes() == b"quarantined by hand"


def test_a_reason_left_empty_or_cut_short_is_an_orphan_too(tmp_path: Path) -> None:
    """A quarantine killed before its reason was written (or a non-durable spool after a
    power loss) leaves it empty or cut short, named as every reason is named."""
    root = tmp_path / "spool"
    qdir = root / "quarantine"
    with make_spool(root) as spool:
        (qdir / "1796663488858562502-22705-0.ready.x.json.reason").write_bytes(b"")
        (qdir / "1796663488858562503-22705-1.ready.y.json.reason").write_bytes(
            b'{"v":1,"source":"ready/y.js')
        (qdir / "notes.reason").write_bytes(b"a person's file, not a reason")
        report = spool.recover()
        assert sorted(report.temp_files_removed) == [
            "quarantine/1796663488858562502-22705-0.ready.x.json.reason",
            "quarantine/1796663488858562503-22705-1.ready.y.json.reason"]
        assert (qdir / "notes.reason").exists()


def test_a_quarantined_file_named_like_a_reason_is_listed_shown_and_restored(
        tmp_path: Path) -> None:
    from jobspool.recovery.quarantine import list_quarantined, restore_quarantined

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        (root / "ready" / "notes.reason").write_bytes(b"not a job")
        spool.recover()
        [q] = list_quarantined(spool.journal)
        assert q.name.endswith(".ready.notes.reason") and q.source == "ready/notes.reason"
        with pytest.raises(Exception, match="still not a readable job"):
            restore_quarantined(spool.journal, q.name)
