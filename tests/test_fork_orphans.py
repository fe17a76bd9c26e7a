"""What a forked child inherits must not outlive its parent's hold, and `close()` waits for
the work other threads have in flight, on both stores.

Found by a fork probe: a process holding the spool (inside `fenced`) forked a helper that
never used jobspool (a `multiprocessing` fork worker) and was then SIGKILLed. The helper's
copies of the flocked descriptors (file store) or of the connection's socket (PostgreSQL:
the session, its transaction and its row lock) kept the dead parent's hold for the helper's
whole life: every other process's `cancel` or `recover` waited for it. And on PostgreSQL,
`close()` returned while another thread's `fenced` block was still to commit (the README:
close "waits for the operations other threads have in flight"). And (file store, HIGH)
several threads of a forked child using the inherited spool at once each re-made the
spool lock lazily, closing descriptors another had just locked: deadlocks, two threads
inside the lock, a job left both ready and leased."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from jobspool.errors import SpoolClosed
from tests.cli_harness import run_jobspool
from tests.spools import opener
from tests.subproc import REPO, cli_env

_HOLDER = textwrap.dedent("""
    import os, sys, threading, time
    from jobspool import Spool
    spool = Spool(sys.argv[1])
    spool.enqueue("k", {}, job_id="victim")
    lease = spool.claim(kinds="k", lease_seconds=600)[0]
    inside = threading.Event()
    def hold():
        with spool.fenced(lease):             # the spool lock / a row lock, held
            inside.set()
            time.sleep(600)
    threading.Thread(target=hold, daemon=True).start()
    inside.wait()
    helper = os.fork()
    if helper == 0:                           # never touches jobspool; outlives the parent
        time.sleep(600)
        os._exit(0)
    print(helper, flush=True)
    time.sleep(600)
""")


def test_a_helper_forked_by_a_killed_process_does_not_keep_its_hold(
        store_root: str | Path) -> None:
    opener(store_root)[0]().close()  # the spool (or schema) exists
    parent = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store_root)], cwd=REPO,
                              env=cli_env(), stdout=subprocess.PIPE, text=True)
    helper = 0
    try:
        assert parent.stdout is not None
        helper = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=60)
        # The helper lives on (until this test kills it): the cancel must not wait for it.
        done = run_jobspool("cancel", "victim", root=store_root, timeout=90)
        assert done.code == 0, done.err
        os.kill(helper, 0)  # still alive: the cancel did not get through by its death
    finally:
        parent.kill()
        parent.wait(timeout=60)
        if parent.stdout is not None:
            parent.stdout.close()
        if helper:
            os.kill(helper, signal.SIGKILL)
    with Spool(store_root) as spool:
        assert spool.get("victim").state is JobState.CANCELED


def test_close_waits_for_another_threads_fenced_block(
        make_any_spool: Callable[..., Spool]) -> None:
    spool, observer = make_any_spool(), make_any_spool()
    spool.enqueue("k", {}, job_id="j")
    lease = spool.claim(kinds="k")[0]
    inside, leave, closed = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def block() -> None:
        try:
            with spool.fenced(lease):
                inside.set()
                leave.wait(60)
                spool.enqueue("outbox", {}, job_id="outbox-1")  # the outbox pattern
        except BaseException as exc:  # reported below
            errors.append(exc)

    def close() -> None:
        spool.close()
        closed.set()

    worker = threading.Thread(target=block)
    worker.start()
    assert inside.wait(60)
    closer = threading.Thread(target=close)
    closer.start()
    assert not closed.wait(0.5), "close() returned while another thread's block ran"
    leave.set()
    worker.join(60)
    closer.join(60)
    assert closed.is_set() and not errors, errors
    # What the block did landed before close returned; the closed spool refuses more.
    assert observer.get("outbox-1").state is JobState.READY
    with pytest.raises(SpoolClosed):
        spool.enqueue("k", {})


def test_a_spool_closed_inside_its_own_fenced_block_does_not_wait_for_itself(
        make_any_spool: Callable[..., Spool]) -> None:
    spool, observer = make_any_spool(), make_any_spool()
    spool.enqueue("k", {}, job_id="j")
    lease = spool.claim(kinds="k")[0]
    with spool.fenced(lease):
        spool.enqueue("outbox", {}, job_id="outbox-2")
        spool.close()
    assert observer.get("outbox-2").state is JobState.READY
    with pytest.raises(SpoolClosed):
        spool.get("j")


_BURST = textwrap.dedent("""
    import faulthandler, json, os, sys, threading
    from jobspool import Spool
    children, threads = int(sys.argv[2]), int(sys.argv[3])
    sys.setswitchinterval(1e-4)                   # threads interleave more often
    spool = Spool(sys.argv[1])
    spool.enqueue_many("k", [{}] * (children * threads * 2))
    spool.stats()                                 # used in the parent before the forks
    r, w = os.pipe()
    pids = []
    for c in range(children):
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(60, exit=True)  # a hang fails, not hangs
            barrier, done, errors = threading.Barrier(threads), [], []
            def go(t):
                barrier.wait()                    # all at once, first use in the child
                try:
                    leases = spool.claim(kinds="k", limit=2)
                    spool.enqueue("e", {}, job_id=f"e{c}-{t}")
                    for lease in leases:
                        spool.complete(lease)
                        done.append([lease.job_id, lease.token])
                except BaseException as exc:
                    errors.append(repr(exc))
            ts = [threading.Thread(target=go, args=(t,)) for t in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            os.write(w, (json.dumps({"done": done, "errors": errors}) + "\\n").encode())
            os._exit(0)
        pids.append(pid)
    os.close(w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    print(json.dumps({"codes": codes, "reports": [json.loads(x) for x in out.splitlines()]}))
""")


def test_threads_of_forked_children_share_the_inherited_spool_safely(
        store_root: str | Path) -> None:
    children, threads = 10, 8
    opener(store_root)[0]().close()
    done = subprocess.run([sys.executable, "-c", _BURST, str(store_root), str(children),
                           str(threads)], cwd=REPO, env=cli_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["codes"] == [0] * children, done.stderr
    assert [r["errors"] for r in got["reports"]] == [[]] * children
    settled = [tuple(x) for r in got["reports"] for x in r["done"]]
    assert len(settled) == children * threads * 2
    assert len({job for job, _ in settled}) == len(settled)  # no job settled twice
    assert len({token for _, token in settled}) == len(settled)  # no token handed out twice
    with Spool(store_root) as spool:
        stats = spool.stats()
        assert (stats.counts["completed"], stats.counts["ready"], stats.counts["leased"]) == (
            children * threads * 2, children * threads, 0)
        assert spool.fsck().ok


_HELPER_IN_BLOCK = textwrap.dedent("""
    import os, sys
    from jobspool import Spool, Worker
    spool = Spool(sys.argv[1])
    children = []
    def handler(job, ctx):
        with ctx.fenced():
            pid = os.fork()
            if pid == 0:
                sys.exit(0)                       # the helper is done: leaves the block
            children.append(pid)
        return "ok"
    job = spool.enqueue("f", {}, max_attempts=1)
    Worker(spool, {"f": handler}, concurrency=1).run_until_idle()
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in children]
    print(codes, spool.get(job.id).state.value, spool.get(job.id).result)
""")


def test_a_helper_forked_inside_a_fenced_block_leaves_it_quietly(
        store_root: str | Path) -> None:
    # Found by a regression probe: the child reset the lock's count and its exit from the
    # block ran it below zero (RuntimeError, exit 1), after which it never took the lock.
    opener(store_root)[0]().close()
    done = subprocess.run([sys.executable, "-c", _HELPER_IN_BLOCK, str(store_root)],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[0]", "completed", "ok"], (done.stdout, done.stderr)
    # Nothing at all on stderr: on PostgreSQL the child ended the parent's transaction
    # from its dead copy of the socket ("error ignored in rollback").
    assert done.stderr == "", done.stderr


_CHILD_WAITS = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from jobspool import Spool
    spool, mark = Spool(sys.argv[1]), Path(sys.argv[2])
    spool.enqueue("k", {}, job_id="j")
    lease = spool.claim(kinds="k", lease_seconds=600)[0]
    r, w = os.pipe()
    with spool.fenced(lease):
        pid = os.fork()                           # by the thread holding the lock
    if pid == 0:
        os.read(r, 1)                             # the parent holds the lock again
        with spool.fenced(lease):                 # must wait for the parent's block
            print("parent had left" if mark.exists() else "entered beside the parent")
        os._exit(0)
    with spool.fenced(lease):
        os.write(w, b"x")
        time.sleep(1.0)                           # the child tries meanwhile
        mark.touch()
    os.waitpid(pid, 0)
""")


def test_a_child_forked_by_the_holder_takes_the_lock_for_real(tmp_path: Path) -> None:
    root = tmp_path / "s"
    opener(root)[0]().close()
    done = subprocess.run([sys.executable, "-c", _CHILD_WAITS, str(root),
                           str(tmp_path / "parent-left")], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "parent had left", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr


def test_closing_inside_a_fenced_block_does_not_wait_for_a_thread_waiting_on_it(
        make_any_spool: Callable[..., Spool]) -> None:
    # Found by a regression probe: on PostgreSQL the other thread's cancel waited for the
    # block's row lock and close waited for that thread's connection: a hang for ever.
    spool = make_any_spool()
    spool.enqueue("k", {}, job_id="j")
    lease = spool.claim(kinds="k")[0]
    outcome: list[object] = []
    closed = threading.Event()

    def cancel() -> None:
        try:
            outcome.append(spool.cancel("j").state)
        except Exception as exc:  # SpoolClosed on the file store
            outcome.append(exc)

    def holder() -> None:
        with spool.fenced(lease):
            other.start()
            other.join(0.5)  # it waits for this block (file: the lock; PostgreSQL: the row)
            spool.close()  # by the block's own thread
            closed.set()

    other = threading.Thread(target=cancel)
    block = threading.Thread(target=holder, daemon=True)  # a hang fails the test, not CI
    block.start()
    block.join(60)
    assert closed.is_set(), "close() inside the block waited for a thread waiting on it"
    other.join(60)
    assert not other.is_alive()
    assert outcome and (outcome[0] is JobState.CANCELED or isinstance(outcome[0], SpoolClosed))


_CHILD_USES_SPOOL_IN_BLOCK = textwrap.dedent("""
    import contextlib, os, sys
    from jobspool import Spool
    spool = Spool(sys.argv[1])
    spool.enqueue("k", {}, job_id="j")
    lease = spool.claim(kinds="k", lease_seconds=600)[0]
    nested = sys.argv[2] == "nested"
    with spool.fenced(lease):
        with spool.fenced(lease) if nested else contextlib.nullcontext():
            pid = os.fork()
        if pid == 0:                              # a helper made inside the block
            try:
                spool.enqueue("k", {}, job_id="from-child")
                code = 0
            except Exception as e:
                print(type(e).__name__, e, file=sys.stderr, flush=True)
                code = 3
            os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), spool.get("from-child").state.value)
""")


@pytest.mark.parametrize("blocks", ["flat", "nested"])
def test_a_child_forked_inside_a_fenced_block_can_use_the_spool(
        store_root: str | Path, blocks: str) -> None:
    # Found by a fork probe (PostgreSQL): the block's connection, pinned for the forking
    # thread, was a dead socket in the child, and every statement that thread sent failed
    # "connection lost" for the child's whole life. Nested (a regression probe): leaving
    # the inner block put the outer block's dead connection back.
    opener(store_root)[0]().close()
    done = subprocess.run([sys.executable, "-c", _CHILD_USES_SPOOL_IN_BLOCK, str(store_root),
                           blocks],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "ready"], (done.stdout, done.stderr)
