"""The spool directory itself: what opening it creates, checks and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool.errors import SpoolError
from tests.spools import make_spool


def test_opening_a_non_empty_directory_that_is_not_a_spool_is_refused_untouched(
        tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.raises(SpoolError, match="not empty and is not a spool") as info:
        make_spool(tmp_path)
    assert "notes.txt" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_half_created_spool_is_completed_not_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "ready").mkdir()
    (root / ".lock").write_bytes(b"")
    with make_spool(root) as spool:
        assert spool.enqueue("note").state.value == "ready"
    assert (root / "spool.json").is_file()


def test_settings_given_at_creation_are_the_defaults_of_later_openers(tmp_path: Path) -> None:
    root = tmp_path / "s"
    make_spool(root, lease_seconds=12.5, max_attempts=3).close()
    with make_spool(root) as again:
        assert again.lease_seconds == 12.5
        assert again.max_attempts == 3
    with make_spool(root, max_attempts=7) as override:
        assert override.max_attempts == 7


def test_create_false_on_a_missing_spool_names_it(tmp_path: Path) -> None:
    with pytest.raises(SpoolError, match="does not exist"):
        make_spool(tmp_path / "nope", create=False)
    assert not (tmp_path / "nope").exists()
