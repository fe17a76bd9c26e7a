"""`jobspool migrate` and what is still running on the file spool, and what it carries.

An idle worker holds no lease, so migrate copied the spool under it: the worker then
ran, on the file spool, every job also copied to PostgreSQL — each ran twice. Migrate now
refuses while a worker runs (its metrics snapshot is fresh) and only warns about other
writers (what they add after the copy stays behind)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from jobspool import Job, JobState
from tests.cli_harness import run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until


def _worker_with_a_snapshot(root: Path) -> subprocess.Popen[bytes]:
    """A new spool at `root` and an idle `jobspool worker` on it, once its metrics snapshot
    is written (what migrate's guard reads)."""
    make_spool(root).close()
    worker = start_jobspool("worker", "--app", "tests.apps.simple:app", "--poll", "0.2",
                            root=root)
    try:
        wait_until(lambda: list((root / "metrics").glob("*.json")), 60.0,
                   "the worker's metrics snapshot", proc=worker)
    except BaseException:
        worker.kill()
        worker.communicate(timeout=60)
        raise
    return worker


def test_migrate_refuses_while_an_idle_worker_runs_on_the_spool(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "s"
    worker = _worker_with_a_snapshot(root)
    try:
        with make_spool(root) as spool:
            spool.enqueue("work", {}, job_id="later", delay=30)
        refused = run_jobspool("--root", str(root), "migrate", "--to", pg_url)
        assert refused.returncode == 2, refused.stderr
        assert "worker(s) are running on this spool" in refused.stderr
        # A leftover no one can tell dead (an older release's file) is named, with its wait.
        assert "counts until 300 s after its last report in" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    done = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert '"copied": 1' in done.stdout


def test_migrate_is_not_refused_by_a_killed_workers_snapshot(tmp_path: Path, pg_url: str) -> None:
    """A worker killed with SIGKILL left its metrics snapshot fresh: migrate refused for
    five minutes, naming a dead process as running, and `recover` did not clear it."""
    root = tmp_path / "s"
    worker = _worker_with_a_snapshot(root)
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=60)
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="after-the-kill")
    done = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert '"copied": 1' in done.stdout


def test_migrate_carries_schedule_marks_and_says_what_it_did_not_copy(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("charge", {"mine": 1}, job_id="order-42")
        spool.enqueue("note", {"n": 1}, job_id="same")
        with spool.hold_schedule_marks() as marks:
            marks["hourly"] = 1_796_299_200  # fired and pruned on the file spool
    (root / "ready" / "garbled.json").write_bytes(b"{not json")
    (root / "index").mkdir()
    (root / "index" / "t.lance").mkdir()
    with make_spool(pg_url) as target:
        target.enqueue("other", {"theirs": 1}, job_id="order-42")  # another job, same id
        target.enqueue("note", {"n": 1}, job_id="same")  # the same job: a repeat
    out = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert out.returncode == 2, out.stderr  # not everything came over
    doc = json.loads(out.stdout)
    assert doc["conflicts"] == 1 and doc["conflict_ids"] == ["order-42"]
    assert doc["skipped"] == 2 and doc["unreadable"] == 1 and doc["schedule_marks"] == 1
    assert "NOT copied" in out.stderr and "could not be read" in out.stderr
    assert "--projection" in out.stderr  # the projection stays where it was
    with make_spool(pg_url) as target:
        assert target.schedule_marks() == {"hourly": 1_796_299_200}
        assert target.get("order-42").kind == "other"


def test_a_migration_run_again_after_the_source_ran_jobs_brings_them_up_to_date(
        tmp_path: Path, pg_url: str) -> None:
    """Interrupted, then the file spool's workers ran on, then migrate again: the jobs the
    source finished meanwhile stayed `ready` on PostgreSQL (left alone as "already there")
    and ran a second time there. Now a job no target worker touched takes the source's
    newer version, and one changed on both sides is reported (exit 2) — also one run once
    on each side, whose revisions agree (it was taken for a repeat)."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{"i": 0}, {"i": 1}], job_ids=["a", "b"])
        spool.enqueue_many("m", [{"i": 2}, {"i": 3}], job_ids=["c", "d"])
        spool.enqueue("n", {"i": 4}, job_id="e")
    first = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert first.returncode == 0, first.stderr
    with make_spool(root) as spool:  # the file spool's workers ran on: a to d
        for lease in spool.claim(limit=2, kinds="k"):
            spool.complete(lease, {"on": "file"})
        for lease in spool.claim(limit=2, kinds="m"):
            if lease.job_id == "c":
                spool.fail(lease, "once more", delay=0)  # c: two runs on the file spool
            else:
                spool.complete(lease, {"on": "file"})
        spool.complete(spool.claim(kinds="m")[0], {"on": "file"})
    with make_spool(pg_url) as target:  # and a target worker ran c, d and e
        for lease in target.claim(limit=3, kinds=["m", "n"]):
            target.complete(lease, {"on": "pg"})
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 2, again.stdout + again.stderr  # c and d changed on both
    doc = json.loads(again.stdout)
    assert doc["copied"] == 0 and doc["skipped"] == 5
    # e ran on the target alone: its own progress, left alone.
    assert sorted(doc["updated_ids"]) == ["a", "b"]
    assert sorted(doc["diverged_ids"]) == ["c", "d"]
    assert "changed on both spools" in again.stderr
    # Every one named in the text too: a later run no longer lists them (it said "`--json`
    # lists them", and the `--json` run after it listed none).
    assert "c, d" in again.stderr and "`--json` lists them" not in again.stderr
    with make_spool(pg_url) as target:
        states = {i: (target.get(i).state.value, target.get(i).result) for i in "abcde"}
    assert states == {"a": ("completed", {"on": "file"}), "b": ("completed", {"on": "file"}),
                      "c": ("completed", {"on": "pg"}), "d": ("completed", {"on": "pg"}),
                      "e": ("completed", {"on": "pg"})}
    third = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert third.returncode == 0, third.stdout + third.stderr
    doc = json.loads(third.stdout)  # nothing moved since: reported by the run that found it
    assert (doc["updated"], doc["diverged"]) == (0, 0)


def test_what_moved_is_told_by_revisions_not_by_clocks_or_outcomes(
        tmp_path: Path, pg_url: str) -> None:
    """A regression probe's cases: a source host whose clock runs ahead made a job changed
    on the source alone "diverged" (a row's copied `updated_at` was compared with the
    database's clock); a job run once on each side to the same outcome (None) was a
    "repeat"; a finished job requeued on the source alone was "diverged"."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        for name in ("ahead", "both", "done"):  # a kind each: claimed alone
            spool.enqueue(name, {}, job_id=name)
        spool.complete(spool.claim(kinds=["done"])[0])
    first = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert first.returncode == 0, first.stderr
    with make_spool(root, clock=lambda: time.time() + 120) as spool:  # two minutes ahead
        spool.complete(spool.claim(kinds=["ahead"])[0], {"on": "file"})
        spool.complete(spool.claim(kinds=["both"])[0])
        spool.requeue("done")
    with make_spool(pg_url) as target:
        target.complete(target.claim(kinds=["both"])[0])
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    doc = json.loads(again.stdout)
    assert sorted(doc["updated_ids"]) == ["ahead", "done"], doc
    assert doc["diverged_ids"] == ["both"] and again.returncode == 2
    with make_spool(pg_url) as target:
        assert target.get("ahead").result == {"on": "file"}
        assert target.get("done").state is JobState.READY


def test_the_books_survive_a_rewrite_of_the_table_and_see_the_targets_own_attempts(
        tmp_path: Path, pg_url: str) -> None:
    """Judged by transaction ids, a dump and restore (every row rewritten) made a job moved
    on the source alone "diverged", and a target's failed attempt was overwritten after a
    run cut off before it recorded its start (a regression probe). A job the target
    finished and pruned is not copied again (it would run again)."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        for name in ("src", "both", "gone"):
            spool.enqueue(name, {}, job_id=name)
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    with make_spool(pg_url) as target:
        target.db.run(lambda conn: [conn.execute(sql) for sql in (  # every row rewritten
            "CREATE TEMP TABLE keep AS SELECT * FROM jobspool_jobs",
            "DELETE FROM jobspool_jobs", "INSERT INTO jobspool_jobs SELECT * FROM keep")])
        target.fail(target.claim(kinds=["both"])[0], "target's try", delay=0)
        target.complete(target.claim(kinds=["gone"])[0])
        assert target.prune(keep=0).to_dict()["pruned"] == 1
    with make_spool(root) as spool:
        spool.complete(spool.claim(kinds=["src"])[0], {"on": "file"})
        spool.fail(spool.claim(kinds=["both"])[0], "source's try", delay=0)
        spool.complete(spool.claim(kinds=["both"])[0], {"on": "file"})
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    doc = json.loads(again.stdout)
    assert doc["updated_ids"] == ["src"] and doc["diverged_ids"] == ["both"], doc
    assert doc["copied"] == 0
    with make_spool(pg_url) as target:
        both = target.get("both")
        assert (both.state, both.attempts, both.last_error) == (
            JobState.RETRYABLE, 1, "target's try")  # the target's own attempt stands
        assert "gone" not in {j.id for j in target.jobs()}


def test_a_job_run_once_on_each_side_is_diverged_also_without_a_record_of_the_last_run(
        tmp_path: Path, pg_url: str) -> None:
    """A first run cut off before it recorded itself (or one of an older release): equal
    revisions with different contents are changes on both sides."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {"i": 0}, job_id="j")
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    with make_spool(pg_url) as target:
        target.db.run(lambda conn: conn.execute(
            "DELETE FROM jobspool_migrated"))
        target.complete(target.claim()[0], {"on": "pg"})
    with make_spool(root) as spool:
        spool.complete(spool.claim()[0], {"on": "file"})
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 2, again.stdout + again.stderr
    assert json.loads(again.stdout)["diverged_ids"] == ["j"]


def test_a_job_the_database_cannot_hold_is_refused_alone_and_named(
        tmp_path: Path, pg_url: str) -> None:
    """An older release accepted a priority of 2**63: migrate stopped half way on "bigint
    out of range", naming no job, and every re-run stopped there too."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{"i": i} for i in range(4)], job_ids=["a", "b", "c", "d"])
        with spool.hold_schedule_marks() as marks:
            marks["hourly"] = 1_796_299_200
    path = root / "ready" / "b.json"
    doc = json.loads(path.read_text())
    doc["priority"] = 2**63
    path.write_text(json.dumps(doc))
    out = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["refused_ids"] == ["b"] and report["copied"] == 3
    assert report["schedule_marks"] == 1  # the run went on to the end
    assert "'b': priority 9223372036854775808 does not fit" in out.stderr
    assert len([line for line in out.stderr.splitlines() if "NOT copied" in line]) == 1
    with make_spool(pg_url) as target:
        assert sorted(j.id for j in target.jobs()) == ["a", "c", "d"]


def test_a_rerun_notes_the_targets_own_settings_only_where_they_differ(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "s"
    make_spool(root, lease_seconds=77.0).close()
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url)
    assert again.returncode == 0 and "settings" not in again.stderr, again.stderr
    other = tmp_path / "other"
    make_spool(other, lease_seconds=30.0).close()
    moved = run_jobspool("--root", str(other), "migrate", "--to", pg_url)
    assert moved.returncode == 0, moved.stderr
    assert "keeps its own settings (lease_seconds 77.0 (the source's 30.0))" in moved.stderr


def test_a_rule_made_finer_after_migrating_starts_over_instead_of_catching_up(
        tmp_path: Path, pg_url: str) -> None:
    """The fingerprint of the rule a tick was fired under moves with the tick: without it,
    `every=60` after the move judged the hour's mark by the old check and fired 50
    "missed" ticks, where the same change on one store fires one."""
    from jobspool import Schedule
    from jobspool.schedules import Scheduler

    hour = 1_796_299_200
    root = tmp_path / "s"
    with make_spool(root) as spool:
        Scheduler([Schedule("tick", catch_up="all", every=3600)]).tick(spool, now=hour + 1)
    out = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert out.returncode == 0, out.stderr
    with make_spool(pg_url) as target:
        fired = Scheduler([Schedule("tick", catch_up="all", every=60)]).tick(
            target, now=hour + 50 * 60 + 1)
    assert sum(len(f.ticks) for f in fired) == 1, fired


def test_a_job_changed_on_both_sides_is_reported_once_and_the_target_run_never_replaced(
        tmp_path: Path, pg_url: str) -> None:
    """After a "diverged" report, a later change of the source replaced the target's finished
    run (it ran a third time); a job the target finished and pruned, run on the source too,
    was reported diverged by every run, for ever (a regression probe)."""
    root = tmp_path / "s"
    with make_spool(root) as spool:
        for name in ("both", "pruned"):
            spool.enqueue(name, {}, job_id=name)
    assert run_jobspool("--root", str(root), "migrate", "--to", pg_url).returncode == 0
    with make_spool(pg_url) as target:
        target.fail(target.claim(kinds=["both"])[0], "target's try", delay=3600)
        target.complete(target.claim(kinds=["pruned"])[0], {"on": "pg"})
        target.prune(keep=0)  # "pruned" is gone from the target
    with make_spool(root) as spool:
        for name in ("both", "pruned"):
            spool.complete(spool.claim(kinds=[name])[0], {"on": "file"})
    first = json.loads(run_jobspool("--root", str(root), "migrate", "--to", pg_url,
                                    "--json").stdout)
    assert sorted(first["diverged_ids"]) == ["both", "pruned"]
    again = run_jobspool("--root", str(root), "migrate", "--to", pg_url, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["diverged"] == 0
    with make_spool(root) as spool:
        for name in ("both", "pruned"):
            spool.requeue(name)  # the source moves again
    third = json.loads(run_jobspool("--root", str(root), "migrate", "--to", pg_url,
                                    "--json").stdout)
    assert sorted(third["diverged_ids"]) == ["both", "pruned"]
    assert third["updated"] == 0 and third["copied"] == 0
    with make_spool(pg_url) as target:
        both = target.get("both")
        assert (both.state, both.last_error) == (JobState.RETRYABLE, "target's try")
        assert "pruned" not in {j.id for j in target.jobs()}


def test_the_token_sequence_is_raised_before_the_first_job_is_copied(
        tmp_path: Path, pg_url: str) -> None:
    """A copy cut off midway (Ctrl-C, a kill) left the sequence at 1 until its last chunk:
    workers serving the database drew tokens below those the file spool had issued."""
    import pytest

    from jobspool.pg.migrate import copy_jobs

    def cut_off() -> Iterator[Job]:
        raise KeyboardInterrupt
        yield  # a generator

    with make_spool(pg_url) as target:
        with pytest.raises(KeyboardInterrupt):
            copy_jobs(cut_off(), target, source_fence=5_000)  # type: ignore[arg-type]
        target.enqueue("k", 1)
        (lease,) = target.claim()
        assert lease.token > 5_000


def test_the_target_is_shown_without_a_password_given_as_a_query_parameter(
        tmp_path: Path, pg_url: str) -> None:
    make_spool(tmp_path / "s").close()
    url = pg_url + ("&" if "?" in pg_url else "?") + "password=hunter2&application_name=a@b"
    out = run_jobspool("migrate", "--to", url, root=tmp_path / "s")
    assert out.code == 0, out.err
    assert "hunter2" not in out.out + out.err
    assert "copied 0 job(s) to postgresql://" in out.out


def test_a_ready_job_written_by_a_clock_ahead_is_claimable_at_once_after_the_move(
        tmp_path: Path, pg_url: str) -> None:
    """Ready is due on a file spool whatever its run_at; the database claims only what its
    clock reached, so a job from a producer whose clock ran ahead waited that long there."""
    ahead = make_spool(tmp_path / "s", clock=lambda: time.time() + 3 * 86400)
    ahead.enqueue("k", 1, job_id="ahead")
    ahead.close()
    out = run_jobspool("migrate", "--to", pg_url, root=tmp_path / "s")
    assert out.code == 0, out.err
    with make_spool(pg_url) as target:
        (lease,) = target.claim()
        assert lease.job_id == "ahead"
