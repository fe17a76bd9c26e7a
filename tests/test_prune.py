"""Retention pruning of terminal jobs (DESIGN §3) and its amortized automatic form."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.errors import InvalidJob
from jobspool.queue.job import encode_job, evolve
from jobspool.recovery import prune as prune_mod
from jobspool.recovery.prune import PruneReport
from tests.helpers_spool import FakeClock, assert_disk_consistent, job_files
from tests.spools import make_spool


def _complete_in_order(spool: Spool, clock: Any, ids: list[str]) -> None:
    """Complete the jobs in `ids` order, one second apart (updated_at follows that order)."""
    for job_id in ids:
        spool.enqueue("k", job_id=job_id)
    for job_id in ids:
        lease = _claim_one(spool, job_id)
        clock.advance(1)
        spool.complete(lease)


def _claim_one(spool: Spool, job_id: str) -> Any:
    # Claims go in id order; lease them all and keep the one we want.
    leases = spool.claim(limit=100)
    mine = [le for le in leases if le.job_id == job_id]
    for other in leases:
        if other.job_id != job_id:
            spool.release(other)
    return mine[0]


def test_keeps_the_newest_by_updated_at_not_by_id(spool: Spool, spool_root: Path,
                                                  clock: Any) -> None:
    # Ids in one order, completions in another: "newest" is about updated_at.
    order = ["e", "a", "d", "b", "c"]
    _complete_in_order(spool, clock, order)
    report = spool.prune(keep=2)
    assert sorted(report.completed) == sorted(order[:3])
    assert report.pruned == report.completed
    assert sorted(job_files(spool_root)) == ["b", "c"]
    assert report.kept["completed"] == 2


def test_older_than_alone_removes_old_jobs_however_few(spool: Spool, spool_root: Path,
                                                       clock: Any) -> None:
    _complete_in_order(spool, clock, ["a", "b", "c"])  # updated at t+1, t+2, t+3
    clock.advance(100)
    report = spool.prune(older_than=100.5)
    assert sorted(report.completed) == ["a", "b"]
    assert sorted(job_files(spool_root)) == ["c"]


def test_keep_and_older_than_remove_only_jobs_beyond_the_count_and_old(
        spool: Spool, spool_root: Path, clock: Any) -> None:
    _complete_in_order(spool, clock, ["a", "b", "c", "d"])  # updated at t+1 .. t+4
    clock.advance(100)
    # Old enough: a, b (t+1, t+2). Beyond the newest 1: a, b, c. Both: a, b.
    assert sorted(spool.prune(keep=1, older_than=101.5).completed) == ["a", "b"]
    # Beyond the newest 10: none, however old.
    assert spool.prune(keep=10, older_than=0).completed == ()
    # Beyond the newest 0 but younger than 1000 s: none.
    assert spool.prune(keep=0, older_than=1000).completed == ()
    assert sorted(job_files(spool_root)) == ["c", "d"]


def test_keep_terminal_seconds_keeps_young_results_readable_beyond_keep_terminal(
        spool_root: Path, clock: Any) -> None:
    with make_spool(spool_root, clock=clock, keep_terminal=1,
               keep_terminal_seconds=60) as spool:
        _complete_in_order(spool, clock, ["a", "b", "c"])
        assert spool.prune().completed == ()  # beyond keep_terminal, but young
        clock.advance(60)
        assert sorted(spool.prune().completed) == ["a", "b"]
        assert sorted(job_files(spool_root)) == ["c"]
    with make_spool(spool_root, clock=clock) as reopened:
        assert reopened.keep_terminal_seconds == 60  # saved in spool.json


def test_each_terminal_state_keeps_its_own_newest(spool: Spool, spool_root: Path,
                                                  clock: Any) -> None:
    jobs = spool.enqueue_many("k", list(range(9)), job_ids=[f"j{i}" for i in range(9)],
                              max_attempts=1)
    for job in jobs[:3]:
        clock.advance(1)
        spool.cancel(job.id)
    for _ in range(3):
        clock.advance(1)
        (lease,) = spool.claim()
        spool.fail(lease, "no", retryable=False)
    for _ in range(3):
        clock.advance(1)
        (lease,) = spool.claim()
        spool.complete(lease)
    report = spool.prune(keep=1, keep_dead=1)
    assert report.counts == {"completed": 2, "dead_letter": 2, "canceled": 2, "stale_copies": 0}
    assert assert_disk_consistent(spool_root) == {"j2": "canceled", "j5": "dead_letter",
                                                  "j8": "completed"}


def test_dead_letters_have_their_own_limit(spool: Spool, spool_root: Path, clock: Any) -> None:
    spool.enqueue_many("k", list(range(4)), job_ids=[f"j{i}" for i in range(4)])
    for _ in range(4):
        clock.advance(1)
        (lease,) = spool.claim()
        spool.fail(lease, "no", retryable=False)
    kept_all = prune_mod.prune(spool.journal, keep=0, keep_dead=10)
    assert kept_all.dead_letter == ()
    report = prune_mod.prune(spool.journal, keep=0, keep_dead=1)
    assert sorted(report.dead_letter) == ["j0", "j1", "j2"]
    assert sorted(job_files(spool_root)) == ["j3"]


def test_pruning_removes_every_copy_of_a_job(spool: Spool, spool_root: Path,
                                             clock: Any) -> None:
    spool.enqueue_many("k", [1, 2], job_ids=["a_old", "b_new"])
    (lease,) = spool.claim()
    stale = (spool_root / "leased" / "a_old.json").read_bytes()
    spool.complete(lease)
    (spool_root / "leased" / "a_old.json").write_bytes(stale)  # a crash leftover
    clock.advance(1)
    (lease,) = spool.claim()
    spool.complete(lease)

    report = spool.prune(keep=1)

    assert report.completed == ("a_old",)
    assert report.stale_copies == ("leased/a_old.json",)
    assert "a_old" not in job_files(spool_root)
    assert spool.recover().duplicates_resolved == ()  # nothing left to resurrect it


def test_a_stale_terminal_copy_of_a_live_job_is_not_pruned_as_if_finished(
        spool: Spool, spool_root: Path, clock: Any) -> None:
    job = spool.enqueue("k", job_id="j")
    # A terminal copy older (lower revision) than the job's live one.
    ghost = evolve(job, state=JobState.CANCELED, revision=job.revision - 1,
                   updated_at=clock.now - 100)
    (spool_root / "canceled" / "j.json").write_bytes(encode_job(ghost))
    report = spool.prune(keep=0)
    assert report.pruned == ()
    assert (spool_root / "ready" / "j.json").exists()


def test_invalid_arguments_are_refused(spool: Spool) -> None:
    with pytest.raises(InvalidJob, match="keep"):
        spool.prune(keep=-1)
    with pytest.raises(InvalidJob, match="older_than"):
        spool.prune(older_than=-5)


def test_the_report_serializes(spool: Spool, clock: Any) -> None:
    _complete_in_order(spool, clock, ["a", "b"])
    report = spool.prune(keep=1)
    assert isinstance(report, PruneReport)
    doc = orjson.loads(orjson.dumps(report.to_dict()))
    assert doc["pruned"] == 1
    assert doc["completed"] == ["a"]
    assert doc["canceled"] == doc["dead_letter"] == doc["stale_copies"] == []


def test_recovery_prunes_to_keep_terminal(tmp_path: Path) -> None:
    clock = FakeClock()
    s = make_spool(tmp_path / "s", clock=clock, keep_terminal=3)
    try:
        for job in s.enqueue_many("k", list(range(5))):
            clock.advance(1)
            s.cancel(job.id)
        report = s.recover()
        assert len(report.pruned) == 2
        assert len(os.listdir(tmp_path / "s" / "canceled")) == 3
    finally:
        s.close()


# ---------------------------------------------------------------- amortized automatic pruning


class _Counter:
    def __init__(self) -> None:
        self.reads = 0
        self.listdirs = 0


def test_prune_if_over_costs_three_listings_and_no_read_when_nothing_is_over(
        spool: Spool, clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _complete_in_order(spool, clock, ["a", "b"])
    count = _Counter()
    real_read, real_listdir = spool.store.read, os.listdir

    def read(directory: str, name: str) -> bytes:
        count.reads += 1
        return real_read(directory, name)

    def listdir(path: Any = ".") -> list[str]:
        count.listdirs += 1
        return real_listdir(path)

    monkeypatch.setattr(spool.store, "read", read)
    monkeypatch.setattr(prune_mod.os, "listdir", listdir)
    assert prune_mod.prune_if_over(spool.journal) is None
    monkeypatch.undo()
    assert (count.reads, count.listdirs) == (0, 3)


@pytest.mark.slow
def test_automatic_pruning_is_amortized_over_terminal_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work done by automatic pruning, counted in file reads, per terminal write: bounded by
    a constant, not by the number of terminal jobs kept."""
    keep, jobs = 40, 1500
    s = make_spool(tmp_path / "s", keep_terminal=keep)
    reads = {"inside": 0, "calls": 0, "pruned": 0}
    inside = [False]
    real_read = s.store.read
    real_prune_if_over = prune_mod.prune_if_over

    def read(directory: str, name: str) -> bytes:
        if inside[0]:
            reads["inside"] += 1
        return real_read(directory, name)

    def counted_prune_if_over(spool: Spool, due: Any = None) -> PruneReport | None:
        reads["calls"] += 1
        inside[0] = True
        try:
            report = real_prune_if_over(spool, due)
        finally:
            inside[0] = False
        if report is not None:
            reads["pruned"] += len(report.pruned)
        return report

    monkeypatch.setattr(s.store, "read", read)
    monkeypatch.setattr(prune_mod, "prune_if_over", counted_prune_if_over)
    try:
        s.enqueue_many("k", list(range(jobs)))
        peak = 0
        while leases := s.claim(limit=10):
            s.complete_many([(lease, None) for lease in leases])
            peak = max(peak, len(os.listdir(tmp_path / "s" / "completed")))
    finally:
        s.close()
    assert reads["calls"] >= jobs // (64 + 10)  # it did run, every 64 (+ one batch) writes
    assert reads["pruned"] >= jobs - keep - 64
    # Each pass reads keep + excess files (excess >= 64 by construction) and removes the
    # excess: at most (keep + 64) / 64 + 1 reads per terminal write, here < 3.
    assert reads["inside"] <= 3 * jobs, reads
    assert peak <= keep + 64 + 10  # bounded by the trigger interval (+ one batch)


def test_cli_prune_keep_and_older_than_combine_and_init_saves_keep_terminal_seconds(
        tmp_path: Path, capsys: Any) -> None:
    import json

    from jobspool.cli import main

    root = str(tmp_path / "spool")
    assert main(["--root", root, "init", "--keep-terminal-seconds", "3600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["keep_terminal_seconds"] == 3600
    with make_spool(root) as spool:
        for job_id in ("a", "b", "c"):
            spool.enqueue("k", job_id=job_id)
            spool.complete(_claim_one(spool, job_id))
    # All three finished just now: beyond --keep 1 but not older than an hour.
    assert main(["--root", root, "prune", "--keep", "1", "--older-than", "3600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"] == 0
    assert main(["--root", root, "prune", "--keep", "1", "--older-than", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"] == 2


def test_a_restarted_process_recycles_files_instead_of_creating_new_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In steady state (enqueue, claim, complete, automatic pruning) a job life takes its
    files from the pool; a process opening a warm spool must not start a fresh pruning
    interval and create inodes while the terminal directory grows past it."""
    from jobspool.queue import store as store_mod

    root = tmp_path / "s"

    def life(spool: Spool, n: int) -> None:
        for i in range(n):
            spool.enqueue("k", {"i": i})
            (lease,) = spool.claim(limit=1)
            spool.complete(lease)

    with make_spool(root, keep_terminal=20) as spool:
        life(spool, 300)  # warm: the pool holds what pruning returned
    created: list[str] = []
    real_open = store_mod.os_open

    def counting_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT and str(path).startswith(str(root / "tmp")):
            created.append(str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(store_mod, "os_open", counting_open)
    with make_spool(root, keep_terminal=20) as spool:
        life(spool, 200)
    assert created == []
    assert len(os.listdir(root / "completed")) <= 20 + 64


def _refuse_retiring(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    """Removing (recycling or unlinking) a file whose path ends in `suffix` fails with EIO."""
    import errno

    from jobspool.queue import store as store_mod

    for name in ("os_replace", "os_unlink"):
        real = getattr(store_mod, name)

        def fake(src: Any, *rest: Any, _real: Any = real) -> Any:
            if os.fspath(src).endswith(suffix):
                raise OSError(errno.EIO, "Input/output error", os.fspath(src))
            return _real(src, *rest)

        monkeypatch.setattr(store_mod, name, fake)


def test_a_job_the_disk_would_not_remove_is_not_reported_pruned(
        spool: Spool, spool_root: Path, clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _complete_in_order(spool, clock, ["a", "b", "c"])
    with monkeypatch.context() as m:
        _refuse_retiring(m, "completed/b.json")
        report = spool.prune(keep=0)
    assert report.completed == ("a", "c")
    assert spool.get("b").state is JobState.COMPLETED
    assert spool.prune(keep=0).completed == ("b",)  # a later prune takes it


def test_a_stale_copy_the_disk_would_not_remove_keeps_the_newest_copy_too(
        spool: Spool, spool_root: Path, clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alone, the stale copy (an expired lease of a completed job) would run it again."""
    spool.enqueue("k", job_id="a")
    (lease,) = spool.claim()
    stale = (spool_root / "leased" / "a.json").read_bytes()
    spool.complete(lease)
    (spool_root / "leased" / "a.json").write_bytes(stale)  # a crash leftover
    with monkeypatch.context() as m:
        _refuse_retiring(m, "leased/a.json")
        report = spool.prune(keep=0)
    assert report.completed == ()
    assert (spool_root / "completed" / "a.json").exists()
    clock.advance(3600)  # the stale lease long expired: the job still does not run again
    assert spool.claim() == []
    assert spool.prune(keep=0).completed == ("a",)
    assert "a" not in job_files(spool_root)
