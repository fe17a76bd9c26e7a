"""A projection commit that never returns (an object store that accepts connections and
never answers: a frozen host, a network dropping packets) held a worker in one LanceDB
call for as long as it lasted, its leases beaten, deaf to SIGTERM. The worker now waits
at most `PROJECTION_CALL_SECONDS`, and not past a stop's grace: the call is left running
in its thread and its jobs go back uncounted. Should the abandoned call land later, its
rows carry the old leases' tokens, which the jobs' next runs outrank."""

from __future__ import annotations

import threading
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
    thread, box = _run_in_thread(worker)
    try:
        assert hung["entered"].wait(60)
        worker.stop()
        thread.join(60)  # a hang guard: the grace is 0.2 s, the commit's deadline 600 s
        assert not thread.is_alive()
    finally:
        hung["release"].set()
    (report,) = box
    assert report.completed == 0 and report.deferred == 1
    got = spool.get(job.id)
    assert got.state.value in ("ready", "retryable") and got.attempts == 0
