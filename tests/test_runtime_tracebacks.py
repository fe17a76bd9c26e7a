"""A failing run keeps its traceback (DESIGN §9), and whatever a handler raises is its job's
failure — SystemExit and KeyboardInterrupt included (issue 10, item 4).

The traceback is stored on the job (bounded), printed by `jobspool show`, and
logged at WARNING with the job id, kind and token.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import Context, Job, JobState, Policy, Spool, Worker
from jobspool.queue.job import MAX_TRACEBACK_BYTES, decode_job, encode_job
from jobspool.queue.jobsize import clip_traceback
from tests.cli_harness import run_jobspool
from tests.helpers_spool import FakeClock
from tests.spools import make_spool


def _nested_failure(depth: int) -> None:
    if depth == 0:
        raise ValueError("the innermost frame says no")
    _nested_failure(depth - 1)


def test_a_raising_handler_stores_its_traceback_on_the_job(spool: Spool) -> None:
    def handler(job: Job, ctx: Context) -> None:
        _nested_failure(2)

    job = spool.enqueue("t")
    Worker(spool, {"t": handler}, maintenance=False).run_until_idle()
    failed = spool.get(job.id)
    assert failed.state is JobState.RETRYABLE
    assert failed.last_error == "ValueError: the innermost frame says no"
    tb = failed.traceback or ""
    assert tb.startswith("Traceback (most recent call last):")
    assert "_nested_failure" in tb and "in handler" in tb
    # From the handler's frame down: the worker's and anyio's frames above it are noise.
    assert "invoke.py" not in tb and "anyio" not in tb
    assert tb.rstrip().endswith("ValueError: the innermost frame says no")


def test_the_traceback_is_logged_at_warning_with_job_id_kind_and_token(
        spool: Spool, caplog: pytest.LogCaptureFixture) -> None:
    def handler(job: Job, ctx: Context) -> None:
        _nested_failure(0)

    job = spool.enqueue("t")
    caplog.set_level(logging.WARNING, logger="jobspool")
    Worker(spool, {"t": handler}, maintenance=False).run_until_idle()
    (record,) = [r for r in caplog.records if "failed:" in str(r.msg)]
    assert record.levelno == logging.WARNING
    assert record.__dict__["job_id"] == job.id
    assert record.__dict__["kind"] == "t"
    assert record.__dict__["token"] == 1
    text = record.getMessage()
    assert "Traceback (most recent call last):" in text and "_nested_failure" in text


def _raise_a_long_message() -> None:
    raise ValueError("many\nlines\n" * 5000 + "the end")


def test_a_huge_traceback_keeps_its_frames_and_its_end_within_the_bound(spool: Spool) -> None:
    # Only the end was kept: a long message took all 8 KiB and no frame said where it
    # was raised.
    def handler(job: Job, ctx: Context) -> None:
        _raise_a_long_message()

    job = spool.enqueue("t")
    Worker(spool, {"t": handler}, maintenance=False).run_until_idle()
    failed = spool.get(job.id)
    tb = failed.traceback or ""
    assert len(orjson.dumps(tb)) <= MAX_TRACEBACK_BYTES
    # 8 KiB, as the README says: the cut kept about 4 KiB of it
    assert len(orjson.dumps(tb)) > MAX_TRACEBACK_BYTES * 0.9
    head, _, tail = tb.partition(" characters cut) ...")
    assert head.startswith("Traceback (most recent call last):")
    assert "in _raise_a_long_message" in head and "in handler" in head
    assert tail.rstrip().endswith("the end")
    assert len(failed.last_error or "") <= 1024


def test_clip_traceback_measures_json_escapes_not_characters() -> None:
    quoted = '"\n' * 10_000  # every character doubles when escaped
    out = clip_traceback(quoted) or ""
    assert MAX_TRACEBACK_BYTES * 0.9 < len(orjson.dumps(out)) <= MAX_TRACEBACK_BYTES
    nul = clip_traceback("\x00" * 9000) or ""  # six bytes each, escaped
    assert MAX_TRACEBACK_BYTES * 0.9 < len(orjson.dumps(nul)) <= MAX_TRACEBACK_BYTES
    assert clip_traceback(None) is None
    assert clip_traceback("short") == "short"


def test_the_traceback_round_trips_through_the_job_codec(spool: Spool) -> None:
    job = spool.enqueue("t")
    (lease,) = spool.claim()
    from jobspool.queue.machine import Failure

    failed = spool.fail(lease, Failure(error="E: x", traceback="Traceback ...\nE: x\n"))
    assert failed.traceback == "Traceback ...\nE: x\n"
    assert decode_job(encode_job(failed)) == failed
    assert spool.get(job.id).traceback == "Traceback ...\nE: x\n"
    raw = orjson.loads(encode_job(failed))
    raw["traceback"] = 12
    from jobspool.queue.job import CorruptJob

    with pytest.raises(CorruptJob, match="traceback"):
        decode_job(orjson.dumps(raw))


def test_a_plain_spool_fail_keeps_no_traceback_and_a_job_without_one_has_no_key(
        spool: Spool) -> None:
    spool.enqueue("t")
    (lease,) = spool.claim()
    failed = spool.fail(lease, "plain message")
    assert failed.traceback is None
    assert "traceback" not in failed.to_dict()


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_handler_raising_a_base_exception_fails_its_job_and_the_worker_goes_on(
        spool: Spool, clock: FakeClock, exc: BaseException, flavor: str) -> None:
    def sync_handler(job: Job, ctx: Context) -> str:
        if job.payload == "bad":
            raise exc
        return "ok"

    async def async_handler(job: Job, ctx: Context) -> str:
        return sync_handler(job, ctx)

    handler = sync_handler if flavor == "sync" else async_handler
    bad = spool.enqueue("t", "bad", max_attempts=2)
    good = spool.enqueue("t", "good")
    worker = Worker(spool, {"t": handler}, maintenance=False,
                    policies={"t": Policy(retry_base_seconds=0.01, retry_max_seconds=0.01)})
    first = worker.run_until_idle()
    assert first.completed == 1 and first.retried == 1
    assert spool.get(good.id).state is JobState.COMPLETED
    after_one = spool.get(bad.id)
    assert after_one.state is JobState.RETRYABLE and after_one.attempts == 1
    assert type(exc).__name__ in (after_one.last_error or "")
    assert type(exc).__name__ in (after_one.traceback or "")
    clock.advance(1.0)  # the retry is due
    worker.run_until_idle()
    dead = spool.get(bad.id)
    assert dead.state is JobState.DEAD_LETTER and dead.attempts == 2


def test_jobspool_show_prints_the_traceback_and_the_worker_log_has_it(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        job = spool.enqueue("boom", {})
    run = run_jobspool("--root", root, "run-until-idle", "--app", "tests.apps.runtime:app",
               "--no-maintenance")
    assert run.returncode == 0, run.stderr
    # The log line: WARNING, the job id, kind, token, then the traceback.
    assert "WARNING" in run.stderr and job.id in run.stderr and "token 1" in run.stderr
    assert "_inner_helper_that_raises" in run.stderr
    shown = run_jobspool("--root", root, "show", job.id)
    assert shown.returncode == 0, shown.stderr
    assert "traceback:" in shown.stdout
    assert "Traceback (most recent call last):" in shown.stdout
    assert "_inner_helper_that_raises" in shown.stdout
    assert "ValueError: bad value 42" in shown.stdout
    as_json: dict[str, Any] = orjson.loads(run_jobspool("--root", root, "show", job.id, "--json").stdout)
    assert "_inner_helper_that_raises" in as_json["traceback"]
    assert as_json["state"] == "dead_letter"  # the kind's policy: max_attempts=1


def test_handlers_calling_sys_exit_or_raising_keyboardinterrupt_do_not_stop_run_until_idle(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        exiting = spool.enqueue("exits", "exit").id
        interrupting = spool.enqueue("exits", "interrupt").id
        after = spool.enqueue("quick", {}).id
    run = run_jobspool("--root", root, "run-until-idle", "--app", "tests.apps.runtime:app", "--json",
               "--no-maintenance", "--wait-retries", "5")
    assert run.returncode == 0, run.stderr  # not the handler's exit code
    report = orjson.loads(run.stdout)
    assert report["dead_lettered"] == 2 and report["completed"] == 1
    with make_spool(root) as spool:
        for job_id, name in ((exiting, "SystemExit: 3"), (interrupting, "KeyboardInterrupt")):
            job = spool.get(job_id)
            # Counted and dead-lettered when exhausted: no loop of releases with attempts 0.
            assert (job.state, job.attempts) == (JobState.DEAD_LETTER, 2)
            assert name in (job.last_error or "")
        assert spool.get(after).state is JobState.COMPLETED
    assert "ExceptionGroup" not in run.stderr


def test_a_huge_exception_message_makes_a_bounded_log_line(
        spool: Spool, caplog: pytest.LogCaptureFixture) -> None:
    # Found in a producers pass: stored errors and tracebacks were cut, the log line was
    # not (a 50 kB message, a 50 kB line).
    def handler(job: Job, ctx: Context) -> None:
        raise ValueError("v" * 50_000)

    spool.enqueue("k", max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="jobspool"):
        Worker(spool, {"k": handler}, maintenance=False).run_until_idle()
    lines = [r.getMessage() for r in caplog.records]
    assert any("failed: ValueError" in m for m in lines)
    assert max(len(m) for m in lines) < 2 * MAX_TRACEBACK_BYTES + 2048
