"""Read access alone (DESIGN §9: `stats`, `list`, `show`, `health`, `fsck` need no more) on
PostgreSQL: a role that may only SELECT reads the queue, and writing commands refuse with one
line instead of a traceback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import orjson
import psycopg
import pytest
from psycopg import sql

from tests.cli_harness import run_jobspool
from tests.pgserver import PgServer
from tests.spools import make_spool

pytestmark = pytest.mark.slow


def _role_url(pg_server: PgServer, pg_url: str, grants: tuple[str, str]) -> Iterator[str]:
    """`pg_url` as a new role holding USAGE on the schema and `grants` = (on every table,
    on every sequence); dropped afterwards."""
    with make_spool(pg_url) as spool:
        spool.enqueue("note", {"v": 1}, job_id="j")
    role = f"role_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        ident, who = sql.Identifier(schema[0]), sql.Identifier(role)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(who))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident, who))
        conn.execute(sql.SQL(f"GRANT {grants[0]} ON ALL TABLES IN SCHEMA {{}} TO {{}}").format(
            ident, who))
        if grants[1]:
            conn.execute(sql.SQL(f"GRANT {grants[1]} ON ALL SEQUENCES IN SCHEMA {{}} TO {{}}"
                                 ).format(ident, who))
    yield pg_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def reader_url(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    """`pg_url` as a role that may read the store's tables and nothing more."""
    yield from _role_url(pg_server, pg_url, ("SELECT", "SELECT"))


@pytest.fixture
def table_reader_url(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    """`pg_url` as a role granted SELECT on the tables only (not on the fence sequence)."""
    yield from _role_url(pg_server, pg_url, ("SELECT", ""))


@pytest.fixture
def writer_url(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    """`pg_url` as the usual application role: it reads and writes the tables and draws
    tokens, but may not create anything in the schema."""
    yield from _role_url(pg_server, pg_url, ("SELECT, INSERT, UPDATE, DELETE",
                                             "USAGE, SELECT, UPDATE"))


def test_an_application_role_without_create_runs_the_queue(writer_url: str) -> None:
    """An up-to-date schema is opened without DDL: such a role enqueues, works and
    recovers (every open ran CREATE TABLE IF NOT EXISTS and was refused)."""
    for args in (("enqueue", "work", "{}"), ("cancel", "j"), ("recover",),
                 ("run-until-idle", "--app", "tests.apps.simple:app")):
        out = run_jobspool(*args, root=writer_url)
        assert out.returncode == 0, (args, out.stderr)
    with make_spool(writer_url, create=False) as spool:
        counts = spool.stats().counts
    assert (counts["canceled"], counts["ready"]) == (1, 0)


@pytest.mark.parametrize("args", [("stats", "--json"), ("list", "--json"), ("show", "j", "--json"),
                                  ("fsck", "--json")], ids=lambda a: a[0])
def test_reading_commands_work_with_select_alone(reader_url: str, args: tuple[str, ...]) -> None:
    out = run_jobspool(*args, root=reader_url)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    doc = orjson.loads(out.stdout)
    if args[0] == "stats":
        assert doc["counts"]["ready"] == 1
    elif args[0] == "list":
        assert [j["id"] for j in doc] == ["j"]
    elif args[0] == "show":
        assert doc["payload"] == {"v": 1}


@pytest.mark.parametrize("args", [("enqueue", "note", "{}"), ("cancel", "j"),
                                  ("run-until-idle", "--app", "tests.apps.simple:app")],
                         ids=lambda a: a[0])
def test_writing_commands_without_write_access_fail_in_one_line(reader_url: str,
                                                               args: tuple[str, ...]) -> None:
    out = run_jobspool(*args, root=reader_url)
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error:"), out.stderr
    with make_spool(reader_url, read_only=True) as spool:
        assert spool.get("j").state.value == "ready"  # nothing changed


def test_a_role_missing_its_grants_is_told_which_not_to_run_init(
        pg_server: PgServer, pg_url: str) -> None:
    # Found in a PostgreSQL pass: without USAGE on the schema the advice was "holds no
    # jobspool schema; run jobspool init"; with USAGE but no SELECT, "creating or upgrading
    # the schema needs a role that may create tables". The schema was current both times.
    with make_spool(pg_url) as spool:
        spool.enqueue("note", job_id="j")
    role = f"role_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    url = pg_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    try:
        no_usage = run_jobspool("stats", root=url)
        assert no_usage.code == 2 and "may not use schema" in no_usage.err, no_usage.err
        assert "run `jobspool init" not in no_usage.err
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema[0]), sql.Identifier(role)))
        no_select = run_jobspool("stats", root=url)
        assert no_select.code == 2 and "needs SELECT" in no_select.err, no_select.err
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("args", [("stats", "--json"), ("fsck", "--json"), ("health", "--json")],
                         ids=lambda a: a[0])
def test_reading_commands_work_with_select_on_the_tables_alone(
        table_reader_url: str, args: tuple[str, ...]) -> None:
    """Reading the fence needed SELECT on its sequence too: stats, fsck and health failed
    ("refused reading the fence: permission denied for sequence jobspool_fence")."""
    out = run_jobspool(*args, root=table_reader_url)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    if args[0] == "stats":
        assert doc["counts"]["ready"] == 1 and doc["fence"] == 0
