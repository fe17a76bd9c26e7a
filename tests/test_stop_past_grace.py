"""A worker stops within its grace whatever its handlers left behind (README, Shutdown:
after --grace the worker exits, "never held up" by a handler).

Found by a probe of the process pool: a handler that started a non-daemon thread kept
`worker` (and a pool's child, and so the pool) up for ever after SIGTERM: the interpreter
waited for the thread at exit. A handler that set SIGTERM to SIG_IGN left the pool no way
to stop its child but SIGKILL by hand."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobspool import Job, JobState
from tests.cli_harness import reap, run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

APP = "tests.apps.leaky:app"
GUARD = 120.0


def test_run_until_idle_exits_past_a_thread_its_handler_left_running(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        job = spool.enqueue("leak")
    done = run_jobspool("run-until-idle", "--app", APP, root=root, timeout=GUARD)
    assert done.returncode == 0, done.stderr
    assert "a handler left running" in done.stderr and "left-behind" in done.stderr
    with make_spool(root) as spool:
        assert spool.get(job.id).state is JobState.COMPLETED


@pytest.mark.parametrize(("kind", "processes"), [("leak", "1"), ("leak", "0"), ("deaf", "1")],
                         ids=["thread-pool", "thread-single", "sigterm-ignored-pool"])
def test_a_stopped_worker_exits_whatever_its_handler_left(tmp_path: Path, kind: str,
                                                          processes: str) -> None:
    root = tmp_path / "s"
    flags = ["--processes", processes] if processes != "0" else []
    proc, job = _serving(root, kind, *flags, "--grace", "1")
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=GUARD)  # held up for ever before: the
        # interpreter waiting for the thread, or SIG_IGN
    finally:
        reap(proc)
    with make_spool(root) as spool:
        after = spool.get(job.id)
    assert b"Traceback" not in err, err
    if kind == "leak":
        assert proc.returncode == 0 and after.state is JobState.COMPLETED, err
    else:  # killed past its grace: its job is back for another run, not lost
        assert after.state in (JobState.READY, JobState.RETRYABLE), after
        assert after.lease is None


def test_pool_children_claim_only_what_they_can_start(tmp_path: Path) -> None:
    """`--processes 2 --concurrency 1`: one child claimed both waiting jobs (a batch of 50)
    and ran them one after the other while its sibling sat idle."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        ids = [spool.enqueue("nap", 30).id for _ in range(2)]
    proc = start_jobspool("worker", "--app", APP, "--processes", "2", "--concurrency", "1",
                          "--grace", "0", "--no-maintenance", root=root,
                          stdout=subprocess.DEVNULL)
    owners: set[str] = set()
    try:
        def both_running() -> bool:
            with make_spool(root) as spool:
                jobs = [spool.get(i) for i in ids]
            owners.clear()
            owners.update(j.lease.owner for j in jobs if j.lease is not None)
            return len(owners) == 2
        wait_until(both_running, GUARD, "both jobs to run at once, one per child", proc=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=GUARD)
        reap(proc)
    assert len(owners) == 2


def test_a_child_killed_after_a_second_signal_is_not_said_to_be_past_its_grace(
        tmp_path: Path) -> None:
    # Found in a signals probe: a child killed after the second SIGTERM was reported as
    # "still running past --grace" although --grace was 60 s and had not run out.
    proc, _ = _serving(tmp_path / "s", "deaf", "--processes", "1", "--grace", "60")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    said = err.decode(errors="replace")
    assert "still running after the second signal; killing it" in said, said
    assert "past --grace" not in said, said


def _serving(root: Path, kind: str, *flags: str) -> tuple[subprocess.Popen[bytes], Job]:
    """A `worker` started on a new spool holding one job of `kind`, once its handler runs."""
    with make_spool(root) as spool:
        job = spool.enqueue(kind)
    proc = start_jobspool("worker", "--app", APP, *flags, "--no-maintenance", root=root,
                          stdout=subprocess.DEVNULL)

    def started() -> bool:
        with make_spool(root) as spool:
            return spool.get(job.id).attempts == 1
    try:
        wait_until(started, GUARD, "the handler to start", proc=proc)
    except BaseException:
        reap(proc)
        raise
    time.sleep(0.5)
    return proc, job


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_stop_signal_repeated_after_the_pool_stopped_does_not_kill_it(
        tmp_path: Path, sig: signal.Signals) -> None:
    # Found by an async probe: the pool handed the signals back to the handlers from
    # before it, and the CLI to the default, while leftover threads got their second: a
    # supervisor repeating its stop then saw "killed by SIGTERM" (-15, or -2), not exit 0.
    root = tmp_path / "s"
    with make_spool(root) as spool:
        job = spool.enqueue("nap", 30)
    proc = start_jobspool("worker", "--app", APP, "--processes", "2", "--grace", "1",
                          "--no-maintenance", root=root, stdout=subprocess.PIPE)
    try:
        def started() -> bool:
            with make_spool(root) as spool:
                return spool.get(job.id).attempts == 1
        wait_until(started, GUARD, "the handler to start", proc=proc)
        proc.send_signal(sig)
        assert proc.stdout is not None
        summary = proc.stdout.readline()  # the pool has stopped
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    assert b"worker pool stopped" in summary, (summary, err)
    assert proc.returncode == 0, err
    with make_spool(root) as spool:
        after = spool.get(job.id)
    assert after.state in (JobState.READY, JobState.RETRYABLE) and after.lease is None, after


def test_a_pool_stopped_while_its_children_boot_says_nothing_for_them(
        tmp_path: Path) -> None:
    # Found by a shutdown probe: each child stopped while still importing its app printed
    # "interrupted by SIGTERM; what was done before it stands" on the pool's stderr, at an
    # ordinary stop (the pool reports its children's exits itself).
    root = tmp_path / "s"
    make_spool(root).close()
    proc = start_jobspool("worker", "--app", "tests.apps.slowboot:app", "--processes", "2",
                          "--grace", "5", "--no-maintenance", root=root,
                          stdout=subprocess.PIPE)
    try:
        wait_until(lambda: len(_children(proc.pid)) == 2, GUARD, "the pool's children",
                   proc=proc)
        time.sleep(0.5)  # they are inside the app's import now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        reap(proc)
    said = err.decode(errors="replace")
    assert b"worker pool stopped" in out, (out, said)
    assert proc.returncode == 0, said
    assert "interrupted" not in said, said


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    found: list[int] = []
    for task in tasks.iterdir() if tasks.exists() else ():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found
