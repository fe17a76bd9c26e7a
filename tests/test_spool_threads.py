"""One Spool object shared by threads: every job completed exactly once, tokens never reused.

`flock` on one shared descriptor does not exclude the threads of a process,
so this fails unless the spool pairs its file lock with a thread lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState
from jobspool.errors import LeaseLost
from tests.helpers_spool import assert_disk_consistent, disk_counts, read_raw
from tests.spools import make_spool

THREADS = 8
JOBS = 500


@pytest.mark.timeout(120)
def test_eight_threads_sharing_one_spool_complete_each_job_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool = make_spool(root, lease_seconds=300.0, keep_terminal=100_000)
    try:
        spool.enqueue_many("work", [{"i": i} for i in range(JOBS)])
        done: list[list[tuple[str, int]]] = [[] for _ in range(THREADS)]
        errors: list[BaseException] = []
        start = threading.Barrier(THREADS)

        def worker(n: int) -> None:
            try:
                start.wait(30)
                batch = 1 + n % 3
                while True:
                    leases = spool.claim(limit=batch, owner=f"t{n}")
                    if not leases:
                        return
                    for lease in leases:
                        if n % 2:
                            lease = spool.heartbeat(lease)
                        spool.complete(lease, n)
                        done[n].append((lease.job_id, lease.token))
            except BaseException as exc:  # surfaced below; a thread must not die silently
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(100)
        assert not any(t.is_alive() for t in threads), "a worker thread hung"
        assert errors == []

        ids = Counter(job_id for log in done for job_id, _ in log)
        assert len(ids) == JOBS
        assert [k for k, c in ids.items() if c != 1] == []
        tokens = [tok for log in done for _, tok in log]
        assert len(set(tokens)) == JOBS, "a fencing token was handed out twice"
        for log in done:
            mine = [tok for _, tok in log]
            assert mine == sorted(mine), "a thread saw tokens go backwards"
        assert sum(1 for log in done if log) > 1, "only one thread did any work"

        on_disk = assert_disk_consistent(root)
        assert set(on_disk.values()) == {"completed"}
        assert disk_counts(root)["completed"] == JOBS
        by_thread = {job_id: n for n, log in enumerate(done) for job_id, _ in log}
        for job in spool.jobs(state=JobState.COMPLETED):
            assert job.attempts == 1
            assert job.result == by_thread[job.id]
        sample = next(iter(on_disk))
        assert read_raw(root, "completed", sample)["attempts"] == 1
    finally:
        spool.close()


@pytest.mark.timeout(120)
def test_threads_racing_to_finish_one_lease_let_exactly_one_win(tmp_path: Path,
                                                                clock: Any) -> None:
    spool = make_spool(tmp_path / "spool", clock=clock, lease_seconds=30.0)
    try:
        for round_ in range(20):
            spool.enqueue("race", job_id=f"r{round_}")
            (lease,) = spool.claim()
            wins: list[str] = []
            lost: list[str] = []
            barrier = threading.Barrier(6)

            def racer(action: str, lease: Any = lease, wins: list[str] = wins,
                      lost: list[str] = lost, barrier: threading.Barrier = barrier) -> None:
                barrier.wait(30)
                try:
                    if action == "complete":
                        spool.complete(lease)
                    elif action == "fail":
                        spool.fail(lease, "x", retryable=False)
                    else:
                        spool.cancel(lease.job_id)
                    wins.append(action)
                except LeaseLost:
                    lost.append(action)
                except Exception as exc:  # cancel after completion: InvalidTransition
                    lost.append(f"{action}:{type(exc).__name__}")

            actions = ["complete", "complete", "fail", "fail", "cancel", "cancel"]
            threads = [threading.Thread(target=racer, args=(a,)) for a in actions]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(wins) == 1, (wins, lost)
            job = spool.get(f"r{round_}")
            expected = {"complete": JobState.COMPLETED, "fail": JobState.DEAD_LETTER,
                        "cancel": JobState.CANCELED}[wins[0]]
            assert job.state is expected
        assert_disk_consistent(tmp_path / "spool")
    finally:
        spool.close()
