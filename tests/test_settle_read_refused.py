"""A read of a job's own file refused for a moment while a worker settles it.

EMFILE (a process out of descriptors) or EIO on the read of `leased/<id>.json` makes
the store raise `StoreUnavailable`: no verdict on the job. The worker took it as one
and dead-lettered a job whose handler had succeeded ("handler result refused"), and
recorded a handler's failure with a note that its retry delay had been refused. The
result is kept and settled again after the backoff, as after a refused write.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from jobspool import Spool, Worker
from jobspool.queue import store as store_mod
from tests.spools import SpoolFactory


def _refuse_one_leased_read(monkeypatch: pytest.MonkeyPatch, root: Path) -> dict[str, Any]:
    original = store_mod.Store.read
    state: dict[str, Any] = {"armed": False, "hits": 0}

    def read(self: Any, directory: str, name: str) -> Any:
        if state["armed"] and directory == "leased" and state["hits"] < 1:
            state["hits"] += 1
            raise OSError(errno.EMFILE, "Too many open files", f"{root}/{directory}/{name}")
        return original(self, directory, name)

    monkeypatch.setattr(store_mod.Store, "read", read)
    return state


def _run_one(make_spool: SpoolFactory, root: Path, monkeypatch: pytest.MonkeyPatch,
             outcome: Any) -> tuple[Any, Any]:
    """One job, run by a worker whose handler arms the refusal and then returns
    `outcome()` (or raises what it raises); the job afterwards and the run's report."""
    spool: Spool = make_spool()
    job = spool.enqueue("k", {"i": 1})
    state = _refuse_one_leased_read(monkeypatch, root)

    def handler(job: Any, ctx: Any) -> Any:
        state["armed"] = True
        return outcome()

    report = Worker(spool, handlers={"k": handler}, concurrency=1).run_until_idle()
    assert state["hits"] == 1  # the refusal did happen, during the settle
    return spool.get(job.id), report


def test_a_succeeded_job_is_completed_after_its_read_was_refused(
        make_spool: SpoolFactory, spool_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got, report = _run_one(make_spool, spool_root, monkeypatch, lambda: {"answer": 42})
    assert got.state.value == "completed", got.last_error
    assert got.result == {"answer": 42} and got.attempts == 1
    assert report.completed == 1 and report.dead_lettered == 0


def test_a_failed_job_keeps_its_own_error_after_its_read_was_refused(
        make_spool: SpoolFactory, spool_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise RuntimeError("real handler error")

    got, _ = _run_one(make_spool, spool_root, monkeypatch, fail)
    assert got.state.value == "retryable" and got.attempts == 1
    assert got.last_error == "RuntimeError: real handler error"
