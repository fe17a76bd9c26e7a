"""`init` on a directory with no spool.json: what it takes for a spool of its own (a
half-made one, one whose spool.json was deleted) and what it refuses. A directory holding
only entries named like a spool's (`tmp/`, `ready/`) was taken for one, whatever they held,
and the next `recover` deleted what the user kept in `tmp/` (an operator probe)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.errors import SpoolError
from jobspool.queue.layout import SUBDIRS
from tests.cli_harness import run_cli
from tests.spools import make_spool


def test_a_users_tmp_directory_is_not_taken_for_a_spools(tmp_path: Path) -> None:
    root = tmp_path / "work"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp" / "notes.txt").write_text("important")
    with make_spool(root / "tmp" / "inner") as inner:
        inner.enqueue("note", {}, job_id="precious")
    code, _, err = run_cli("init", root=root)
    assert code == 2 and err.count("\n") == 1
    assert "is not a spool (no spool.json, .lock or fence) and holds tmp/inner" in err
    assert not (root / "spool.json").exists() and not (root / "ready").exists()
    assert (root / "tmp" / "notes.txt").read_text() == "important"
    with make_spool(root / "tmp" / "inner") as inner:
        assert inner.get("precious").state is JobState.READY


def test_a_spool_at_a_state_directorys_name_is_named_not_adopted(tmp_path: Path) -> None:
    root = tmp_path / "work"
    with make_spool(root / "ready") as other:
        other.enqueue("note", {}, job_id="theirs")
    with pytest.raises(SpoolError, match=r"holds ready/ \(a spool of its own\)"):
        make_spool(root)
    assert sorted(p.name for p in root.iterdir()) == ["ready"]
    with make_spool(root / "ready") as other:
        assert other.get("theirs").state is JobState.READY


def test_a_half_made_spool_and_one_that_lost_its_spool_json_are_still_taken(
        tmp_path: Path) -> None:
    half = tmp_path / "half"  # a creation cut short: its directories, nothing else
    for name in SUBDIRS:
        (half / name).mkdir(parents=True, exist_ok=True)
    with make_spool(half) as spool:
        spool.enqueue("note", {}, job_id="a")
    lost = tmp_path / "lost"
    with make_spool(lost) as spool:
        spool.enqueue("note", {}, job_id="kept")
    (lost / "spool.json").unlink()
    with make_spool(lost) as spool:
        assert spool.get("kept").state is JobState.READY
    copied = tmp_path / "copied"  # jobs copied without the control files
    for name in SUBDIRS:
        (copied / name).mkdir(parents=True, exist_ok=True)
    (copied / "ready" / "kept.json").write_bytes((lost / "ready" / "kept.json").read_bytes())
    with make_spool(copied) as spool:
        assert spool.get("kept").state is JobState.READY
