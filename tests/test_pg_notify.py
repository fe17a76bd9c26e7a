"""Wakeups on PostgreSQL (issue 16): one NOTIFY per enqueue transaction and none on claim or
settle, and an idle worker that still picks up new jobs after the server restarted (it
LISTENs again, or polls: the hint is never needed for correctness)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from jobspool import JobState
from tests.cli_harness import start_jobspool
from tests.pgserver import PgServer
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _drain(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The notifications delivered to `conn` so far (a round trip makes them arrive)."""
    conn.execute("SELECT 1")
    return [n.channel for n in conn.notifies(timeout=0.2, stop_after=1000)]


def test_one_notify_per_enqueue_transaction_and_none_on_claim_or_settle(pg_url: str) -> None:
    with make_spool(pg_url) as spool, psycopg.connect(pg_url, autocommit=True) as listener:
        channel = spool.channel  # type: ignore[attr-defined]
        listener.execute(f'LISTEN "{channel}"')
        spool.enqueue("note", job_id="one")
        spool.enqueue_many("note", [1, 2, 3])
        assert _drain(listener) == [channel, channel]
        leases = spool.claim(limit=10)
        spool.complete(leases[0])
        spool.fail(leases[1], "again", delay=0.0)
        spool.release(leases[2])
        spool.heartbeat(leases[3])
        assert _drain(listener) == []


def test_an_idle_worker_picks_up_new_jobs_after_the_server_restarted(
        pg_server: PgServer, pg_url: str, tmp_path: Path) -> None:
    log = tmp_path / "handled.log"
    with make_spool(pg_url) as spool:
        spool.enqueue("work", {"log": str(log)}, job_id="before")
    worker = start_jobspool("worker", "--app", "tests.apps.simple:app", "--kinds", "work",
                            "--concurrency", "2", root=pg_url, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: log.exists() and "before" in log.read_text(), timeout=60,
                   what="the worker to run the first job")
        pg_server.restart()
        with make_spool(pg_url) as spool:
            spool.enqueue("work", {"log": str(log)}, job_id="after")
            done = spool.wait("after", timeout=120)
        assert done.state is JobState.COMPLETED
        assert worker.poll() is None, "the worker exited instead of reconnecting"
    finally:
        worker.kill()
        _, err = worker.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode(errors="replace")
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["before", "after"]


def test_a_clean_stop_does_not_log_its_own_listen_connection_as_lost(
        pg_url: str, tmp_path: Path) -> None:
    # Found in a chaos probe: every SIGTERM stop of an idle worker logged "LISTEN connection
    # ... lost (connection socket closed): reconnecting" at info: a drop at every deploy.
    log = tmp_path / "handled.log"
    with make_spool(pg_url) as spool:
        spool.enqueue("work", {"log": str(log)}, job_id="first")
    worker = start_jobspool("worker", "--app", "tests.apps.simple:app", "--kinds", "work",
                            "--log-level", "info", root=pg_url, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: log.exists() and "first" in log.read_text(), timeout=60,
                   what="the worker to run a job (it is listening, idle, now)", proc=worker)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    finally:
        worker.kill()
        worker.wait(timeout=60)
    said = err.decode(errors="replace")
    assert worker.returncode == 0, said
    assert "received SIGTERM" in said or "stopping" in said, said
    assert "lost" not in said, said
