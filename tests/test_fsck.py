"""`Spool.fsck()`: a read-only check of every invariant, each problem naming its file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import Spool
from jobspool.errors import CorruptFileWarning
from jobspool.queue.fence import encode_fence
from jobspool.recovery.fsck import FsckReport
from tests.helpers_spool import all_files, read_raw
from tests.spools import make_spool


def _busy_spool(spool: Spool, clock: Any) -> None:
    spool.enqueue_many("k", list(range(6)), job_ids=[f"j{i}" for i in range(6)])
    a, b, _ = spool.claim(limit=3)
    spool.complete(a)
    spool.fail(b, "x", retryable=False)
    spool.cancel("j5")
    spool.prepare("k", job_id="p")


def test_a_healthy_spool_is_ok(spool: Spool, clock: Any) -> None:
    _busy_spool(spool, clock)
    report = spool.fsck()
    assert isinstance(report, FsckReport)
    assert report.ok and report.problems == ()
    assert report.counts == {"prepared": 1, "ready": 2, "leased": 1, "retryable": 0,
                             "completed": 1, "dead_letter": 1, "canceled": 1}
    assert report.jobs == 7
    assert report.fence == report.max_token == 3
    doc = orjson.loads(orjson.dumps(report.to_dict()))
    assert doc["ok"] is True and doc["problems"] == []


def _duplicate(root: Path) -> str:
    (root / "canceled" / "j3.json").write_bytes(
        orjson.dumps({**read_raw(root, "ready", "j3"), "state": "canceled", "revision": 9}))
    return "canceled/j3.json"


def _state_mismatch(root: Path) -> str:
    raw = read_raw(root, "ready", "j3")
    (root / "ready" / "j3.json").write_bytes(orjson.dumps({**raw, "state": "leased"}))
    return "ready/j3.json"


def _name_mismatch(root: Path) -> str:
    (root / "ready" / "j3.json").rename(root / "ready" / "other.json")
    return "ready/other.json"


def _bad_json(root: Path) -> str:
    (root / "completed" / "j0.json").write_bytes(b'{"v": 1,')
    return "completed/j0.json"


def _fence_below(root: Path) -> str:
    (root / "fence").write_bytes(encode_fence(1))
    return "leased/j2.json"


def _fence_garbled(root: Path) -> str:
    (root / "fence").write_bytes(b"seven")
    return "fence"


def _stale_tmp(root: Path) -> str:
    (root / "tmp" / "31337.0.tmp").write_bytes(b"{")
    return "tmp/31337.0.tmp"


def _stray(root: Path) -> str:
    (root / "leased" / "README").write_bytes(b"hello")
    return "leased/README"


BREAKAGES: dict[str, Callable[[Path], str]] = {
    "duplicate": _duplicate, "state_mismatch": _state_mismatch, "name_mismatch": _name_mismatch,
    "bad_json": _bad_json, "fence_below_a_token": _fence_below, "fence_garbled": _fence_garbled,
    "stale_tmp": _stale_tmp, "stray_file": _stray,
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_broken_invariant_is_a_problem_naming_the_file_and_recover_fixes_it(
        spool: Spool, spool_root: Path, clock: Any, breakage: str) -> None:
    _busy_spool(spool, clock)
    culprit = BREAKAGES[breakage](spool_root)

    report = spool.fsck()

    assert not report.ok
    assert len(report.problems) == 1, report.problems
    assert culprit in report.problems[0]
    assert "\n" not in report.problems[0]
    spool.recover()
    assert spool.fsck().ok


def test_fsck_changes_nothing(spool: Spool, spool_root: Path, clock: Any) -> None:
    _busy_spool(spool, clock)
    for breakage in ("duplicate", "bad_json", "fence_below_a_token", "stale_tmp", "stray_file"):
        BREAKAGES[breakage](spool_root)
    before = {p: (spool_root / p).read_bytes() for p in all_files(spool_root) if p != ".lock"}
    report = spool.fsck()
    assert len(report.problems) == 5
    after = {p: (spool_root / p).read_bytes() for p in all_files(spool_root) if p != ".lock"}
    assert after == before


def test_what_recovery_would_do_is_a_note_not_a_problem(spool: Spool, spool_root: Path,
                                                       clock: Any) -> None:
    _busy_spool(spool, clock)
    (spool_root / "ready" / "j4.json").write_bytes(b"")
    spool.recover()  # quarantines it
    clock.advance(10_000)  # the lease expires, the prepared job outlives its grace period
    report = spool.fsck()
    assert report.ok
    assert report.quarantined == 1
    text = " | ".join(report.notes)
    assert "expired lease" in text and "leased/j2.json" in text
    assert "prepared/p.json" in text
    assert "quarantine" in text


def test_a_terminal_directory_over_its_limit_is_noted(tmp_path: Path) -> None:
    s = make_spool(tmp_path / "s", keep_terminal=2)
    try:
        for job in s.enqueue_many("k", [1, 2, 3]):
            s.cancel(job.id)
        report = s.fsck()
        assert report.ok
        assert any("canceled/ holds 3" in n for n in report.notes)
    finally:
        s.close()


@pytest.mark.parametrize(("field", "value", "says"), [
    ("attempts", -5, "attempts is -5 (negative)"),
    ("revision", 0, "revision is 0"),
    ("max_attempts", 0, "max_attempts is 0"),
    ("rescues", -1, "rescues is -1"),
    ("lease", {"token": 0, "owner": "w", "expires_at": 1.0}, "a ready job carries a lease"),
])
def test_values_no_writer_writes_are_problems_naming_the_file(
        spool: Spool, spool_root: Path, field: str, value: Any, says: str) -> None:
    # Found in the robustness pass: a hand-edited `attempts: -5` (six runs past the limit),
    # a revision 0 or a lease on a ready job were all "ok".
    spool.enqueue("k", job_id="j")
    raw = read_raw(spool_root, "ready", "j")
    raw[field] = value
    (spool_root / "ready" / "j.json").write_bytes(orjson.dumps(raw))
    report = spool.fsck()
    assert not report.ok
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(f"ready/j.json: {says}"), report.problems
    # One verdict everywhere: the file is unreadable, as a damaged one is. A negative
    # revision was flagged by fsck but claimed, run, counted healthy and never cleared.
    with pytest.warns(CorruptFileWarning, match=says.split(" (")[0]):
        assert spool.claim() == []
    assert spool.recover().quarantined == ("ready/j.json",)
    assert spool.fsck().ok


def test_fsck_and_stats_say_the_same_fence(tmp_path: Path) -> None:
    # Found by a CLI probe: `stats` said fence 2 and `fsck --json` 1024 on one spool at one
    # moment (fsck, always read-only, reported the ceiling reserved on disk).
    from tests.cli_harness import run_cli

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [1, 2])
        for lease in spool.claim(limit=2):
            spool.complete(lease)
        last = spool.fence_value()
        stats = orjson.loads(run_cli("stats", "--json", root=root).out)
        checked = run_cli("fsck", "--json", root=root)
    assert checked.code == 0, checked.err
    assert stats["fence"] == last
    assert orjson.loads(checked.out)["fence"] == last
