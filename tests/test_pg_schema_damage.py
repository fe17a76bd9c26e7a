"""A schema damaged by hand under a version table that says all is there (found by an
operator-slips probe): `health` and `fsck` said ok while every claim failed, and `init`
said "already initialized" or failed on the very table it should have made. Now `fsck`
names what is missing, opening names `init`, and `init` makes again what it can."""

from __future__ import annotations

import psycopg
import pytest

from jobspool import JobState
from tests.cli_harness import run_jobspool
from tests.spools import make_spool

pytestmark = pytest.mark.slow


def _sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_init_makes_again_what_was_dropped_and_fsck_names_it_until_then(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="kept")
        (lease,) = spool.claim(limit=1, owner="w")
    _sql(pg_url, "DROP INDEX jobspool_jobs_due_kind", "DROP TABLE jobspool_schedule_marks",
         "ALTER TABLE jobspool_jobs DROP COLUMN started")
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.code != 0 and "Traceback" not in fsck.stderr, fsck.stderr
    said = fsck.stdout + fsck.stderr
    for missing in ("jobspool_jobs_due_kind is missing", "jobspool_schedule_marks is missing",
                    "column jobspool_jobs.started is missing"):
        assert missing in said, said

    _sql(pg_url, "DROP TABLE jobspool_settings")
    out = run_jobspool("health", root=pg_url)
    assert out.code == 2 and "`jobspool init`" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr

    out = run_jobspool("init", root=pg_url)
    assert out.code == 0, out.stderr
    assert "jobspool_settings is missing" in out.stderr and "made again" in out.stderr
    assert run_jobspool("fsck", root=pg_url).code == 0
    with make_spool(pg_url) as spool:
        assert spool.get("kept").state is JobState.LEASED  # the rows stayed
        spool.complete(lease, result="done")
        spool.enqueue("k", 2, job_id="next")
        (fresh,) = spool.claim(limit=1, owner="w", kinds=["k"])
        assert fresh.token > lease.token


def test_a_lost_primary_key_is_named_not_remade(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="one")
    _sql(pg_url, "ALTER TABLE jobspool_jobs DROP CONSTRAINT jobspool_jobs_pkey",
         "INSERT INTO jobspool_jobs SELECT * FROM jobspool_jobs WHERE id = 'one'")
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.code != 0 and "no primary key" in fsck.stdout + fsck.stderr
    out = run_jobspool("init", root=pg_url)
    assert out.code == 0 and "ADD PRIMARY KEY" in out.stderr, out.stderr
    assert run_jobspool("fsck", root=pg_url).code != 0  # still named: a person decides


def test_init_adds_dropped_columns_back_and_a_lease_they_held_is_lost(pg_url: str) -> None:
    """`init` said "made again" for a dropped column and made nothing (its CREATE TABLE IF
    NOT EXISTS met the table), `fsck` and `health` failed on the column instead of naming
    it, and every worker crash-looped on each claim (an operator-slips probe)."""
    from jobspool.errors import LeaseLost

    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="waiting", priority=5)
        spool.enqueue("k", 2, job_id="held")
        (lease,) = spool.claim(limit=1, owner="w", kinds=["k"])
        assert lease.job_id == "held"
    _sql(pg_url, *(f"ALTER TABLE jobspool_jobs DROP COLUMN {c}"
                   for c in ("rescues", "traceback", "owner", "run_at", "priority")))
    fsck = run_jobspool("fsck", root=pg_url)
    said = fsck.stdout + fsck.stderr
    assert fsck.code != 0 and "Traceback" not in said and "does not exist" not in said, said
    for column in ("rescues", "traceback", "owner", "run_at", "priority"):
        assert f"column jobspool_jobs.{column} is missing" in said, said
    health = run_jobspool("health", root=pg_url)
    assert health.code != 0 and "schema" in health.stdout + health.stderr, health.stderr
    assert "does not exist" not in health.stdout + health.stderr

    out = run_jobspool("init", root=pg_url)
    assert out.code == 0 and "made again" in out.stderr, out.stderr
    assert run_jobspool("init", root=pg_url).stderr.count("made again") == 0  # nothing left
    assert run_jobspool("fsck", root=pg_url).code == 0
    with make_spool(pg_url) as spool:
        held = spool.get("held")
        assert held.state is JobState.RETRYABLE and "dropped" in (held.last_error or "")
        with pytest.raises(LeaseLost):
            spool.complete(lease, result="late")
        taken = spool.claim(limit=5, owner="w2", kinds=["k"])
        assert sorted(x.job_id for x in taken) == ["held", "waiting"]
        for x in taken:
            spool.complete(x, result="done")
        assert spool.get("waiting").state is JobState.COMPLETED


@pytest.mark.parametrize("column", ["kind", "state"])
def test_a_dropped_kind_or_state_is_named_and_left_to_a_backup(pg_url: str,
                                                               column: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="one")
    _sql(pg_url, f"ALTER TABLE jobspool_jobs DROP COLUMN {column}")
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.code != 0 and "restore jobspool_jobs from a backup" in fsck.stdout + fsck.stderr
    out = run_jobspool("init", root=pg_url)
    assert out.code == 2 and "cannot be made again" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_a_column_retyped_by_hand_is_named_by_fsck_health_and_init(pg_url: str) -> None:
    """`payload` turned jsonb by hand: a NUL in a string was refused and a payload's keys
    reordered, while `fsck` said the spool was consistent (an operator-slips probe)."""
    with make_spool(pg_url) as spool:
        spool.enqueue("k", {"b": 1, "a": 2}, job_id="one")
    _sql(pg_url, "ALTER TABLE jobspool_jobs ALTER COLUMN payload TYPE jsonb")
    fsck = run_jobspool("fsck", root=pg_url)
    said = fsck.stdout + fsck.stderr
    assert fsck.code != 0 and "jobspool_jobs.payload has type jsonb, not json" in said, said
    health = run_jobspool("health", root=pg_url)
    assert health.code != 0 and "payload has type jsonb" in health.stdout + health.stderr
    out = run_jobspool("init", root=pg_url)
    assert "payload has type jsonb" in out.stderr and "made again" not in out.stderr, out.stderr
    _sql(pg_url, "ALTER TABLE jobspool_jobs ALTER COLUMN payload TYPE json")
    assert run_jobspool("fsck", root=pg_url).code == 0


def test_constraints_and_nullability_changed_by_hand_are_named_and_made_again(
        pg_url: str) -> None:
    """A column dropped and re-added by hand with its type left the lease check gone and a
    leased row with no token (`fsck` said consistent); `started` re-added NOT NULL failed
    every enqueue while `health` said ok; a constraint left under the repair's own name
    made `init` fail for ever; `owner` dropped left leases no heartbeat could read."""
    from jobspool.errors import LeaseLost

    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1, job_id="held")
        (lease,) = spool.claim(limit=1, owner="w", kinds=["k"])
    _sql(pg_url, "ALTER TABLE jobspool_jobs DROP COLUMN token",
         "ALTER TABLE jobspool_jobs ADD COLUMN token bigint",
         "ALTER TABLE jobspool_jobs ADD CONSTRAINT jobspool_jobs_lease_check CHECK (true)",
         "ALTER TABLE jobspool_jobs DROP COLUMN started",
         "ALTER TABLE jobspool_jobs ADD COLUMN started boolean NOT NULL DEFAULT false",
         "ALTER TABLE jobspool_jobs ALTER COLUMN started DROP DEFAULT")
    fsck = run_jobspool("fsck", root=pg_url)
    said = fsck.stdout + fsck.stderr
    assert fsck.code != 0 and "the lease check of jobspool_jobs is missing" in said, said
    assert "jobspool_jobs.started is NOT NULL" in said, said
    assert run_jobspool("health", root=pg_url).code != 0
    out = run_jobspool("init", root=pg_url)
    assert out.code == 0 and "made again" in out.stderr, out.stderr
    assert run_jobspool("fsck", root=pg_url).code == 0
    with make_spool(pg_url) as spool:
        held = spool.get("held")
        assert held.state is JobState.RETRYABLE, held
        with pytest.raises(LeaseLost):
            spool.complete(lease, result="late")
        spool.enqueue("k", 2, job_id="new")  # failed on the NOT NULL before
        assert sorted(x.job_id for x in spool.claim(limit=5, kinds=["k"])) == ["held", "new"]


def test_a_retyped_token_is_named_not_failed_on(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1)
    _sql(pg_url, "ALTER TABLE jobspool_jobs ALTER COLUMN token TYPE text")
    for command in ("fsck", "health"):
        out = run_jobspool(command, root=pg_url)
        said = out.stdout + out.stderr
        assert out.code != 0 and "jobspool_jobs.token has type text, not bigint" in said, said
        assert "COALESCE" not in said
