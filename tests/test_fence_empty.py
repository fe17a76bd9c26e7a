"""An empty `fence` file (what a power loss leaves of a rename whose data was not yet on
disk, on a file system without ordering) after a reboot (a fresh `.lock`): tokens go on
above the clock, as after a deleted `fence`, and above every token handed out. Every
writer crash-looped on "fence file is not JSON" until someone ran `jobspool recover`.
A fence holding something else (an edit) is still refused, never guessed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobspool.errors import SpoolError
from tests.spools import SpoolFactory


def test_an_empty_fence_after_a_reboot_restarts_above_every_token(
        make_spool: SpoolFactory, spool_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = make_spool()
    spool.enqueue_many("k", [1, 2])
    first = spool.claim(limit=1)[0]
    spool.close()
    (spool_root / "fence").write_bytes(b"")
    (spool_root / ".lock").unlink()  # the shared counter gone, as after a reboot
    again = make_spool()
    with caplog.at_level(logging.WARNING):
        second = again.claim(limit=1)[0]
    assert second.token > first.token
    assert "is empty after a restart" in caplog.text
    again.complete(second)
    assert again.fsck().ok


def test_an_empty_fence_is_named_as_empty_by_fsck_and_health(make_spool: SpoolFactory,
                                                            spool_root: Path) -> None:
    spool = make_spool()
    spool.enqueue("k", 1)
    spool.claim(limit=1)
    (spool_root / "fence").write_bytes(b"")
    problems = spool.fsck().problems
    assert any("fence file is empty" in p for p in problems), problems
    reasons = [r.message for r in spool.health().reasons if r.code == "fence_unreadable"]
    assert reasons and "is empty" in reasons[0] and "restart tokens above" in reasons[0]


def test_a_fence_holding_garbage_is_still_refused(make_spool: SpoolFactory,
                                                  spool_root: Path) -> None:
    spool = make_spool()
    spool.enqueue("k", 1)
    spool.close()
    (spool_root / "fence").write_bytes(b"not a fence")
    (spool_root / ".lock").unlink()
    again = make_spool()
    with pytest.raises(SpoolError, match="run `jobspool recover`"):
        again.claim(limit=1)
