"""Issue 10 item 4, audited: whatever a handler raises is its job's failure, never the worker's.

Found in the audit: an exception whose `__str__` itself raises (a library's
error class with a broken message, a proxy object) made the settle step fail
while formatting the stored error: "worker loop failed (RuntimeError: ...);
restarting", the batch given back, again on every claim, until the run ended
with `WorkerCrashed` after 5 failures and the healthy jobs queued behind it
never ran. A `Fail` or `Retry` carrying such an object did the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobspool import Fail, JobState, Worker
from tests.helpers_spool import FakeClock
from tests.spools import make_spool


class Mute(Exception):
    """An exception that cannot describe itself."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class MuteReason:
    def __str__(self) -> str:
        raise RuntimeError("no reason either")


def test_a_handler_exception_whose_str_raises_fails_only_its_job(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool", clock=FakeClock(), max_attempts=2,
                    retry_base_seconds=0.0, retry_max_seconds=0.0) as spool:
        spool.enqueue("mute", job_id="a-mute", priority=-1)
        spool.enqueue("mute_fail", job_id="a-mute-fail", priority=-1)
        ok = [spool.enqueue("ok", {"i": i}).id for i in range(5)]

        def mute(job: Any, ctx: Any) -> None:
            raise Mute

        def mute_fail(job: Any, ctx: Any) -> None:
            raise Fail(MuteReason())  # type: ignore[arg-type]

        handlers = {"mute": mute, "mute_fail": mute_fail, "ok": lambda job, ctx: {"ok": 1}}
        report = Worker(spool, handlers, concurrency=2, batch_size=10).run_until_idle(
            wait_for_retries=5)
        assert report.crashes == 0, report
        assert report.completed == 5
        assert {j.id for j in spool.jobs(state="completed")} == set(ok)
        failed = spool.get("a-mute")
        assert failed.state is JobState.DEAD_LETTER and failed.attempts == 2
        assert failed.last_error is not None and failed.last_error.startswith("Mute")
        assert spool.get("a-mute-fail").state is JobState.DEAD_LETTER


class ExitingStr(Exception):
    def __str__(self) -> str:
        raise SystemExit(9)


class InterruptingStr(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


def test_an_exception_whose_str_raises_systemexit_or_keyboardinterrupt_fails_only_its_job(
        tmp_path: Path) -> None:
    """Only a real signal stops the worker: a __str__ raising SystemExit stopped the run,
    the job back to ready with its attempt counted, on every run until it ran out."""
    with make_spool(tmp_path / "spool", clock=FakeClock(), max_attempts=1) as spool:
        spool.enqueue("exits", job_id="a-exits", priority=-1)
        spool.enqueue("interrupts", job_id="a-interrupts", priority=-1)
        ok = [spool.enqueue("ok", {"i": i}).id for i in range(3)]

        def exits(job: Any, ctx: Any) -> None:
            raise ExitingStr

        def interrupts(job: Any, ctx: Any) -> None:
            raise InterruptingStr

        handlers = {"exits": exits, "interrupts": interrupts, "ok": lambda job, ctx: 1}
        report = Worker(spool, handlers, concurrency=2, batch_size=10).run_until_idle()
        assert report.crashes == 0 and report.completed == 3, report
        assert {j.id for j in spool.jobs(state="completed")} == set(ok)
        for job_id, name in (("a-exits", "ExitingStr"), ("a-interrupts", "InterruptingStr")):
            job = spool.get(job_id)
            assert job.state is JobState.DEAD_LETTER, job
            assert job.last_error == f"{name}: <{name}: str() failed>"


def test_an_exception_without_a_message_is_stored_as_its_type_alone(tmp_path: Path) -> None:
    # A bare `raise KeyboardInterrupt` was stored as "KeyboardInterrupt: ".
    with make_spool(tmp_path / "spool", clock=FakeClock(), max_attempts=1) as spool:
        bare = spool.enqueue("bare").id
        said = spool.enqueue("said").id

        def raise_bare(job: Any, ctx: Any) -> None:
            raise KeyboardInterrupt

        def raise_said(job: Any, ctx: Any) -> None:
            raise ValueError("bad input")

        Worker(spool, {"bare": raise_bare, "said": raise_said},
               maintenance=False).run_until_idle()
        assert spool.get(bare).last_error == "KeyboardInterrupt"
        assert spool.get(said).last_error == "ValueError: bad input"
