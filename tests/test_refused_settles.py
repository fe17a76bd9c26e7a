"""A settle the disk refuses does not throw a finished run away.

Before: a worker whose settle met a `WriteFailed` (a full disk, an operator's
`rm -rf tmp/` under it) released the group: the finished jobs ran a second time,
or (the release refused too) their leases expired and the reclaim charged a
succeeded run an attempt (with `max_attempts=1`: dead-lettered). Five such
failures within a minute, under two seconds on a full disk, ended the worker for
good. Now the results are kept, their leases still extended, and settled once
the disk takes them; a full disk is waited out like a store outage.
"""

from __future__ import annotations

import errno
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool, Worker
from jobspool.errors import WriteFailed
from jobspool.queue import store as store_mod
from tests.spools import make_spool


def _refusing(real: Callable[..., Any], times: int, err: int, root: Path) -> Callable[..., Any]:
    """`complete_many` answering every item with a WriteFailed, `times` times."""
    left = {"n": times}

    def fake(items: Any, *args: Any, **kwargs: Any) -> Any:
        if left["n"] > 0:
            left["n"] -= 1
            exc = WriteFailed(f"cannot write to spool {root}: injected {errno.errorcode[err]}",
                              errno=err)
            return [exc for _ in items]
        return real(items, *args, **kwargs)

    return fake


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_a_refused_settle_keeps_the_results_and_settles_them_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    spool = make_spool(tmp_path / "spool", max_attempts=1)
    try:
        spool.enqueue_many("work", [{"i": i} for i in range(3)])
        runs: Counter[str] = Counter()

        def work(job: Any, ctx: Any) -> dict[str, bool]:
            runs[job.id] += 1
            return {"ok": True}

        monkeypatch.setattr(spool, "complete_many",
                            _refusing(spool.complete_many, 2, err, spool.root))
        report = Worker(spool, handlers={"work": work}, concurrency=3, batch_size=3,
                        lease_seconds=30).run_until_idle()
        assert sorted(runs.values()) == [1, 1, 1]  # none ran twice
        assert {j.state for j in spool.jobs()} == {JobState.COMPLETED}
        assert report.completed == 3 and report.released == 0
    finally:
        spool.close()


def test_a_full_disk_is_waited_out_not_a_reason_to_give_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(tmp_path / "spool", max_attempts=1)
    try:
        spool.enqueue("work", {"i": 1})
        # Six refusals in a row: more than `max_crashes` (5) within the window.
        monkeypatch.setattr(spool, "complete_many",
                            _refusing(spool.complete_many, 6, errno.ENOSPC, spool.root))
        worker = Worker(spool, handlers={"work": lambda job, ctx: 1}, lease_seconds=30,
                        max_crashes=5)
        report = worker.run_until_idle()
        assert report.completed == 1 and report.crashes == 0
        assert [j.state for j in spool.jobs()] == [JobState.COMPLETED]
    finally:
        spool.close()


def _stopped_with_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           refusals: int) -> tuple[Any, JobState, Any]:
    """One job whose handler stops its worker (so its result is settled on the way out)
    while the disk refuses that many settles: the run's report, the job's state, result."""
    spool = make_spool(tmp_path / "spool", max_attempts=1)
    try:
        spool.enqueue("work", {"i": 1}, job_id="j1")
        monkeypatch.setattr(spool, "complete_many",
                            _refusing(spool.complete_many, refusals, errno.ENOSPC, spool.root))
        worker: Worker

        def work(job: Any, ctx: Any) -> int:
            worker.stop()
            return 7

        worker = Worker(spool, handlers={"work": work}, lease_seconds=30)
        report = worker.run_forever(handle_signals=False)
        job = spool.get("j1")
        return report, job.state, job.result
    finally:
        spool.close()


def test_a_settle_refused_on_the_way_out_is_tried_again_not_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report, state, result = _stopped_with_refusals(tmp_path, monkeypatch, 1)
    assert report.completed == 1 and report.released == 0
    assert state is JobState.COMPLETED and result == 7


def test_a_stop_ends_even_while_the_disk_keeps_refusing_the_settle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # run_forever returns: the settle tried again a bounded number of times, then released.
    report, state, _ = _stopped_with_refusals(tmp_path, monkeypatch, 10**6)
    assert report.completed == 0 and report.released == 1
    assert state is JobState.READY


def _removing_tmp_first(real: Callable[..., Any], root: Path) -> Callable[..., Any]:
    """`os.replace`, but `tmp/` is removed (as `rm -rf tmp`) just before the first rename
    that publishes a staged file."""
    armed = {"on": True}
    tmp = str(root / "tmp")

    def fake(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        if armed["on"] and str(src).startswith(tmp) and not str(dst).startswith(tmp):
            armed["on"] = False
            shutil.rmtree(root / "tmp")
        return real(src, dst, *args, **kwargs)

    return fake


@pytest.mark.parametrize("durable", [True, False])
def test_a_settle_survives_tmp_removed_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool) -> None:
    spool: Spool = make_spool(tmp_path / "spool", durable=durable)
    try:
        spool.enqueue("work", {"i": 1}, job_id="j1")
        (lease,) = spool.claim()
        spool.store.pool_size = 0  # a fresh staging file, not a recycled one
        monkeypatch.setattr(store_mod, "os_replace", _removing_tmp_first(store_mod.os_replace,
                                                                         spool.root))
        done = spool.complete(lease, {"ok": 1})
        assert done.state is JobState.COMPLETED
        assert spool.get("j1").result == {"ok": 1}
        assert (spool.root / "tmp").is_dir()
    finally:
        spool.close()


def test_an_enqueue_survives_tmp_removed_between_staging_and_publishing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool: Spool = make_spool(tmp_path / "spool")
    try:
        monkeypatch.setattr(store_mod, "os_replace", _removing_tmp_first(store_mod.os_replace,
                                                                          spool.root))
        jobs = spool.enqueue_many("work", [{"i": i} for i in range(3)],
                                  job_ids=["a", "b", "c"])
        assert [j.id for j in jobs] == ["a", "b", "c"]
        assert [spool.get(i).payload for i in "abc"] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert {j.state for j in spool.jobs()} == {JobState.READY}
    finally:
        spool.close()


def test_a_worker_keeps_running_while_tmp_is_removed_again_and_again(tmp_path: Path) -> None:
    """The operator slip as it happened: `rm -rf tmp` in a loop under a live worker (every
    20 ms here, while it drains 300 jobs)."""
    spool = make_spool(tmp_path / "spool", max_attempts=1)
    try:
        spool.enqueue_many("work", [{"i": i} for i in range(300)])
        runs: Counter[str] = Counter()

        def work(job: Any, ctx: Any) -> int:
            runs[job.id] += 1
            return 1

        stop = threading.Event()

        def remover() -> None:
            while not stop.is_set():
                shutil.rmtree(spool.root / "tmp", ignore_errors=True)
                stop.wait(0.02)

        thread = threading.Thread(target=remover, daemon=True)
        thread.start()
        try:
            Worker(spool, handlers={"work": work}, concurrency=4, batch_size=8,
                   lease_seconds=30).run_until_idle()
        finally:
            stop.set()
            thread.join()
        assert max(runs.values()) == 1 and len(runs) == 300
        assert {j.state for j in spool.jobs()} == {JobState.COMPLETED}
    finally:
        spool.close()
