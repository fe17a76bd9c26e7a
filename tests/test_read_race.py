"""Readers racing a job file that is retired and recycled while they read it.

Found by a regression probe: waiters polling jobs that workers kept moving (claim, fail,
claim...) warned "skipping unreadable job file leased/A.json: id 'B' does not match file
name 'A' (`jobspool recover` moves it to quarantine/)" for healthy jobs: the file was
retired mid-read and its inode rewritten with another job (the file pool). A read that
does not decode is now read again: what the path holds now, or nothing (the job moved)."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

from jobspool.errors import CorruptFileWarning
from tests.spools import make_spool


def test_churning_jobs_are_never_reported_as_corrupt_to_their_readers(tmp_path: Path) -> None:
    with make_spool(tmp_path / "s", keep_terminal=100_000) as spool:
        jobs = [spool.enqueue("r", {}, max_attempts=30) for _ in range(40)]
        failures: list[str] = []
        stop = threading.Event()

        def waiter(job_id: str) -> None:
            try:
                spool.wait(job_id, timeout=120, poll_seconds=0.001)
            except Exception as exc:  # reported below
                failures.append(f"{type(exc).__name__}: {exc}")

        def churn() -> None:
            while not stop.is_set():
                for lease in spool.claim(kinds="r", limit=10):
                    if spool.get(lease.job_id).attempts < 20:
                        spool.fail(lease, "again", delay=0)
                    else:
                        spool.complete(lease, "ok")

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", CorruptFileWarning)
            waiters = [threading.Thread(target=waiter, args=(j.id,)) for j in jobs]
            churners = [threading.Thread(target=churn) for _ in range(3)]
            for t in waiters + churners:
                t.start()
            for t in waiters:
                t.join(180)
            stop.set()
            for t in churners:
                t.join(60)
        corrupt = [str(w.message) for w in seen if issubclass(w.category, CorruptFileWarning)]
        assert corrupt == [] and failures == [], (corrupt[:3], failures[:3])
        assert all(spool.get(j.id).result == "ok" for j in jobs)
