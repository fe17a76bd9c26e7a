"""PostgreSQL: someone else's tables under jobspool's names, and the texts both stores share.

`CREATE TABLE IF NOT EXISTS` keeps a table that is already there. A foreign
`jobspool_schedule_marks` was adopted: `init`, `fsck` and `health` said all was well and
every schedule failed to fire, for ever. A foreign `jobspool_schema` whose version is text
made every command print "invalid literal for int()" and exit 1 (a usage error).
"""

from __future__ import annotations

import psycopg
import pytest

from jobspool import Spool
from jobspool.errors import SpoolError
from tests.cli_harness import run_jobspool
from tests.spools import make_spool

pytestmark = pytest.mark.slow


def _table_exists(url: str, name: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("table, ddl, named", [
    ("jobspool_schedule_marks", "CREATE TABLE jobspool_schedule_marks (a int)",
     "jobspool_schedule_marks has no column name"),
    ("jobspool_schema", "CREATE TABLE jobspool_schema (version text); "
     "INSERT INTO jobspool_schema VALUES ('hello')",
     "jobspool_schema.version is text, not integer"),
    ("jobspool_settings", "CREATE TABLE jobspool_settings (key text, value text)",
     "jobspool_settings.value is text, not jsonb"),
])
def test_init_refuses_a_foreign_table_and_creates_nothing(pg_url: str, table: str, ddl: str,
                                                          named: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(ddl)
    for args in (("init",), ("stats",), ("enqueue", "k", "1")):
        done = run_jobspool(*args, root=pg_url)
        assert done.code == 2, (args, done)
        assert "Traceback" not in done.err and len(done.err.strip().splitlines()) == 1
        # Without a version table of jobspool's, the other commands say "run init"; init
        # (and anything reading a version table) names the table that is in the way.
        if args == ("init",) or table == "jobspool_schema":
            assert named in done.err and "not jobspool's" in done.err, (args, done.err)
        else:
            assert "jobspool init" in done.err, (args, done.err)
    assert not _table_exists(pg_url, "jobspool_jobs")
    with pytest.raises(SpoolError, match="not jobspool's"):
        Spool(pg_url)


def test_a_marks_table_replaced_later_is_reported_by_fsck_and_health(pg_url: str) -> None:
    with make_spool(pg_url):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE jobspool_schedule_marks")
        conn.execute("CREATE TABLE jobspool_schedule_marks (a int)")
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.code == 2 and "jobspool_schedule_marks has no column name" in fsck.out + fsck.err
    health = run_jobspool("health", "--json", root=pg_url)
    assert health.code == 2 and "schema_damaged" in health.out, health
    init = run_jobspool("init", root=pg_url)
    assert init.code == 2 and "not jobspool's" in init.err, init


def test_a_read_only_open_of_a_database_without_the_schema_says_run_init(pg_url: str) -> None:
    with pytest.raises(SpoolError, match="holds no jobspool schema; run `jobspool init"):
        Spool(pg_url, read_only=True)
    assert not _table_exists(pg_url, "jobspool_jobs")


def test_stale_prepared_reads_the_same_on_both_stores(pg_url: str, tmp_path: object) -> None:
    texts = []
    for root in (pg_url, str(tmp_path)):
        with make_spool(root, prepare_grace_seconds=0.0) as spool:
            spool.prepare("k", 1, job_id="p1")
            reason = [r for r in spool.health().reasons if r.code == "stale_prepared"]
            assert len(reason) == 1, root
            texts.append(reason[0].message)
    assert texts[0] == texts[1]
    assert "p1" in texts[0] and "(0 s)" in texts[0]
