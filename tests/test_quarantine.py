"""Unreadable files go to `quarantine/` with a reason; every valid job still runs.

DESIGN §2 and §6 step 2: bad JSON, a wrong schema, a state field not matching
its directory, a name not matching its id, an empty or truncated file are
moved — never deleted — to `quarantine/`, with a `.reason` file beside each,
logged and counted. One bad file never stops the queue.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.errors import CorruptFileWarning
from jobspool.recovery.quarantine import REASON_SUFFIX, quarantined_files, read_reason
from tests.helpers_spool import assert_disk_consistent, read_raw

Damage = Callable[[Path, str], tuple[str, str]]  # (root, a valid job's id) -> (path, reason part)


def _edit(root: Path, job_id: str, **changes: Any) -> bytes:
    raw = read_raw(root, "ready", job_id)
    raw.update(changes)
    return orjson.dumps(raw)


def truncated(root: Path, job_id: str) -> tuple[str, str]:
    p = root / "ready" / f"{job_id}.json"
    p.write_bytes(p.read_bytes()[:40])
    return f"ready/{job_id}.json", "bad JSON"


def empty(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(b"")
    return f"ready/{job_id}.json", "empty"


def garbled(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(os.urandom(300).replace(b"{", b"x"))
    return f"ready/{job_id}.json", "bad JSON"


def not_an_object(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(b"[1, 2, 3]")
    return f"ready/{job_id}.json", "not a JSON object"


def wrong_schema(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(_edit(root, job_id, attempts="three"))
    return f"ready/{job_id}.json", "attempts"


def state_mismatch(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(_edit(root, job_id, state="completed"))
    return f"ready/{job_id}.json", "does not match directory"


def name_mismatch(root: Path, job_id: str) -> tuple[str, str]:
    p = root / "ready" / f"{job_id}.json"
    p.rename(root / "ready" / "someone-else.json")
    return "ready/someone-else.json", "does not match file name"


def unknown_version(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / f"{job_id}.json").write_bytes(_edit(root, job_id, v=7))
    return f"ready/{job_id}.json", "format version"


def not_json_named(root: Path, job_id: str) -> tuple[str, str]:
    (root / "ready" / "notes.txt").write_bytes(b"an editor's backup")
    return "ready/notes.txt", "not a job file"


def symlink(root: Path, job_id: str) -> tuple[str, str]:
    p = root / "ready" / f"{job_id}.json"
    target = root.parent / "elsewhere.json"
    target.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(target)
    return f"ready/{job_id}.json", "symlink"


DAMAGES: list[Damage] = [truncated, empty, garbled, not_an_object, wrong_schema, state_mismatch,
                         name_mismatch, unknown_version, not_json_named, symlink]


def test_damaged_files_are_quarantined_and_every_valid_job_still_runs(
        spool: Spool, spool_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    jobs = spool.enqueue_many("k", [{"i": i} for i in range(40)])
    victims = [j.id for j in jobs[::4]][: len(DAMAGES)]
    expected: dict[str, str] = {}
    original: dict[str, bytes] = {}
    for damage, job_id in zip(DAMAGES, victims, strict=True):
        path, reason = damage(spool_root, job_id)
        expected[path] = reason
        target = spool_root / path
        original[path] = os.readlink(target).encode() if target.is_symlink() else \
            target.read_bytes()
    # Every victim's file is damaged, except that of not_json_named: it adds a stray file.
    valid = {j.id for j in jobs} - {v for v, d in zip(victims, DAMAGES, strict=True)
                                    if d is not not_json_named}

    # Before recovery: readers skip the bad files, they never crash.
    with pytest.warns(CorruptFileWarning):
        assert {j.id for j in spool.jobs()} >= valid
    with caplog.at_level(logging.WARNING):
        report = spool.recover()

    assert sorted(report.quarantined) == sorted(expected)
    assert len(report.quarantine_names) == len(expected)
    for source, qname in zip(report.quarantined, report.quarantine_names, strict=True):
        reason = read_reason(spool, qname)
        assert reason["source"] == source
        assert expected[source] in str(reason["reason"]), (source, reason)
        moved = spool_root / "quarantine" / qname
        kept = os.readlink(moved).encode() if moved.is_symlink() else moved.read_bytes()
        assert kept == original[source], f"{source} was altered on its way to quarantine"
        assert source in caplog.text
    assert spool.stats().quarantined == len(expected)

    done: set[str] = set()
    while leases := spool.claim(limit=16):
        for lease in leases:
            spool.complete(lease)
            done.add(lease.job_id)
    assert done == valid
    assert assert_disk_consistent(spool_root) == dict.fromkeys(valid, "completed")
    assert spool.fsck().ok
    assert not spool.recover().changed


def test_a_directory_where_a_job_file_belongs_is_quarantined(spool: Spool,
                                                             spool_root: Path) -> None:
    spool.enqueue("k", job_id="ok")
    (spool_root / "ready" / "weird.json").mkdir()
    (spool_root / "ready" / "weird.json" / "inside").write_bytes(b"x")
    report = spool.recover()
    assert report.quarantined == ("ready/weird.json",)
    (qname,) = report.quarantine_names
    assert (spool_root / "quarantine" / qname / "inside").read_bytes() == b"x"
    assert assert_disk_consistent(spool_root) == {"ok": "ready"}


def test_damage_in_every_state_directory_is_found(spool: Spool, spool_root: Path) -> None:
    for state in JobState:
        (spool_root / state.value / f"bad-{state.value}.json").write_bytes(b"{")
    report = spool.recover()
    assert sorted(report.quarantined) == sorted(f"{s.value}/bad-{s.value}.json" for s in JobState)


def test_two_files_of_the_same_name_do_not_collide_in_quarantine(spool: Spool,
                                                                 spool_root: Path) -> None:
    (spool_root / "ready" / "x.json").write_bytes(b"first")
    first = spool.recover()
    (spool_root / "ready" / "x.json").write_bytes(b"second")
    second = spool.recover()
    assert first.quarantine_names != second.quarantine_names
    names = quarantined_files(spool)
    assert len(names) == 2
    contents = sorted((spool_root / "quarantine" / n).read_bytes() for n in names)
    assert contents == [b"first", b"second"]
    assert len([n for n in os.listdir(spool_root / "quarantine")
                if n.endswith(REASON_SUFFIX)]) == 2


def test_a_damaged_stale_copy_is_quarantined_and_the_good_copy_kept(spool: Spool,
                                                                   spool_root: Path) -> None:
    spool.enqueue("k", job_id="j")
    spool.claim()
    (spool_root / "ready" / "j.json").write_bytes(b'{"v": 1, "id": "j", "kind"')  # torn leftover
    report = spool.recover()
    assert report.quarantined == ("ready/j.json",)
    assert report.duplicates_resolved == ()
    assert assert_disk_consistent(spool_root) == {"j": "leased"}


def test_a_file_that_heals_before_the_lock_is_taken_is_left_alone(spool: Spool,
                                                                  spool_root: Path) -> None:
    """The lock-free scan only suspects; the verdict is made under the lock."""
    from jobspool.recovery import recover as recover_mod
    from jobspool.recovery.scan import scan_spool

    spool.enqueue("k", job_id="j")
    good = (spool_root / "ready" / "j.json").read_bytes()
    (spool_root / "ready" / "j.json").write_bytes(b"{")

    def scan_then_heal(s: Spool) -> Any:
        found = scan_spool(s)
        (spool_root / "ready" / "j.json").write_bytes(good)  # a writer replaced it meanwhile
        return found

    original = recover_mod.scan_spool
    recover_mod.scan_spool = scan_then_heal
    try:
        report = spool.recover()
    finally:
        recover_mod.scan_spool = original
    assert report.quarantined == ()
    assert assert_disk_consistent(spool_root) == {"j": "ready"}


def test_a_quarantine_move_the_disk_refuses_leaves_no_orphan_reason_and_says_so_in_a_line(
        spool: Spool, spool_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a bare OSError, and a `.reason` file with no quarantined file beside it,
    invisible to `quarantine list` and never removed."""
    import errno

    from jobspool.errors import WriteFailed
    from jobspool.queue import store as store_mod

    spool.enqueue("k", job_id="good")
    (spool_root / "ready" / "bad.json").write_bytes(b"{not json")

    def refuse(src: Any, dst: Any) -> None:
        if "quarantine" in str(dst):
            raise OSError(errno.EIO, "injected I/O error", str(src))
        os.replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(store_mod, "os_replace", refuse)
        with pytest.raises(WriteFailed) as caught:
            spool.recover()
    assert "\n" not in str(caught.value) and "I/O error" in str(caught.value)
    assert (spool_root / "ready" / "bad.json").exists()  # still where it was
    assert os.listdir(spool_root / "quarantine") == []  # no orphan reason file
    report = spool.recover()  # the disk takes it now
    assert len(quarantined_files(spool)) == 1 and report.changed
    assert not (spool_root / "ready" / "bad.json").exists()
