"""A projection commit that never returns (an object store that accepts connections and
never answers: a frozen host, a network dropping packets) held a worker in one LanceDB
call for as long as it lasted, its leases beaten, deaf to SIGTERM. The worker now waits
at most `PROJECTION_CALL_SECONDS`, and not past a stop's grace: the call is left running
in its thread and its jobs go back uncounted. Should the abandoned call land later, its
rows carry the old leases' tokens, which the jobs' next runs outrank."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobspool import LanceProjection, Worker
from jobspool.queue import settle
from jobspool.queue.sink import LanceSink
from tests.spools import SpoolFactory

LAST_TOKEN: dict[str, int] = {}


def _handler(job: Any, ctx: Any) -> None:
    LAST_TOKEN[job.payload["key"]] = ctx.token
    ctx.upsert("notes", {"id": job.payload["key"], "text": f"run {ctx.token}"})


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> dict[str, threading.Event]:
    """The first commit blocks until `release` is set (then lands); later ones pass."""
    original = LanceSink.apply
    events = {"entered": threading.Event(), "release": threading.Event()}
    first = [True]

    def apply(self: LanceSink, writes: Any) -> Any:
        if first[0]:
            first[0] = False
            events["entered"].set()
            events["release"].wait(120)
        return original(self, writes)

    monkeypatch.setattr(LanceSink, "apply", apply)
    return events


def _run_in_thread(worker: Worker) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(worker.run_until_idle()), daemon=True)
    t.start()
    return t, box


def _stop_during_hung_commit(worker: Worker, state: dict[str, Any],
                             settle_first: float = 0.0) -> Any:
    """Run `worker`, stop it once a commit hangs (after `settle_first` s, for more runs to
    finish behind it), and return its report; the hung commits are released after."""
    thread, box = _run_in_thread(worker)
    try:
        assert state["entered"].wait(60)
        time.sleep(settle_first)
        worker.stop()
        thread.join(60)  # a hang guard: the grace is a fraction of a second, commits 600 s
        assert not thread.is_alive()
    finally:
        state["release"].set()
    (report,) = box
    return report


def test_a_commit_past_its_deadline_gives_its_jobs_back_and_the_next_run_wins(
        make_spool: SpoolFactory, spool_root: Path, hung: dict[str, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settle, "PROJECTION_CALL_SECONDS", 0.5, raising=False)
    spool = make_spool()
    jobs = [spool.enqueue("note", {"key": f"k{i}"}) for i in range(3)]
    index = spool_root / "index"
    worker = Worker(spool, handlers={"note": _handler}, projection=str(index))
    thread, box = _run_in_thread(worker)
    thread.join(60)  # a hang guard: the run ends once the commit is given up
    assert not thread.is_alive()
    (report,) = box
    assert report.completed == 0 and report.deferred == 3 and report.dead_lettered == 0
    for job in jobs:
        got = spool.get(job.id)
        assert got.state.value in ("ready", "retryable") and got.attempts == 0
    hung["release"].set()  # the abandoned call lands now, under the old tokens
    first_tokens = dict(LAST_TOKEN)
    again = Worker(spool, handlers={"note": _handler}, projection=str(index)
                   ).run_until_idle(wait_for_retries=120)
    assert again.completed == 3
    table = LanceProjection(str(index), "notes")
    for i, job in enumerate(jobs):
        assert spool.get(job.id).state.value == "completed"
        key = f"k{i}"
        assert LAST_TOKEN[key] > first_tokens[key]
        row = table.get(key)
        assert row is not None and row["text"] == f"run {LAST_TOKEN[key]}"  # the newer run


def test_a_stop_past_its_grace_does_not_wait_for_a_hung_commit(
        make_spool: SpoolFactory, spool_root: Path, hung: dict[str, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settle, "PROJECTION_CALL_SECONDS", 600.0, raising=False)
    spool = make_spool()
    job = spool.enqueue("note", {"key": "k"})
    worker = Worker(spool, handlers={"note": _handler}, projection=str(spool_root / "index"),
                    grace_seconds=0.2)
    report = _stop_during_hung_commit(worker, hung)
    assert report.completed == 0 and report.deferred == 1
    got = spool.get(job.id)
    assert got.state.value in ("ready", "retryable") and got.attempts == 0


@pytest.fixture
def all_hung(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every commit blocks until `release` is set."""
    original = LanceSink.apply
    state: dict[str, Any] = {"entered": threading.Event(), "release": threading.Event(),
                             "calls": 0}

    def apply(self: LanceSink, writes: Any) -> Any:
        state["calls"] += 1
        state["entered"].set()
        state["release"].wait(120)
        return original(self, writes)

    monkeypatch.setattr(LanceSink, "apply", apply)
    return state


def test_after_the_grace_no_later_commit_is_waited_for(
        make_spool: SpoolFactory, spool_root: Path, all_hung: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs that finish while the first commit hangs start a second commit: begun after the
    cut, it waited its whole deadline (300 s past the grace)."""
    monkeypatch.setattr(settle, "PROJECTION_CALL_SECONDS", 600.0, raising=False)
    spool = make_spool()
    spool.enqueue_many("note", [{"key": f"k{i}"} for i in range(40)])

    def staggered(job: Any, ctx: Any) -> None:  # runs end one after another
        time.sleep(0.05 * (int(job.payload["key"][1:]) % 8))
        _handler(job, ctx)

    worker = Worker(spool, handlers={"note": staggered}, projection=str(spool_root / "index"),
                    concurrency=8, batch_size=2, grace_seconds=0.3)
    report = _stop_during_hung_commit(worker, all_hung, settle_first=0.2)
    assert report.completed == 0
    assert spool.stats().counts["completed"] == 0 and spool.stats().counts["leased"] == 0


def test_a_script_whose_commit_hangs_still_exits(tmp_path: Path) -> None:
    """The abandoned call runs in a daemon thread: in an anyio worker thread it held the
    interpreter's exit (which joins those) for as long as the call lasted."""
    import subprocess
    import sys

    code = f"""
import threading, time
from jobspool import Spool, Worker
from jobspool.queue.sink import LanceSink
entered = threading.Event()
def apply(self, writes):
    entered.set()
    time.sleep(600)
LanceSink.apply = apply
spool = Spool({str(tmp_path / 's')!r}, durable=False)
spool.enqueue("note", {{"key": "k"}})
def handler(job, ctx):
    ctx.upsert("notes", {{"id": "k", "text": "x"}})
w = Worker(spool, handlers={{"note": handler}}, projection={str(tmp_path / 'index')!r},
           grace_seconds=0.2)
threading.Thread(target=lambda: (entered.wait(60), w.stop()), daemon=True).start()
print(w.run_until_idle().deferred, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)  # a hang guard; the call sleeps 600 s
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_a_commit_landing_after_its_run_ended_starts_no_maintenance(
        make_spool: SpoolFactory, spool_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An abandoned commit that lands after the worker closed its sink started a
    maintenance thread nothing closed, compacting beside the next run."""
    from jobspool.projection.lance import ProjectionStore
    from jobspool.queue.sink import LanceSink as Sink

    spool = make_spool()
    sink = Sink(str(spool_root / "index"), default_uri=spool_root / "index", keys={},
                storage_options=None)
    original = ProjectionStore.apply

    def apply(self: Any, writes: Any) -> Any:
        sink.close()  # the run ends while the commit is on its way
        return original(self, writes)

    monkeypatch.setattr(ProjectionStore, "apply", apply)
    spool.enqueue("note", {"key": "k"})
    (lease,) = spool.claim()
    from jobspool.projection.handler import make_upsert

    before = {t.ident for t in threading.enumerate()}
    sink.apply([make_upsert(lease.job_id, "notes", {"id": "k", "text": "x"},
                            version=lease.token, fence=lease.token)])
    assert LanceProjection(str(spool_root / "index"), "notes").get("k") is not None
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not [n for n in started if "maintenance" in n], started
