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
    # Thread idents are reused as soon as a thread ends; a mark belongs to its thread. (The
    # reuse is staged: which ident the next thread gets is the C library's choice.)
    import weakref

    lock = HandoverLock(lambda: None)
    marked = threading.Thread(target=threading.Event().wait, args=(0.05,))
    marked.start()
    assert marked.ident is not None
    assert lock.cut(marked.ident) == "marked"
    marked.join()
    me = threading.get_ident()
    lock._cut[me] = (weakref.ref(marked), 0)  # noqa: SLF001 - as if we had its ident
    with lock:
        lock.allow_cut()  # not cut: the mark was the ended thread's
        lock.forbid_cut()


# Found by a probe of the change above.

def test_a_cut_asked_while_the_thread_opens_its_block_happens_at_the_block() -> None:
    # The time limit passed between taking the lock and reaching the block's inside (the
    # lease's read): the cut was left pending for a return that never came, and the hang
    # was back (the worker asks once).
    lock = HandoverLock(lambda: None)
    holding, asked, outcome = threading.Event(), threading.Event(), []

    def opener() -> None:
        lock.acquire()
        holding.set()
        asked.wait(30)
        try:
            lock.allow_cut()
            outcome.append("ran the block")
        except HoldCut:
            outcome.append("cut")
        lock.release()

    t = threading.Thread(target=opener)
    t.start()
    assert holding.wait(30) and t.ident is not None
    assert lock.cut(t.ident) == "pending"
    asked.set()
    t.join(30)
    assert outcome == ["cut"]
    with lock:  # free
        pass


def test_a_pending_cut_never_reaches_the_next_holder(tmp_path: Path) -> None:
    # Asked while its thread held the lock outside any block (a plain enqueue), the cut was
    # left pending after that thread let go, and cut the next thread's block instead.
    with Spool(tmp_path / "s", durable=False) as spool:
        lock = spool.journal.lock
        held, go = threading.Event(), threading.Event()

        def plain() -> None:
            with lock.hold():
                held.set()
                go.wait(30)

        a = threading.Thread(target=plain)
        a.start()
        assert held.wait(30) and a.ident is not None
        assert lock.threads.cut(a.ident) == "pending"
        go.set()
        a.join(30)
        spool.enqueue("k", job_id="j")
        lease = spool.claim()[0]
        done: list[str] = []

        def innocent() -> None:
            with spool.fenced(lease):
                spool.enqueue("x", job_id="inside")
                spool.enqueue("x", job_id="inside2")
            done.append("ok")

        b = threading.Thread(target=innocent)
        b.start()
        b.join(30)
        assert done == ["ok"]
        assert spool.get("inside2").state is JobState.READY


_POOL_THREAD = """
import sys, threading, time
from jobspool import Policy, Spool, Worker
with Spool(sys.argv[1], durable=False) as spool:
    spool.enqueue("slow", job_id="slow", max_attempts=1)
    spool.enqueue_many("fence", [None] * 30, job_ids=[f"f{i:02d}" for i in range(30)],
                       max_attempts=1)
    slow_thread, seen = [], {}
    def slow(job, ctx):
        slow_thread.append(threading.get_ident())
        time.sleep(1.5)  # past its limit, outside any block; then it returns
    def fence(job, ctx):
        seen[job.id] = threading.get_ident()
        time.sleep(0.05)
        with ctx.fenced():
            pass
    Worker(spool, {"slow": slow, "fence": fence},
           policies={"slow": Policy(timeout=1), "fence": Policy(timeout=60)},
           concurrency=1).run_until_idle()
    after = [k for k, v in seen.items() if v == slow_thread[0]]
    failed = [j.id for j in spool.jobs(kind="fence") if j.state.value != "completed"]
    print(len(after), ",".join(failed) or "-")
"""


def test_a_mark_ends_with_its_handler_and_spares_the_next_jobs_of_its_thread(
        tmp_path: Path) -> None:
    # A handler past its limit outside any block was marked; it returned, and the pool
    # reused its thread: the next job's block there was cut (HoldCut, dead-lettered).
    out = subprocess.run([sys.executable, "-c", _POOL_THREAD, str(tmp_path / "s")],
                         cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    reused, failed = out.stdout.split()
    assert int(reused) > 0, "no job ran on the slow handler's thread after it: nothing shown"
    assert failed == "-", out.stderr


def test_a_thread_forking_inside_a_cut_block_unwinds_in_the_child_too(tmp_path: Path) -> None:
    # The child's fresh lock knew nothing of the cut: the release of the cut level raised
    # "cannot release un-acquired lock" there.
    import os

    with Spool(tmp_path / "s", durable=False) as spool:
        spool.enqueue("k", job_id="j")
        lease = spool.claim()[0]
        entered, cut = threading.Event(), threading.Event()
        read, write = os.pipe()

        def handler() -> None:
            try:
                with spool.fenced(lease):
                    entered.set()
                    cut.wait(30)
                    pid = os.fork()
                    if pid == 0:
                        try:
                            pass  # the child leaves the block here
                        finally:
                            pass
                    else:
                        os.close(write)
                        os.waitpid(pid, 0)
            except HoldCut:
                pass
            except BaseException as exc:  # the child's report of what went wrong
                os.write(write, repr(exc).encode())
            if os.getpid() != parent:
                os.write(write, b"child ok")
                os._exit(0)

        parent = os.getpid()
        t = threading.Thread(target=handler)
        t.start()
        assert entered.wait(30) and t.ident is not None
        assert spool.journal.lock.threads.cut(t.ident) == "cut"
        cut.set()
        t.join(60)
        with os.fdopen(read, "rb") as r:
            assert r.read() == b"child ok"


def test_a_cut_thread_may_close_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", durable=False)
    spool.enqueue("k", job_id="j")
    lease = spool.claim()[0]
    entered, cut, seen = threading.Event(), threading.Event(), []

    def handler() -> None:
        try:
            with spool.fenced(lease):
                entered.set()
                cut.wait(30)
                spool.close()
                seen.append("closed")
        except HoldCut:
            seen.append("cut")

    t = threading.Thread(target=handler)
    t.start()
    assert entered.wait(30) and t.ident is not None
    spool.journal.lock.threads.cut(t.ident)
    cut.set()
    t.join(30)
    assert seen == ["closed", "cut"]
    assert spool.journal.lock.closed


def test_a_stale_mark_under_a_reused_ident_does_not_stand_in_for_a_new_one() -> None:
    # A thread marked that never reached a block and ended left its entry; a new thread
    # with the same ident could then not be marked (the entry looked like its mark).
    import weakref

    lock = HandoverLock(lambda: None)
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    me = threading.get_ident()
    lock._cut[me] = (weakref.ref(ended), 0)  # noqa: SLF001 - its leftover, under our ident
    assert lock.cut(me) == "marked"
    with lock:
        with pytest.raises(HoldCut):
            lock.allow_cut()
