"""An enqueue made while its thread keeps the spool lock (inside a fenced block, in a
schedule's tick) must not wait for the shared group flush (groupflush.py).

Found by a soak probe: that flush is awaited under the flush lock, whose leader then takes
the spool lock. A thread holding the spool lock and waiting for the flush, beside a producer
leading a flush and waiting for the spool lock, hung every process of the spool for good
(a worker whose schedules fired while another process enqueued; a handler enqueuing a
follow-up job in `ctx.fenced()`). Several OS processes, durable spools, as in production.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from jobspool import JobState, Schedule, Scheduler, Spool
from tests.subproc import REPO, cli_env

_PRODUCER = textwrap.dedent("""
    import sys
    from jobspool import Spool
    spool = Spool(sys.argv[1], durable=True)
    print("up", flush=True)
    for i in range(int(sys.argv[2])):
        spool.enqueue("other", {"i": i})
    print("done", flush=True)
""")

ROUNDS = 300


def _producers(root: Path, n: int, count: int) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, "-c", _PRODUCER, str(root), str(count)],
                              cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return procs


def _finished(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=120)  # a deadlock ends here, as a timeout
        assert p.returncode == 0 and out.strip() == "done"


def test_enqueues_inside_fenced_blocks_beside_other_producers_never_deadlock(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root, durable=True) as spool:
        spool.enqueue("k", {}, job_id="holder")
        [lease] = spool.claim(kinds="k", lease_seconds=600)
        procs = _producers(root, 2, 2 * ROUNDS)
        try:
            for i in range(ROUNDS):
                with spool.fenced(lease):
                    spool.enqueue("follow-up", {"i": i})
        finally:
            _finished(procs)
        assert spool.stats().counts["ready"] == ROUNDS + 2 * 2 * ROUNDS
        assert len(list(spool.jobs(state=JobState.READY, kind="follow-up"))) == ROUNDS


def test_schedules_firing_beside_other_producers_never_deadlock(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root, durable=True) as spool:
        procs = _producers(root, 2, 2 * ROUNDS)
        scheduler = Scheduler([Schedule("tick", every=1, catch_up="all")])
        now = spool.now()
        try:
            for _ in range(ROUNDS):
                now += 1
                scheduler.tick(spool, now)
        finally:
            _finished(procs)
        assert len(list(spool.jobs(state=JobState.READY, kind="other"))) == 2 * 2 * ROUNDS
        assert len(list(spool.jobs(state=JobState.READY, kind="tick"))) >= ROUNDS - 1
