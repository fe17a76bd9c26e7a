"""A job row edited by hand into something jobspool never writes (JSON its parser refuses,
a NaN time, a negative time limit) costs that job alone: a claim dead-letters it naming
why and runs its batch mates, listings skip it with a warning, `show` names it, and fsck
reports it. Before, the claim committed and then failed decoding the batch: every lease
of it was lost in the process, and the same row came back in every next batch."""

from __future__ import annotations

import logging

import orjson
import psycopg
import pytest

from jobspool import Worker
from jobspool.errors import UnreadableJob
from jobspool.queue.states import JobState
from tests.cli_harness import run_jobspool
from tests.spools import make_spool

EDITS = {
    "payload": "UPDATE jobspool_jobs SET payload = '1e999' WHERE id = %s",
    "created_at": "UPDATE jobspool_jobs SET created_at = 'NaN' WHERE id = %s",
    "timeout": "UPDATE jobspool_jobs SET timeout = -1 WHERE id = %s",
    # The claim's own `attempts + 1` made -1 a valid 0 before the row was judged: it ran.
    "attempts": "UPDATE jobspool_jobs SET attempts = -1 WHERE id = %s",
    # At the bigint top the claim's own `+ 1` overflowed: every claim failed, for everyone.
    "attempts_top": "UPDATE jobspool_jobs SET attempts = 9223372036854775807 WHERE id = %s",
    "revision_top": "UPDATE jobspool_jobs SET revision = 9223372036854775807 WHERE id = %s",
}


def _edit(url: str, sql: str, job_id: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(sql, (job_id,)).rowcount == 1


@pytest.mark.parametrize("field", sorted(EDITS))
def test_a_claim_dead_letters_an_unreadable_row_and_runs_its_batch_mates(
        pg_url: str, field: str, caplog: pytest.LogCaptureFixture) -> None:
    ran: list[int] = []
    with make_spool(pg_url) as spool:
        ids = [spool.enqueue("work", {"i": i}, job_id=f"j{i}").id for i in range(6)]
        _edit(pg_url, EDITS[field], "j3")
        worker = Worker(spool, {"work": lambda job, ctx: ran.append(job.payload["i"])},
                        batch_size=10)
        with caplog.at_level(logging.ERROR, logger="jobspool.pg"):
            report = worker.run_until_idle()
        assert sorted(ran) == [0, 1, 2, 4, 5]
        assert report.completed == 5
        assert [spool.get(i).state for i in ids if i != "j3"] == [JobState.COMPLETED] * 5
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT state, last_error, token FROM jobspool_jobs "
                               "WHERE id = 'j3'").fetchone()
        assert row is not None
        assert row[0] == "dead_letter" and row[2] is None
        assert "'j3'" in row[1] and "cannot be read" in row[1]
        assert any("j3" in r.getMessage() for r in caplog.records)
        assert spool.stats().counts["leased"] == 0  # no lease stranded


def test_a_payload_edited_deeper_than_jobspool_writes_is_dead_lettered_alone(
        pg_url: str) -> None:
    """orjson reads 1,024 levels and writes 254: such a payload failed the whole claim
    ('Recursion limit reached'), and `show`/`list --json` of it ended in a traceback. As
    the file store refuses such a file, the claim dead-letters it (its batch mates run)
    and `show` names it in one line."""
    ran: list[str] = []
    with make_spool(pg_url) as spool:
        spool.enqueue("work", 1, job_id="deep")
        spool.enqueue("work", 2, job_id="plain")
        _edit(pg_url, "UPDATE jobspool_jobs SET payload = '" + "[" * 300 + "]" * 300
              + "'::json WHERE id = %s", "deep")
        report = Worker(spool, {"work": lambda job, ctx: ran.append(job.id)},
                        batch_size=10, maintenance=False).run_until_idle()
        assert report.completed == 1 and ran == ["plain"]
        assert spool.stats().counts["leased"] == 0
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT state, last_error FROM jobspool_jobs "
                               "WHERE id = 'deep'").fetchone()
        assert row is not None and row[0] == "dead_letter" and "nested deeper" in row[1]
    shown = run_jobspool("show", "deep", root=pg_url)
    assert shown.code != 0 and "Traceback" not in shown.err
    assert "nested deeper" in shown.err and len(shown.err.strip().splitlines()) == 1
    listed = run_jobspool("list", "--json", root=pg_url)
    assert listed.code == 0 and "Traceback" not in listed.err
    assert [j["id"] for j in orjson.loads(listed.out)] == ["plain"]


def test_listings_skip_an_unreadable_row_and_show_names_it(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with make_spool(pg_url) as spool:
        for i in range(3):
            spool.enqueue("work", {"i": i}, job_id=f"j{i}")
        _edit(pg_url, EDITS["payload"], "j1")
        with caplog.at_level(logging.WARNING, logger="jobspool.pg"):
            listed = [j.id for j in spool.jobs()]
        assert listed == ["j0", "j2"]
        assert any("j1" in r.getMessage() for r in caplog.records)
        with pytest.raises(UnreadableJob, match="'j1'"):
            spool.get("j1")
    shown = run_jobspool("--root", pg_url, "show", "j1")
    assert shown.code != 0
    assert "Traceback" not in shown.err and "'j1'" in shown.err
    assert len(shown.err.strip().splitlines()) == 1
    listing = run_jobspool("--root", pg_url, "list")
    assert listing.code == 0, listing.err
    assert "j0" in listing.out and "j2" in listing.out


def test_fsck_reports_rows_no_reader_can_take_as_jobs(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        for i in range(4):
            spool.enqueue("work", {"i": i}, job_id=f"j{i}")
        assert spool.fsck().ok
        _edit(pg_url, EDITS["timeout"], "j1")
        _edit(pg_url, "UPDATE jobspool_jobs SET run_at = 'Infinity' WHERE id = %s", "j2")
        report = spool.fsck()
    assert not report.ok
    joined = "\n".join(report.problems)
    assert "'j1'" in joined and "timeout" in joined
    assert "'j2'" in joined and "run_at" in joined
    assert "'j0'" not in joined and "'j3'" not in joined



def test_health_is_degraded_by_an_unfinished_row_no_claim_can_take(pg_url: str) -> None:
    """Found by an operator probe: a hand's `run_at = NaN` row is never due, so never
    claimed; fsck named it, but `health` said ok (a file spool's unreadable file is a
    `degraded` reason)."""
    with make_spool(pg_url) as spool:
        spool.enqueue("work", {}, job_id="fine")
        spool.enqueue("work", {}, job_id="never")
        assert "unreadable_files" not in {r.code for r in spool.health().reasons}
        _edit(pg_url, "UPDATE jobspool_jobs SET run_at = 'NaN' WHERE id = %s", "never")
        health = spool.health()
    codes = {r.code: r for r in health.reasons}
    assert "unreadable_files" in codes, health.reasons
    assert "never" in codes["unreadable_files"].message
    assert "fine" not in codes["unreadable_files"].message
    assert health.figures["unreadable_files"] == 1 and health.figures["job_files_read"] == 2
    cli = run_jobspool("health", root=pg_url)
    assert cli.returncode != 0 and "never" in cli.stdout + cli.stderr


def test_fsck_names_a_row_whose_id_no_command_can_name(pg_url: str) -> None:
    """A hand's row `../x` was run by workers, but `show`/`cancel` refuse the id: fsck
    called the table consistent."""
    with make_spool(pg_url) as spool:
        spool.enqueue("work", {}, job_id="x")
    _edit(pg_url, "UPDATE jobspool_jobs SET id = '../x' WHERE id = %s", "x")
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.returncode == 2
    assert "'../x'" in fsck.stdout + fsck.stderr and "naming rules" in fsck.stdout + fsck.stderr


def test_a_row_whose_kind_breaks_the_rules_is_unreadable_as_on_the_file_store(
        pg_url: str) -> None:
    """A hand's `kind = 'a/b'`: `show`, `cancel` and `requeue` acted on it and `health`
    said ok, where the file store's same damage is an unreadable file; fsck said twice
    that no command could name it."""
    with make_spool(pg_url) as spool:
        spool.enqueue("work", {}, job_id="kslash")
        spool.enqueue("work", {}, job_id="fine")
    _edit(pg_url, "UPDATE jobspool_jobs SET kind = 'a/b' WHERE id = %s", "kslash")
    for command in (("show", "kslash"), ("cancel", "kslash")):
        got = run_jobspool(*command, root=pg_url)
        assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
        assert "'a/b'" in got.stderr and "naming rules" in got.stderr
    assert run_jobspool("health", root=pg_url).returncode != 0
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.returncode == 2 and fsck.stdout.count("kslash") == 1, fsck.stdout
    with make_spool(pg_url) as spool:
        assert [j.id for j in spool.jobs()] == ["fine"]


@pytest.mark.parametrize("recover_first", [False, True])
@pytest.mark.parametrize("column", ["rescues", "revision", "attempts"])
def test_an_expired_lease_with_a_count_at_the_bigint_top_fails_no_claim_nor_recover(
        pg_url: str, column: str, recover_first: bool) -> None:
    # A regression probe: the claim's look at expired leases (`rescues + 1`) and the
    # sweep's writes (`revision + 1`, `rescues + 1`) still overflowed: every claim failed
    # for every worker, or `recover` did.
    import time

    with make_spool(pg_url) as spool:
        for i in range(3):
            spool.enqueue("work", {"i": i}, job_id=f"j{i}")
        (lease,) = spool.claim(limit=1, lease_seconds=0.2)
        _edit(pg_url, f"UPDATE jobspool_jobs SET {column} = 9223372036854775807 WHERE id = %s",
              lease.job_id)
        time.sleep(0.3)
        if recover_first:
            spool.recover()  # its sweep of expired leases, before any claim takes it over
        ran: list[str] = []
        report = Worker(spool, {"work": lambda job, ctx: ran.append(job.id)},
                        batch_size=10).run_until_idle()
        assert sorted(ran) == sorted({"j0", "j1", "j2"} - {lease.job_id})
        assert report.completed == 2
        spool.recover()
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT state FROM jobspool_jobs WHERE id = %s",
                               (lease.job_id,)).fetchone()
        # Dead-lettered by the claim that took it, or swept back to wait out its backoff
        # (the claim that takes it then dead-letters it): never leased for good.
        assert row is not None and row[0] in (("retryable", "dead_letter") if recover_first
                                              else ("dead_letter",))
        assert spool.stats().counts["leased"] == 0
