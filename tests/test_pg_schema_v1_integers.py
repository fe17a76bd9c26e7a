"""A database whose jobs table was made with integer counters (v1's text before it said
bigint, changed in place) gets bigint ones at the next upgrade: after "upgraded from 1 to
4", `--priority 3000000000` was refused ("integer out of range") while a new database
took it."""

from __future__ import annotations

import psycopg

from jobspool.pg.schema import SCHEMA_VERSION
from tests.cli_harness import run_jobspool
from tests.spools import make_spool


def test_integer_counters_of_an_early_database_become_bigint(pg_url: str) -> None:
    make_spool(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for col in ("priority", "attempts", "max_attempts", "revision", "rescues"):
            conn.execute(f"ALTER TABLE jobspool_jobs ALTER COLUMN {col} TYPE integer")
        conn.execute("DELETE FROM jobspool_schema WHERE version = %s", (SCHEMA_VERSION,))
    init = run_jobspool("--root", pg_url, "init")
    assert init.returncode == 0 and "upgraded" in init.stderr, init.stderr
    done = run_jobspool("--root", pg_url, "enqueue", "k", "{}", "--priority", "3000000000")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(pg_url) as conn:
        kinds = {r[0]: r[1] for r in conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE "
            "table_schema = current_schema() AND table_name = 'jobspool_jobs'").fetchall()}
    assert {kinds[c] for c in ("priority", "attempts", "max_attempts", "revision",
                               "rescues")} == {"bigint"}
