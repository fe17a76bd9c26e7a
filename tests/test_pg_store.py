"""PostgreSQL-only behaviour: schema versions, migration from a file spool, the URL in
messages, fencing tokens above a migrated spool's, and the sweep of expired leases."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psycopg
import pytest

from jobspool.errors import LeaseLost, SpoolError
from jobspool.pg.schema import SCHEMA_VERSION
from jobspool.queue.states import JobState
from tests.cli_harness import run_jobspool
from tests.spools import make_spool
from tests.subproc import REPO, cli_env


def test_a_url_selects_the_postgresql_store_and_init_records_the_schema_version(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        assert spool.get(spool.enqueue("note", {"a": 1}).id).payload == {"a": 1}
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT max(version) FROM jobspool_schema").fetchone()
    assert row is not None and row[0] == SCHEMA_VERSION


def test_opening_twice_migrates_once_and_keeps_the_settings_of_creation(pg_url: str) -> None:
    with make_spool(pg_url, lease_seconds=7.0, max_attempts=3) as first:
        assert first.lease_seconds == 7.0
    with make_spool(pg_url) as again:
        assert (again.lease_seconds, again.max_attempts) == (7.0, 3)
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM jobspool_schema").fetchone()
    assert row is not None and row[0] == SCHEMA_VERSION


def test_a_database_with_a_newer_schema_is_refused_before_any_write(pg_url: str) -> None:
    make_spool(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobspool_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(SpoolError, match="newer than this release"):
        make_spool(pg_url)
    out = run_jobspool("--root", pg_url, "enqueue", "note", "{}")
    assert out.returncode == 2
    assert "newer than this release" in out.stderr and "Traceback" not in out.stderr
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM jobspool_jobs").fetchone()
    assert row is not None and row[0] == 0


def test_an_older_schema_is_upgraded_by_a_writer_and_named_to_a_reader(pg_url: str) -> None:
    """A schema from an earlier release (here as v3 left it: no `started` column, one
    row fewer in jobspool_schema): a reading open says to run init, one line; a writing
    open upgrades it and the data stays."""
    with make_spool(pg_url) as spool:
        spool.enqueue("note", {"v": 1}, job_id="old")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobspool_jobs DROP COLUMN started")
        conn.execute("DELETE FROM jobspool_schema WHERE version > 3")
    out = run_jobspool("--root", pg_url, "stats")
    assert out.returncode == 2 and "older than this release" in out.stderr
    assert "jobspool init" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    init = run_jobspool("--root", pg_url, "init", "--json")  # a writer: migrates, says so
    assert init.returncode == 0 and "upgraded from version" in init.stderr
    assert init.stderr.count("upgraded from version") == 1, init.stderr
    assert orjson.loads(init.stdout)["upgraded"] == {"from": 3, "to": SCHEMA_VERSION}
    with make_spool(pg_url) as spool:
        (lease,) = spool.claim()
        assert lease.job_id == "old"
        spool.complete(lease)
    assert run_jobspool("--root", pg_url, "stats").returncode == 0


def test_writing_commands_refuse_a_database_without_the_schema(pg_url: str) -> None:
    out = run_jobspool("--root", pg_url, "enqueue", "note", "{}")
    assert out.returncode == 2
    assert "jobspool init" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert run_jobspool("--root", pg_url, "init").returncode == 0
    assert run_jobspool("--root", pg_url, "enqueue", "note", "{}").returncode == 0


def test_an_unreachable_server_is_one_line_naming_it_without_the_password() -> None:
    out = run_jobspool("--root", "postgresql://u:hunter2@127.0.0.1:1/db", "stats")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0]
    assert "hunter2" not in out.stderr


def test_an_expired_lease_is_swept_by_the_next_claim_and_its_holder_is_fenced(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("note", job_id="j")
        (stale,) = spool.claim(lease_seconds=0.2)
        time.sleep(0.4)
        (fresh,) = spool.claim()
        assert fresh.job_id == "j" and fresh.token > stale.token
        assert spool.get("j").rescues == 1
        with pytest.raises(LeaseLost):
            spool.complete(stale, "late")
        assert spool.complete(fresh, "mine").result == "mine"


def test_a_lease_past_its_attempts_is_swept_to_dead_letter(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("note", job_id="j", max_attempts=1)
        spool.claim(lease_seconds=0.2)
        time.sleep(0.4)
        assert spool.claim() == []
        job = spool.get("j")
        assert job.state is JobState.DEAD_LETTER
        assert job.last_error is not None and "attempts exhausted" in job.last_error


def test_migrate_copies_a_file_spool_without_leases_and_raises_the_token_sequence(
        tmp_path: Path, pg_url: str) -> None:
    src = make_spool(tmp_path / "s", lease_seconds=600.0, max_attempts=1, keep_terminal=50_000)
    done = src.enqueue("note", {"n": 1}, job_id="done")
    src.enqueue("note", {"n": 2}, job_id="held")
    src.enqueue("note", {"n": 3}, job_id="waiting", delay=3600)
    first = src.claim()[0]
    assert first.job_id == done.id
    src.complete(first, {"ok": 1})
    # Held by a live worker (this process): refused, each job would run twice.
    live = src.claim()[0]
    refused = run_jobspool("--root", str(tmp_path / "s"), "migrate", "--to", pg_url)
    assert refused.returncode == 2 and "may still be running" in refused.stderr, refused.stderr
    assert re.search(r"expires in \d+ s", refused.stderr)  # the wait, when it cannot be told
    src.release(live)
    # Held by a worker that died (its liveness lock is free): copied as ready.
    claimer = subprocess.run(
        [sys.executable, "-c", "import os, sys; from jobspool import Spool; "
         "Spool(sys.argv[1]).claim(); os._exit(137)", str(tmp_path / "s")],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert claimer.returncode == 137, claimer.stderr
    held = src.get("held").lease
    assert held is not None
    fence = src.fence_value()
    src.close()

    out = run_jobspool("--root", str(tmp_path / "s"), "migrate", "--to", pg_url, "--json")
    assert out.returncode == 0, out.stderr
    assert '"copied": 3' in out.stdout and '"unleased": 1' in out.stdout
    assert '"settings": "copied"' in out.stdout

    with make_spool(pg_url) as target:
        # The source's settings: its retention must not become the default at the next prune.
        assert (target.lease_seconds, target.max_attempts, target.keep_terminal) == (
            600.0, 1, 50_000)
        assert target.get("done").result == {"ok": 1}
        assert target.get("done").state is JobState.COMPLETED
        moved = target.get("held")
        # Its cut-off run is given back (as release does): on its last attempt, it would
        # otherwise be claimed past max_attempts.
        assert (moved.state, moved.lease, moved.attempts) == (JobState.READY, None, 0)
        assert target.get("waiting").state is JobState.RETRYABLE
        (lease,) = target.claim()
        assert lease.job_id == "held" and lease.token > fence > 0
        assert held.token <= fence

    again = run_jobspool("--root", str(tmp_path / "s"), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 0 and '"copied": 0' in again.stdout
    assert '"unleased": 0' in again.stdout  # nothing copied, nothing unleased


def test_migrate_refuses_a_target_that_is_not_a_url(tmp_path: Path) -> None:
    make_spool(tmp_path / "s").close()
    out = run_jobspool("--root", str(tmp_path / "s"), "migrate", "--to", str(tmp_path / "t"))
    assert out.returncode == 1 and "not a postgresql:// URL" in out.stderr


def test_backpressure_refuses_enqueues_over_max_due_and_writes_nothing(pg_url: str) -> None:
    from jobspool.errors import Backpressure

    with make_spool(pg_url, max_due=3) as spool:
        spool.enqueue_many("note", [1, 2, 3])
        with pytest.raises(Backpressure, match="max_due=3"):
            spool.enqueue("note", 4)
        with pytest.raises(Backpressure):
            spool.enqueue("note", 5, job_id="given")
        assert spool.stats().counts["ready"] == 3
        with pytest.raises(Exception, match="given"):
            spool.get("given")
        # An idempotent re-enqueue of a job already there adds nothing: never refused.
        first = next(spool.jobs(state="ready"))
        assert spool.enqueue_result("note", 1, job_id=first.id).outcome == "existing"
        for lease in spool.claim(limit=3):
            spool.complete(lease)
        assert spool.enqueue("note", 6).state is JobState.READY


def test_the_dashboard_serves_a_postgresql_spool_and_purges_its_dead_letters(
        pg_url: str) -> None:
    from starlette.testclient import TestClient

    from jobspool.dashboard.app import create_app

    with make_spool(pg_url) as spool:
        spool.enqueue("note", {"n": 1}, job_id="bad", max_attempts=1)
        (lease,) = spool.claim()
        spool.fail(lease, "boom <script>", retryable=False)
        client = TestClient(create_app(spool), base_url="http://127.0.0.1")  # type: ignore[arg-type]
        overview = client.get("/api/overview").json()
        assert overview["counts"]["dead_letter"] == 1 and "postgresql://" in overview["root"]
        page = client.get("/jobs/dead_letter")
        assert page.status_code == 200 and "bad" in page.text
        assert "<script>" not in client.get("/job/bad").text
        from jobspool.dashboard.actions import dead_of_kind, purge_dead

        ids, until = dead_of_kind(spool, "note")  # type: ignore[arg-type]
        assert ids == ["bad"] and until is not None
        assert purge_dead(spool, "note", until) == "purged 1 dead letter of kind note"  # type: ignore[arg-type]
        assert spool.stats().counts["dead_letter"] == 0


def test_recover_replays_prepared_jobs_past_their_grace_through_the_kinds_hooks(
        pg_url: str) -> None:
    with make_spool(pg_url, prepare_grace_seconds=0.0) as spool:
        spool.prepare("note", {"n": 1}, job_id="yes")
        spool.prepare("note", {"n": 2}, job_id="no")
        spool.prepare("note", {"n": 3}, job_id="maybe")
        spool.prepare("other", {"n": 4}, job_id="nohook")
        time.sleep(0.05)
        answers = {"yes": "committed", "no": "aborted", "maybe": "unknown"}
        report = spool.recover({"note": lambda job: answers[job.id]})
        assert report.replayed_committed == ("yes",)
        assert report.replayed_aborted == ("no",)
        assert report.replay_unknown == ("maybe",)
        assert report.prepared_pending == ("nohook",)
        assert spool.get("yes").state is JobState.READY
        assert spool.get("no").state is JobState.CANCELED
        maybe = spool.get("maybe")
        assert (maybe.state, maybe.attempts) == (JobState.PREPARED, 1)
        again = spool.recover()  # no hooks now: both left waiting are reported, not moved
        assert set(again.prepared_pending) == {"maybe", "nohook"}
        assert again.replayed_committed == () and again.changed is False


def test_a_lease_of_a_nanosecond_is_not_handed_out_already_expired(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("note", job_id="j")
        (lease,) = spool.claim(lease_seconds=1e-9)
        assert lease.expires_at > lease.job.updated_at


def test_the_demo_runs_on_a_postgresql_root_and_refuses_one_that_holds_jobs(
        pg_url: str, tmp_path: Path) -> None:
    import json

    env: dict[str, str | None] = {"JOBSPOOL_STATE_DIR": str(tmp_path / "state")}
    done = run_jobspool("demo", "--jobs", "60", "--json", root=pg_url, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert sum(doc["counts"].values()) == 60 and doc["counts"]["dead_letter"] <= 1
    assert doc["table_rows"] == doc["counts"]["completed"]
    again = run_jobspool("demo", "--jobs", "10", root=pg_url, env=env, timeout=300)
    assert again.returncode != 0 and "already holds jobs" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_the_dashboards_restore_on_a_postgresql_spool_is_a_plain_refusal(pg_url: str) -> None:
    from jobspool.dashboard.actions import ActionError, restore

    with make_spool(pg_url) as spool, pytest.raises(ActionError, match="no quarantined file"):
        restore(spool, "ready-x.json")  # type: ignore[arg-type]


def test_this_machines_directory_for_a_database_spool_is_private_whatever_the_umask(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker metrics, progress and the default projection of a database spool live in a
    per-machine directory: private (0700) like a file spool's, not 0755 by the umask."""
    import os

    monkeypatch.setenv("JOBSPOOL_STATE_DIR", str(tmp_path / "state"))
    old = os.umask(0o022)
    try:
        with make_spool(pg_url) as spool:
            local = Path(spool.root)
            assert local.parent == tmp_path / "state"
            assert (local.stat().st_mode & 0o777) == 0o700
    finally:
        os.umask(old)


def test_a_worker_follows_the_database_clock_when_it_steps_back(pg_url: str) -> None:
    """The estimate of the database's clock was measured once, at open: after the database's
    clock stepped back by more than a lease (an NTP correction there, a failover to a
    replica behind), every lease looked expired to the worker, which claimed and dropped
    jobs for ever without starting one (a time probe, with the server under libfaketime).
    Here the estimate is put 90 s ahead, as such a step leaves it."""
    from jobspool import Worker

    with make_spool(pg_url, lease_seconds=60.0) as spool:
        for i in range(3):
            spool.enqueue("work", {"i": i})
        spool.follow_clock(spool.now() + 90)  # type: ignore[attr-defined]
        report = Worker(spool, {"work": lambda job, ctx: job.payload["i"]},
                        maintenance=False).run_until_idle()
        assert report.completed == 3 and report.released == 0
        assert abs(spool.now() - time.time()) < 30  # it follows the database again


def test_a_claim_that_waited_on_a_lock_does_not_move_the_clock_estimate(pg_url: str) -> None:
    """Its transaction began long before its rows came back: taken for the database's clock
    now, it put the estimate behind by the wait, a lease that had run out looked live, and
    its handler started — a second run (a regression probe)."""
    import threading

    with make_spool(pg_url, lease_seconds=2.0) as spool:
        spool.enqueue("work", {})
        locked, release = threading.Event(), threading.Event()

        def hold() -> None:
            with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
                conn.execute("LOCK TABLE jobspool_jobs IN SHARE MODE")
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert locked.wait(30)
        timer = threading.Timer(1.5, release.set)
        timer.start()
        try:
            (lease,) = spool.claim()
        finally:
            release.set()
            holder.join(30)
        with psycopg.connect(pg_url) as conn:
            (db_now,) = conn.execute("SELECT extract(epoch from clock_timestamp())::float8"
                                     ).fetchone()  # type: ignore[misc]
        assert abs(spool.now() - db_now) < 0.5
        assert lease.expires_at - spool.now() < 1.0  # the wait ate most of it, and it shows


def test_an_upgrade_by_a_producer_or_worker_is_logged(pg_url: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Any writing open migrates an older schema, as `init` does; a producer or a worker
    doing it said nothing, and processes of older releases started afterwards were refused
    with nothing saying which host upgraded it."""
    make_spool(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobspool_jobs DROP COLUMN started")
        conn.execute("DELETE FROM jobspool_schema WHERE version > 3")
    with caplog.at_level(logging.WARNING, logger="jobspool.pg"), make_spool(pg_url) as spool:
        spool.enqueue("note", {"v": 1})
    said = [r.getMessage() for r in caplog.records if "upgraded" in r.getMessage()]
    assert len(said) == 1 and f"from version 3 to {SCHEMA_VERSION}" in said[0]
    assert "older releases are refused" in said[0]
