"""PostgreSQL `health` on a database that takes no writes: it said `ok` (exit 0) while
`enqueue` and every worker's claim failed ("cannot execute UPDATE in a read-only
transaction")."""

from __future__ import annotations

import json

import psycopg

from tests.cli_harness import run_jobspool
from tests.spools import make_spool


def test_health_is_degraded_on_a_read_only_database(pg_url: str) -> None:
    make_spool(pg_url).close()
    ok = run_jobspool("--root", pg_url, "health", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with psycopg.connect(pg_url, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
    try:
        bad = run_jobspool("--root", pg_url, "health", "--json")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        doc = json.loads(bad.stdout)
        assert "database_read_only" in [r["code"] for r in doc["reasons"]], doc
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
