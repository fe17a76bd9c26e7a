"""`migrate` knows a job by what it is, not by where its spool lives (probe findings):
- a spool renamed (or mounted elsewhere, or a copy of it) migrated again copied back every
  job the database had run and pruned, and they ran a second time;
- a job enqueued on the database itself, with the id, kind and payload of a file-spool
  job, was overwritten by the file spool's version (it is left alone, as an enqueue with
  on_conflict="keep" leaves it);
- a job that moved to another state while the spool was read was copied in neither and
  reported as an unreadable file, pointing at warnings never printed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState
from tests.cli_harness import run_cli, run_jobspool
from tests.spools import make_spool


def _migrate_while_reading(monkeypatch: pytest.MonkeyPatch, root: Path, pg_url: str, at: int,
                           meanwhile: Callable[[Any], None]) -> Any:
    """`migrate --json` in this process, calling `meanwhile(spool)` once the copy has read
    `at` + 1 jobs (what another process does while the spool is read)."""
    from jobspool.queue.spool import Spool

    reading = Spool.jobs

    def jobs(self: Spool, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for n, job in enumerate(reading(self, *args, **kwargs)):
            if n == at:
                meanwhile(self)
            yield job

    monkeypatch.setattr(Spool, "jobs", jobs)
    try:
        return run_cli("--root", str(root), "migrate", "--to", pg_url, "--json")
    finally:
        monkeypatch.undo()


def test_a_renamed_spool_migrated_again_does_not_bring_back_pruned_jobs(
        tmp_path: Path, pg_url: str) -> None:
    first_root, moved_root = tmp_path / "a", tmp_path / "b"
    with make_spool(first_root) as spool:
        spool.enqueue_many("mail", [{"i": i} for i in range(3)], job_ids=["m1", "m2", "m3"])
    first = run_jobspool("--root", str(first_root), "migrate", "--to", pg_url, "--json")
    assert first.returncode == 0, first.stderr
    with make_spool(pg_url) as target:
        for lease in target.claim(limit=3):
            target.complete(lease, "sent")
        target.prune(keep=0)
        assert list(target.jobs()) == []
    first_root.rename(moved_root)
    again = run_jobspool("--root", str(moved_root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads(again.stdout)
    assert doc["copied"] == 0 and doc["skipped"] == 3
    with make_spool(pg_url) as target:
        assert list(target.jobs()) == []  # nothing to run a second time


def test_a_job_enqueued_on_the_database_is_not_replaced_by_a_file_spool_namesake(
        tmp_path: Path, pg_url: str) -> None:
    with make_spool(pg_url) as target:
        target.enqueue("report", {"day": 1}, job_id="report-1", priority=-5, max_attempts=9)
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("report", {"day": 1}, job_id="report-1")
        (lease,) = spool.claim()
        spool.fail(lease, "smtp down", delay=3600)
    out = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)  # left alone, as an enqueue with on_conflict="keep"
    assert doc["skipped_ids"] == ["report-1"] and doc["updated"] == 0
    with make_spool(pg_url) as target:
        kept = target.get("report-1")
    assert (kept.state, kept.priority, kept.max_attempts, kept.attempts) == \
        (JobState.READY, -5, 9, 0)


def test_a_job_that_moves_while_the_spool_is_read_is_named_for_a_rerun(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="early")
        spool.enqueue("k", {}, job_id="late")
        spool.cancel("late")

    def requeue(_spool: Any) -> None:  # ready/ read: a shell requeues the canceled job
        with make_spool(root) as other:
            other.requeue("late")

    out = _migrate_while_reading(monkeypatch, root, pg_url, 0, requeue)
    assert out.code == 2, out.out + out.err
    doc = json.loads(out.out)
    assert (doc["unreadable"], doc["moved_during_copy"], doc["moved_ids"]) == (0, 1, ["late"])
    assert "changed state while the spool was read" in out.err
    assert "could not be read" not in out.err
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    with make_spool(pg_url) as target:
        assert target.get("late").state is JobState.READY


def test_a_worker_started_during_the_copy_is_named_and_the_exit_is_2(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobspool import RunReport
    from jobspool.metrics import publish_worker_report, remove_worker_report

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{}, {}], job_ids=["a", "b"])
    try:  # a worker starts on the spool while it is read (this process: alive)
        out = _migrate_while_reading(
            monkeypatch, root, pg_url, 0,
            lambda spool: publish_worker_report(spool, "late-worker", RunReport()))
    finally:
        with make_spool(root) as spool:
            remove_worker_report(spool, "late-worker")
    assert out.code == 2, out.out + out.err
    doc = json.loads(out.out)
    assert doc["copied"] == 2 and doc["workers_started_during_copy"] == ["late-worker"]
    assert "started on this spool during the copy" in out.err


def test_an_id_used_again_for_a_new_job_after_its_first_was_migrated_and_pruned_is_copied(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {"n": 1}, job_id="j1")
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    with make_spool(pg_url) as target:
        (lease,) = target.claim()
        target.complete(lease, "done")
        target.prune(keep=0)
    with make_spool(root) as spool:  # the file spool's own j1 ends; a new one takes the id
        spool.cancel("j1")
        spool.prune(keep=0)
        spool.enqueue("k", {"n": 2}, job_id="j1")
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["copied"] == 1
    with make_spool(pg_url) as target:
        assert target.get("j1").payload == {"n": 2}


def test_books_of_an_older_layout_that_the_role_may_not_alter_still_work_by_path(
        tmp_path: Path, pg_url: str) -> None:
    import psycopg

    from jobspool.pg.migrate import _BOOKS

    with make_spool(pg_url):
        pass  # the schema, made by its owner
    old = _BOOKS.replace("    created_at float8,\n", "")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(old)
        conn.execute("DROP ROLE IF EXISTS mig_app")
        conn.execute("CREATE ROLE mig_app LOGIN")
        row = conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        schema = row[0]
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO mig_app')
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                     "TO mig_app")
        conn.execute(f'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA "{schema}" '
                     "TO mig_app")
    as_app = pg_url.replace("://", "://mig_app@", 1) if "@" not in pg_url else \
        pg_url.split("://", 1)[0] + "://mig_app@" + pg_url.split("@", 1)[1]
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="a")
    try:
        out = run_jobspool("--root", str(root), "migrate", "--to", as_app, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["copied"] == 1
        again = run_jobspool("--root", str(root), "migrate", "--to", as_app, "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["skipped"] == 1
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP OWNED BY mig_app")
            conn.execute("DROP ROLE mig_app")


def test_a_job_enqueued_while_the_spool_is_read_is_named_for_a_rerun(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{}, {}], job_ids=["a", "b"])

    def produce(_spool: Any) -> None:  # a producer left running, after ready/ was listed
        with make_spool(root) as other:
            other.enqueue("k", {}, job_id="zz-late")

    out = _migrate_while_reading(monkeypatch, root, pg_url, 1, produce)
    assert out.code == 2, out.out + out.err
    doc = json.loads(out.out)
    assert doc["copied"] == 2 and doc["arrived_ids"] == ["zz-late"]
    assert "added to the spool while it was read" in out.err


def test_the_books_are_indexed_by_id_for_the_lookup_across_sources(
        tmp_path: Path, pg_url: str) -> None:
    # Records are looked up by id whatever their source: without an index on it, every
    # chunk of 500 read the whole table (quadratic in the spool's size).
    import psycopg

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="a")
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    with psycopg.connect(pg_url) as conn:
        defs = [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'jobspool_migrated'")]
    assert any(d.endswith("(id)") for d in defs), defs


def test_migrate_leaves_the_copied_jobs_analyzed(tmp_path: Path, pg_url: str) -> None:
    # A scale probe: after migrating 200k jobs the table had no statistics (autovacuum
    # reaches a freshly loaded table minutes later on a busy server), and a worker's claims
    # for several kinds read and sorted the whole backlog (2,000 jobs in 17 s, not 0.8 s).
    import psycopg

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("mail", [{"n": n} for n in range(20)])
    code, _, err = run_cli("--root", str(root), "migrate", "--to", pg_url)
    assert code == 0, err
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT last_analyze FROM pg_stat_user_tables WHERE relid = "
                           "to_regclass('jobspool_jobs')").fetchone()
    assert row is not None and row[0] is not None
