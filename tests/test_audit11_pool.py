"""Audit of issue 11's process pool: jobs that kill their worker process.

A child that dies while running a job booted fine: its death is that job's
(a rescue, bounded by the kind's `Policy`), never a reason for the
supervisor to give up as it does when children cannot start. Real OS
processes; guards only bound hangs.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import orjson
import pytest

from jobspool import Job, JobState
from tests.cli_harness import reap, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

GUARD = 180.0


def test_jobs_that_keep_killing_their_worker_process_are_dead_lettered_by_their_kinds_policy(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    pidfile = tmp_path / "pids"
    with make_spool(root) as spool:
        # Three poison jobs with two attempts each: six children die right after they
        # start, more than the five a pool allows children that cannot boot at all.
        poisoned = [j.id for j in spool.enqueue_many(
            "poison", [{"pidfile": str(pidfile), "n": i} for i in range(3)])]
    proc = start_jobspool(
        "worker", "--app", "tests.apps.audit11:app", "--json", "--no-maintenance",
        "--processes", "1", "--concurrency", "1", "--batch-size", "1", root=root)

    def states() -> list[JobState]:
        with make_spool(root) as spool:
            return [spool.get(i).state for i in poisoned]

    def completed(job_id: str) -> bool:
        with make_spool(root) as spool:
            return spool.get(job_id).state is JobState.COMPLETED

    try:
        wait_until(lambda: all(s is JobState.DEAD_LETTER for s in states()), GUARD,
                   "the poison jobs to be dead-lettered", proc=proc)
        # The pool still serves.
        with make_spool(root) as spool:
            late = spool.enqueue("quick", {}).id
        wait_until(lambda: completed(late), GUARD, "the pool to serve a later job", proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    report = orjson.loads(out)
    assert report["rescued"] == 6 and report["restarts"] >= 6
    with make_spool(root) as spool:
        for job_id in poisoned:
            job = spool.get(job_id)
            # The kind's Policy(max_attempts=2), not the job's default of 5.
            assert (job.attempts, job.rescues) == (2, 2), job
            assert "worker process died (signal SIGKILL)" in (job.last_error or "")
    assert len(pidfile.read_text().split()) == 6


def test_a_handler_holding_the_interpreter_past_its_limit_is_killed_and_failed_by_its_policy(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        at_once = spool.enqueue("gil", {}).id
        retried = spool.enqueue("gil_retried", {}).id
        quick = [j.id for j in spool.enqueue_many("quick", [{} for _ in range(4)])]
    proc = start_jobspool(
        "worker", "--app", "tests.apps.audit11:app", "--json", "--no-maintenance",
        "--processes", "2", "--grace", "1",
        "--concurrency", "1", root=root)  # one run per child: no collateral rescues

    def settled() -> list[Job]:  # empty (falsy) until they are
        with make_spool(root) as spool:
            jobs = [spool.get(i) for i in (at_once, retried, *quick)]
        if jobs[0].state is JobState.DEAD_LETTER and jobs[1].state is JobState.DEAD_LETTER \
                and all(j.state is JobState.COMPLETED for j in jobs[2:]):
            return jobs
        return []

    try:
        jobs = wait_until(settled, GUARD, "the two GIL holders dead-lettered, the rest completed",
                          proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    log = err.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert "did not exit" in log  # killed by the supervisor, not exited on its own
    first, second = jobs[0], jobs[1]
    # The same words as a run the child could fail itself: "TimeLimitExceeded: ...".
    assert (first.last_error or "").startswith("TimeLimitExceeded: job ")
    assert "its worker process was killed" in (first.last_error or "")
    assert first.attempts == 1  # its retry_on does not list TimeLimitExceeded
    assert (second.last_error or "").startswith("TimeLimitExceeded: ")
    assert second.attempts == 2 and second.rescues == 0  # retried once, then out of attempts
    report = orjson.loads(out)
    assert report["killed_hung"] == 3
    # The supervisor's settles are in the summary: three timed-out runs, two dead letters.
    assert (report["timed_out"], report["retried"], report["dead_lettered"]) == (3, 1, 2), (
        report, log[-5000:])


def test_a_dead_childs_jobs_are_settled_while_a_frozen_child_holds_the_spool_lock(
        tmp_path: Path) -> None:
    # One child freezes the interpreter inside ctx.fenced() (the spool's lock held); the
    # other then dies. Settling the dead one's job waits for that lock: the supervisor must
    # go on supervising meanwhile, kill the frozen child, and so free the lock.
    root = tmp_path / "spool"
    marks = {"started": str(tmp_path / "started"), "frozen": str(tmp_path / "frozen")}
    with make_spool(root) as spool:
        dies = spool.enqueue("poison_waits", marks, priority=10).id
        frozen = spool.enqueue("gil_fenced", marks).id
    proc = start_jobspool(
        "worker", "--app", "tests.apps.audit11:app", "--json", "--no-maintenance",
        "--processes", "2", "--grace", "1", "--concurrency", "1", "--batch-size", "1",
        root=root)
    late: list[str] = []

    def served_after_both() -> bool:
        with make_spool(root) as spool:
            done = all(spool.get(i).state is JobState.DEAD_LETTER for i in (dies, frozen))
            if done and not late:
                late.append(spool.enqueue("quick", {}).id)  # and the pool still serves
            return bool(late) and spool.get(late[0]).state is JobState.COMPLETED

    try:
        wait_until(served_after_both, GUARD, "the pool to get past the frozen child", proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    with make_spool(root) as spool:
        assert "worker process died (signal SIGKILL)" in (spool.get(dies).last_error or "")
        assert (spool.get(frozen).last_error or "").startswith("TimeLimitExceeded: ")
    report = orjson.loads(out)
    assert report["rescued"] == 1 and report["killed_hung"] == 1


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_handlers_that_print_a_lot_run_to_the_end_and_their_output_is_passed_on(
        tmp_path: Path, as_json: bool, unbuffered: bool) -> None:
    """What handlers print reaches the pool's stdout, as an in-process worker's would; with
    `--json` it goes to stderr instead, so that stdout holds one JSON document. Lines stay
    whole under PYTHONUNBUFFERED too (CI sets it), where print() is two writes."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        ids = [j.id for j in spool.enqueue_many("chatty", [{"n": n} for n in range(5)])]
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    flags = ["--json"] if as_json else []
    with stdout.open("wb") as out, stderr.open("wb") as err_sink:  # read as they come
        proc = start_jobspool("worker", "--app", "tests.apps.audit11:app", *flags,
                              "--no-maintenance", "--processes", "2", root=root, stdout=out,
                              stderr=err_sink,
                              env={"PYTHONUNBUFFERED": "1" if unbuffered else None})

    def all_completed() -> bool:
        with make_spool(root) as spool:
            return all(spool.get(i).state is JobState.COMPLETED for i in ids)

    try:
        # Before the fix the children froze on a full stdout pipe: jobs stayed leased.
        wait_until(all_completed, GUARD, "every chatty job to complete (not frozen printing)",
                   proc=proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=GUARD)
    finally:
        reap(proc)
    err = stderr.read_text()
    assert proc.returncode == 0, err[-3000:]
    printed = err if as_json else stdout.read_text()
    for n in range(5):
        assert f"\n{n}:1999 " in printed  # every line of every job, passed on
    assert printed.count("x" * 96) == 5 * 2000
    whole = re.compile(r"^[0-4]:\d+ x{96}$", re.MULTILINE)
    assert len(whole.findall(printed)) == 5 * 2000  # no line cut by another child's
    if as_json:
        summary = orjson.loads(stdout.read_text())  # nothing else on stdout
        assert summary["completed"] == 5 and summary["processes"] == 2
        assert "x" * 96 not in stdout.read_text()
    else:
        assert "worker pool stopped" in stdout.read_text()
        assert '"claimed"' not in printed  # a child's own report is summed, not printed
