"""`jobspool migrate` and what is still running on the file spool, and what it carries.

An idle worker holds no lease, so migrate copied the spool under it: the worker then
ran, on the file spool, every job also copied to PostgreSQL — each ran twice. Migrate now
refuses while a worker runs (its metrics snapshot is fresh) and only warns about other
writers (what they add after the copy stays behind)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.cli_harness import run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until


def test_migrate_refuses_while_an_idle_worker_runs_on_the_spool(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "s"
    make_spool(root).close()
    worker = start_jobspool("worker", "--app", "tests.apps.simple:app", "--poll", "0.2",
                            root=root)
    try:
        wait_until(lambda: list((root / "metrics").glob("*.json")), 60.0,
                   "the worker's metrics snapshot", proc=worker)
        with make_spool(root) as spool:
            spool.enqueue("work", {}, job_id="later", delay=30)
        refused = run_jobspool("--root", str(root), "migrate", "--to", pg_url)
        assert refused.returncode == 2, refused.stderr
        assert "worker(s) are running on this spool" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    done = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert '"copied": 1' in done.stdout
