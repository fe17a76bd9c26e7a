"""A sync handler abandoned past its time limit inside `ctx.fenced()` on a file spool.

A sync handler's thread cannot be stopped. Hung inside a fenced block it kept the spool
lock for as long as it ran: the worker's own record of the time limit waited on it, the run
with it, and every other process of the spool (found by the slow-machinery probe; the
PostgreSQL store already ended such a block, `Database.cut_block`). The worker now ends the
thread's hold at the block's inside (`handover.py`): what the block wrote stays (files are
not a transaction), the thread's next step in the block raises `HoldCut`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from jobspool.errors import HoldCut, JobNotFound
from jobspool.queue.handover import HandoverLock
from tests.subproc import REPO, cli_env

_HUNG_IN_BLOCK = """
import subprocess, sys, threading
from jobspool import Policy, Spool, Worker
release = threading.Event()
root, hung = sys.argv[1], int(sys.argv[2])
with Spool(root) as spool:
    spool.enqueue_many("hang", [None] * hung, job_ids=[f"h{i}" for i in range(hung)],
                       max_attempts=1)
    def handler(job, ctx):
        with ctx.fenced():
            spool.enqueue("child", job_id="c" + job.id)
            release.wait(300)  # hung, holding its block open
    report = Worker(spool, {"hang": handler}, policies={"hang": Policy(timeout=1)},
                    concurrency=2, batch_size=2).run_until_idle()
    states = {spool.get(f"h{i}").state.value for i in range(hung)}
    # Another process writes the spool while the abandoned handlers still hang.
    other = subprocess.run([sys.executable, "-c", "import sys; from jobspool import Spool; "
                            "Spool(sys.argv[1]).enqueue('other', job_id='o1')", root],
                           timeout=120)
    print(report.timed_out, ",".join(sorted(states)), other.returncode, spool.get("o1").state.value)
    release.set()
"""


def test_a_handler_hung_inside_its_block_past_its_time_limit_does_not_hang_the_spool(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, "-c", _HUNG_IN_BLOCK, str(root), "3"], cwd=REPO,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=120)  # a guard against the hang, not a timing
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the run waited on the hung handler's fenced block")
    assert proc.returncode == 0, err
    # Each timed out (one attempt: dead-lettered); another process wrote the spool meanwhile.
    assert out.split() == ["3", "dead_letter", "0", "ready"], (out, err)
    assert "ended the fenced block of a handler abandoned" in err
    with Spool(root, durable=False) as spool:
        # Written before the hang: it stays (a file spool's block is not a transaction).
        assert spool.get("ch0").state is JobState.READY


def _hold_in_block(spool: Spool, entered: threading.Event, go_on: threading.Event,
                   outcome: list[object]) -> None:
    """A handler's thread: claim, open a fenced block, wait, then try to write in it."""
    lease = spool.claim()[0]
    try:
        with spool.fenced(lease):
            entered.set()
            go_on.wait(60)
            try:
                spool.enqueue("late", job_id="late")
            except HoldCut as exc:
                outcome.append(exc)
                raise
    except HoldCut as exc:
        outcome.append(exc)


def test_a_cut_block_frees_the_lock_and_its_later_writes_are_refused(
        tmp_path: Path) -> None:
    with Spool(tmp_path / "s", durable=False) as spool:
        spool.enqueue("k", job_id="j")
        entered, go_on, outcome = threading.Event(), threading.Event(), []
        t = threading.Thread(target=_hold_in_block, args=(spool, entered, go_on, outcome))
        t.start()
        assert entered.wait(30)
        assert t.ident is not None
        spool.abandon_blocks(t.ident)
        # This thread takes the lock at once (before: it waited for the hung block).
        spool.enqueue("now", job_id="now")
        job = spool.get("j")
        go_on.set()
        t.join(30)
        # Its write inside the cut block raised, and so did the block's end: no lease was
        # extended after the cut.
        assert [type(e) for e in outcome] == [HoldCut, HoldCut]
        with pytest.raises(JobNotFound):
            spool.get("late")
        assert spool.get("j").lease == job.lease
        # The thread unwound whole: it may use the spool again outside a block.
        assert spool.get("now").state is JobState.READY
        done: list[str] = []
        t2 = threading.Thread(target=lambda: done.append(spool.enqueue("after").id))
        t2.start()
        t2.join(30)
        assert done


def test_a_cut_waits_for_the_change_the_thread_is_in() -> None:
    # Stopped inside one of the spool's own changes (a nested hold), the thread is cut only
    # when that change is done: never half-way through it.
    cuts: list[int] = []
    lock = HandoverLock(lambda: cuts.append(1))
    inside, finish, other_in = threading.Event(), threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def holder() -> None:
        lock.acquire()
        lock.allow_cut()
        lock.acquire()  # a change in progress
        inside.set()
        finish.wait(60)
        lock.release()  # the change ends: the cut happens here
        try:
            lock.forbid_cut()
        except HoldCut as exc:
            raised.append(exc)
        assert lock.release() is False  # the outer level was cut: nothing to let go

    def other() -> None:
        with lock:
            other_in.set()

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(30)
    assert t.ident is not None
    assert lock.cut(t.ident) == "pending"
    o = threading.Thread(target=other)
    o.start()
    assert not other_in.wait(0.2) and cuts == []  # still inside its change
    finish.set()
    assert other_in.wait(30)
    t.join(30)
    o.join(30)
    assert cuts == [1] and len(raised) == 1


def test_a_thread_marked_before_it_holds_is_cut_at_its_block() -> None:
    lock = HandoverLock(lambda: None)
    marked, go = threading.Event(), threading.Event()
    seen: list[str] = []

    def late() -> None:
        marked.wait(30)
        lock.acquire()  # marked threads may still take the lock outside a block
        try:
            lock.allow_cut()
            seen.append("ran the block")
        except HoldCut:
            seen.append("cut")
        assert lock.release() is False
        go.set()

    t = threading.Thread(target=late)
    t.start()
    assert t.ident is not None
    assert lock.cut(t.ident) == "marked"
    marked.set()
    assert go.wait(30)
    t.join(30)
    with lock:  # free
        pass
    assert seen == ["cut"]


def test_a_mark_does_not_pass_to_a_new_thread_with_the_same_ident() -> None:
    # Thread idents are reused as soon as a thread ends; a mark belongs to its thread.
    lock = HandoverLock(lambda: None)
    t = threading.Thread(target=threading.Event().wait, args=(0.05,))
    t.start()
    ident = t.ident
    assert ident is not None
    assert lock.cut(ident) == "marked"
    t.join()
    outcomes: list[str] = []

    def block() -> None:
        outcomes.append("same" if threading.get_ident() == ident else "other")
        with lock:
            lock.allow_cut()
            lock.forbid_cut()
        outcomes.append("ran")

    for _ in range(50):
        n = threading.Thread(target=block)
        n.start()
        n.join(30)
        if outcomes[-2] == "same":
            break
    assert outcomes[-2:] == ["same", "ran"]
