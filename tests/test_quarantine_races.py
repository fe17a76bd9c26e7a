"""`quarantine restore` and `quarantine purge` in two processes at once (helper probe,
2026-12-04): about 15 of 400 restores raised a raw FileNotFoundError (the CLI printed a
bare "No such file or directory"), because purge deleted without the spool lock between
a restore's read and its rename. Each file now ends either restored or purged, and a
restore that lost the race says the file is no longer quarantined."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.errors import NotQuarantined
from jobspool.recovery.quarantine import (
    purge_quarantined,
    quarantined_files,
    restore_quarantined,
)
from tests.spools import make_spool

N = 150


def _restorer(root: str, names: list[str], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    restored, lost, other = 0, 0, []
    with make_spool(root) as spool:
        for name in names:
            try:
                restore_quarantined(spool.journal, name)
                restored += 1
            except NotQuarantined:
                lost += 1
            except Exception as exc:  # what the test is about: nothing else may come out
                other.append(f"{type(exc).__name__}: {exc}")
    out.put((restored, lost, other))


def _purger(root: str) -> None:
    with make_spool(root) as spool:
        for _ in range(200):
            if not purge_quarantined(spool.journal) and not quarantined_files(spool.journal):
                break


def test_restore_racing_purge_ends_each_file_restored_or_purged(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{"i": i} for i in range(N)],
                           job_ids=[f"j{i:03d}" for i in range(N)])
        good = {p.stem: p.read_bytes() for p in (root / "ready").glob("*.json")}
        for job_id in good:  # damaged, then quarantined by recovery
            (root / "ready" / f"{job_id}.json").write_bytes(b"{damaged")
        spool.recover()
        names = quarantined_files(spool.journal)
        assert len(names) == N
        for name in names:  # repaired in place, ready to be restored
            job_id = name.rsplit(".", 2)[-2]
            (root / "quarantine" / name).write_bytes(good[job_id])
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    restorer = ctx.Process(target=_restorer, args=(str(root), names, out))
    purger = ctx.Process(target=_purger, args=(str(root),))
    restorer.start()
    purger.start()
    restored, lost, other = out.get(timeout=120)
    restorer.join(120)
    purger.join(120)
    assert other == []
    assert restored + lost == N
    with make_spool(root) as spool:
        assert len(list(spool.jobs())) == restored
        assert all(j.state is JobState.READY for j in spool.jobs())
        assert quarantined_files(spool.journal) == []
        report = spool.fsck()
        assert report.ok, report.problems


def test_purging_everything_keeps_the_reason_of_a_file_quarantined_after_its_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found in a policy probe (a `recover` beside a purge loop): the sweep for orphan
    # reason files, after the purge, removed every `.reason`, unlocked, also those of files
    # quarantined after the purge listed its files: "no reason recorded" for good.
    from jobspool.recovery import quarantine

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        (root / "ready" / "late.json").write_bytes(b"{bad")
        assert len(spool.recover().quarantined) == 1
        (name,) = quarantined_files(spool.journal)
        (root / "quarantine" / "orphan.ready.x.json.reason").write_bytes(b"{}")
        monkeypatch.setattr(quarantine, "quarantined_files", lambda journal: [])
        assert purge_quarantined(spool.journal) == []  # listed before `late` came in
        monkeypatch.undo()
        assert sorted(p.name for p in (root / "quarantine").iterdir()) == [
            name, name + ".reason"]  # the orphan went; late's reason stayed
        (info,) = quarantine.list_quarantined(spool.journal)
        assert "JSON" in info.reason
