"""A worker serving in a thread other than the main one (`run_forever` in a
`threading.Thread`), stopped when the main thread ends: Python delivers signals to the
main thread only, so a Ctrl-C raised KeyboardInterrupt out of `thread.join()` and the
worker thread went on claiming, the process held open by it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspool import JobState
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

GUARD = 60.0

_SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from jobspool import Spool, Worker

    root, started = Path(sys.argv[1]), Path(sys.argv[2])

    def slow(job, ctx):
        started.touch()
        time.sleep(0.5)  # still running when the Ctrl-C comes: the grace lets it finish
        return "done"

    worker = Worker(Spool(root), {"slow": slow}, grace_seconds=20, maintenance=False)
    t = threading.Thread(target=worker.run_forever, name="serving")
    t.start()
    t.join()
""")


def test_ctrl_c_in_the_main_thread_stops_a_worker_serving_in_another(tmp_path: Path) -> None:
    root, started = tmp_path / "spool", tmp_path / "started"
    with make_spool(root) as spool:
        first = spool.enqueue("slow")
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(root), str(started)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(started.exists, GUARD, "the handler to start", proc=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode(errors="replace")
    assert "cannot hear SIGTERM/SIGINT" in text  # said when the thread began serving
    assert "the main thread ended: stopping the worker" in text
    with make_spool(root) as spool:
        done = spool.get(first.id)
        assert done.state is JobState.COMPLETED and done.result == "done"
        # Stopped, not merely ended: a job enqueued now stays unclaimed.
        assert spool.stats().counts.get(JobState.LEASED, 0) == 0


def test_a_main_thread_that_returns_at_once_still_stops_the_worker_thread(
        tmp_path: Path) -> None:
    # The hook was registered by the worker thread itself: a main thread that had returned
    # before the run began refused it, and that worker served for ever.
    root = tmp_path / "spool"
    make_spool(root).close()
    script = textwrap.dedent("""
        import sys, threading
        from jobspool import Spool, Worker
        worker = Worker(Spool(sys.argv[1]), {"k": lambda job, ctx: None}, maintenance=False)
        threading.Thread(target=worker.run_forever).start()
    """)
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True,
                          text=True, timeout=GUARD)
    assert done.returncode == 0, done.stderr
    assert "the main thread ended: stopping the worker" in done.stderr
