"""What waits on a spool lock another process holds says so, and `health` answers anyway.

Found by an operator-slip probe: behind a long fenced block (or a process stopped inside
one), `health`, `stats` and `fsck` sat silent for as long as it lasted (a container's
HEALTHCHECK timed out instead of reporting a spool no writer could touch); two quick
SIGTERMs to such a command printed a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.cli_harness import reap, run_jobspool, start_jobspool
from tests.lock_holder import holding_lock
from tests.spools import make_spool

pytestmark = pytest.mark.slow


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    with make_spool(path) as spool:
        spool.enqueue("work", {})
    return path


def test_health_reports_a_lock_held_past_its_wait_instead_of_waiting_with_it(root: Path) -> None:
    with holding_lock(root):
        r = run_jobspool("--root", root, "health", "--json", timeout=120)
    assert r.returncode == 2
    doc = orjson.loads(r.stdout)
    assert doc["status"] == "degraded"
    assert [reason["code"] for reason in doc["reasons"]] == ["lock_held"]
    assert "has been held for over" in doc["reasons"][0]["message"]
    # Once the lock is free, the check looks at everything again: the killed holder's
    # lease is what it finds now.
    after = orjson.loads(run_jobspool("--root", root, "health", "--json").stdout)
    assert [reason["code"] for reason in after["reasons"]] == ["dead_holders"]


def test_stats_says_it_waits_for_the_lock_then_answers(root: Path) -> None:
    with holding_lock(root, seconds=4):
        r = run_jobspool("--root", root, "stats", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout)["counts"]["ready"] == 1
    notices = [line for line in r.stderr.splitlines() if "waiting for the spool lock" in line]
    assert len(notices) == 1  # said once, not at every poll


def test_two_quick_sigterms_to_a_command_waiting_for_the_lock_print_one_line(root: Path
                                                                              ) -> None:
    with holding_lock(root):
        # A writing command: `stats` now gives up after its bounded wait.
        proc = start_jobspool("--root", root, "enqueue", "k", "{}")
        try:
            # Its notice says it is past start-up and in the wait.
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert b"waiting for the spool lock" in line, line
            os.kill(proc.pid, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGTERM)  # as GNU timeout does: the child, then its group
            _, err = proc.communicate(timeout=60)
        finally:
            reap(proc)
    assert proc.returncode == 143
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0], err


def test_health_in_process_reports_a_lock_another_thread_holds(root: Path) -> None:
    # An application serving /health beside worker threads: the lock held by a fenced
    # block in another thread of the same process hung the check as well.
    import threading

    from jobspool.health import HEALTH_LOCK_WAIT

    with make_spool(root, create=False) as spool:
        lease = spool.claim(limit=1)[0]
        inside, done = threading.Event(), threading.Event()

        def block() -> None:
            with spool.fenced(lease):
                inside.set()
                done.wait(HEALTH_LOCK_WAIT * 20)

        holder = threading.Thread(target=block)
        holder.start()
        try:
            assert inside.wait(60)
            assert spool.health().codes() == ["lock_held"]
        finally:
            done.set()
            holder.join()
        assert "lock_held" not in spool.health().codes()


def test_a_command_interrupted_in_process_does_not_ignore_the_next_calls_sigterm(
        tmp_path: Path, root: Path) -> None:
    # Found by a regression probe: after one SIGTERM, every later in-process
    # `jobspool.cli.main()` call treated SIGTERM as a repeat and ignored it.
    script = tmp_path / "twice.py"
    script.write_text(
        "import os, signal, sys, threading\n"
        "from jobspool.cli import main\n"
        "for _ in range(2):\n"
        "    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "    print(main(['--root', sys.argv[1], 'stats']), flush=True)\n")
    with holding_lock(root, seconds=120):
        done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True,
                              text=True, timeout=100, cwd=tmp_path)
    assert done.stdout.split() == ["143", "143"], (done.stdout, done.stderr)


def test_repeated_health_behind_a_held_lock_keeps_one_helper(root: Path) -> None:
    # A dashboard asking every few seconds behind a lock held for hours: each question
    # left a helper thread (and two descriptors) blocked until the holder let go.
    import threading

    from jobspool.queue import lockwait

    with holding_lock(root), make_spool(root, create=False) as spool:
        before = threading.active_count()
        for _ in range(5):
            assert not lockwait.free_within(spool.lock.path, root, 0.05)
        assert threading.active_count() <= before + 1
    # Once the holder is gone, the helper lets go and the next question is answered.
    with make_spool(root, create=False) as spool:
        assert lockwait.free_within(spool.lock.path, root, 60)


def test_health_inside_the_callers_own_fenced_block_is_not_lock_held(root: Path) -> None:
    # Found by a regression probe: the helper asked for the lock the caller itself held
    # (re-entrant for it), and waited 5 s to answer "lock_held" on a healthy spool.
    with make_spool(root, create=False) as spool:
        lease = spool.claim(limit=1)[0]
        with spool.fenced(lease):
            assert "lock_held" not in spool.health().codes()


def test_a_child_forked_while_health_waited_does_not_keep_the_lock(root: Path) -> None:
    # Found by a regression probe: a child forked while health's helper waited (a
    # multiprocessing pool) inherited its descriptors; once the parent's helper took the
    # lock and closed its own, the child's copies kept it held: every writer hung for the
    # child's life, and the child's own health said lock_held for ever.
    read_end, write_end = os.pipe()
    with make_spool(root, create=False) as spool:
        with holding_lock(root):
            assert spool.health().codes() == ["lock_held"]  # its helper still waits
            child = os.fork()
            if child == 0:  # the child: report its own health once the holder is gone
                os.close(read_end)
                try:
                    time.sleep(1.0)
                    codes = spool.health().codes()
                    os.write(write_end, (",".join(codes) or "ok").encode())
                    time.sleep(60)  # lives on, as a pool's worker does
                finally:
                    os._exit(0)
        os.close(write_end)
        try:
            # The holder is gone: another process takes the lock while the child lives.
            done = run_jobspool("--root", root, "enqueue", "k", "{}", timeout=60)
            assert done.returncode == 0, done.stderr
            assert "still waiting" not in done.stderr
            assert os.read(read_end, 100).decode() != "lock_held"
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            os.close(read_end)


@pytest.mark.parametrize("command", [["stats", "--json"], ["stats", "--prometheus"], ["fsck"]])
def test_stats_and_fsck_give_up_on_a_lock_held_past_their_wait(root: Path,
                                                              command: list[str]) -> None:
    """They waited for as long as the holder lasted: a cron exporter running `stats
    --prometheus` every minute piled up behind a stopped process (an operator probe)."""
    with holding_lock(root):
        r = run_jobspool("--root", root, *command, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if "has been held for over" in line]
    assert len(errors) == 1 and "nothing was read" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and "# TYPE" not in r.stdout
