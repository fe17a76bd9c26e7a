"""A worker told to stop ends even while it waits for a spool lock another process holds.

Found by an operator-slip probe: with the spool lock held by another process (a long
`fenced` block, or a process stopped with SIGSTOP inside one), a worker's claim thread sat
in `flock`, where no signal reaches; SIGTERM, SIGTERM again and SIGINT were each logged and
the worker ran on (9 minutes in one run) until SIGKILL. Now a third signal ends the
process at once, and a run still going `HURRY_EXIT_SECONDS` after the second ends it too.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool.queue.signalhub import HURRY_EXIT_SECONDS
from tests.cli_harness import reap, run_jobspool, start_jobspool
from tests.lock_holder import holding_lock
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

def _blocked_in_flock(pid: int) -> bool:
    """Whether a thread of `pid` sleeps in the kernel's flock wait (its claim, here)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if "flock" in (task / "wchan").read_text() or \
                    "lock_inode" in (task / "wchan").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def held_spool(tmp_path: Path) -> Iterator[Path]:
    """A spool whose lock another process holds (inside a fenced block) until the test ends."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {})
    with holding_lock(root):
        yield root


def _blocked_worker(root: Path) -> subprocess.Popen[bytes]:
    worker = start_jobspool("--root", root, "worker", "--app", "tests.apps.simple:app")
    # The worker's run has begun and its claim waits in flock for the holder's lock.
    wait_until(lambda: _blocked_in_flock(worker.pid), 60, "its claim to wait in flock",
               proc=worker)
    time.sleep(0.5)  # its signal handlers are in place before its first claim; a margin
    return worker


def test_a_third_signal_ends_a_worker_blocked_on_the_spool_lock(held_spool: Path) -> None:
    worker = _blocked_worker(held_spool)
    try:
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
            worker.send_signal(sig)
            time.sleep(0.3)
        # The bound only guards against a hang: the message below says which ended it.
        _, err = worker.communicate(timeout=HURRY_EXIT_SECONDS + 60)
    finally:
        reap(worker)
    assert worker.returncode == 128 + signal.SIGINT
    text = err.decode()
    assert "received SIGINT a third time: exiting now" in text
    assert "Traceback" not in text


def test_a_hurried_worker_still_blocked_exits_on_its_own(held_spool: Path) -> None:
    worker = _blocked_worker(held_spool)
    try:
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        # The bound only guards against a hang (it ran on for minutes before).
        _, err = worker.communicate(timeout=HURRY_EXIT_SECONDS + 60)
    finally:
        reap(worker)
    assert worker.returncode == 128 + signal.SIGTERM
    text = err.decode()
    assert f"still not stopped {HURRY_EXIT_SECONDS:g} s after the second signal" in text
    assert "Traceback" not in text


def test_a_hurried_worker_not_blocked_still_releases_its_leases_and_exits_0(
        tmp_path: Path) -> None:
    # The escalation leaves the normal second signal alone: leases released, exit 0.
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {"sleep": 60})
    worker = start_jobspool("--root", root, "worker", "--app", "tests.apps.simple:app")
    try:
        with make_spool(root, create=False) as spool:
            wait_until(lambda: spool.stats().counts["leased"] == 1, 60, "the job leased",
                       proc=worker)
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    finally:
        reap(worker)
    assert worker.returncode == 0
    with make_spool(root, create=False) as spool:
        assert spool.stats().counts["leased"] == 0
    assert run_jobspool("--root", root, "fsck").returncode == 0
