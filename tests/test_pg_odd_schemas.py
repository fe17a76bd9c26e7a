"""Schemas an operator may name or damage in ways jobspool's own never are (found by an
operator-slips probe): a long non-ASCII name, a name holding '"', and a row put in a state
that is none of jobspool's past a dropped CHECK constraint."""

from __future__ import annotations

import uuid
from pathlib import Path
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from jobspool import JobState
from tests.cli_harness import run_jobspool
from tests.pgserver import PgServer, drop_schema, with_search_path
from tests.spools import make_spool

pytestmark = pytest.mark.slow


@pytest.fixture
def schema_url(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param + uuid.uuid4().hex[:4]
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    # The search_path value quoted as an identifier: it holds '"' or non-ASCII letters.
    quoted = '"' + name.replace('"', '""') + '"'
    yield with_search_path(pg_server.url, quoted)
    drop_schema(pg_server.url, name)


@pytest.mark.parametrize("schema_url", ["Очередьзаданийдлявсехмашин", 'we"ird'],
                         indirect=True)
def test_a_schema_with_an_unusual_name_enqueues_and_wakes_an_idle_worker(
        schema_url: str) -> None:
    with make_spool(schema_url) as spool:
        channel = spool.channel  # type: ignore[attr-defined]
        assert len(channel.encode()) <= 63
        watcher = spool.arrival_watcher()  # type: ignore[attr-defined]
        try:
            assert watcher.conn is not None, "LISTEN failed: idle workers would only poll"
            watcher.wait(0.5)  # the first wait reports an arrival (subscribed now)
            with make_spool(schema_url) as producer:
                producer.enqueue("k", 1, job_id="j")  # "channel name too long" before
            assert watcher.wait(10.0)
        finally:
            watcher.close()
        assert spool.get("j").state is JobState.READY


def test_a_row_in_an_unknown_state_is_named_not_a_traceback(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue_many("k", range(3))
        spool.enqueue("k", "odd", job_id="odd")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobspool_jobs DROP CONSTRAINT jobspool_jobs_state_check")
        conn.execute("UPDATE jobspool_jobs SET state = 'bogus' WHERE id = 'odd'")
    for args in (("stats",), ("stats", "--json"), ("health",)):
        out = run_jobspool(*args, root=pg_url)
        assert "Traceback" not in out.stderr and out.code in (0, 1, 2), (args, out.stderr)
        assert "unknown state 'bogus'" in out.stderr, (args, out.stderr)
    out = run_jobspool("stats", "--json", root=pg_url)
    assert '"ready": 3' in out.stdout.replace("\n", " ").replace("  ", " ") or \
        '"ready":3' in out.stdout, out.stdout
    fsck = run_jobspool("fsck", root=pg_url)
    assert fsck.code != 0 and "odd" in fsck.stdout + fsck.stderr


def test_a_search_path_whose_case_was_folded_names_the_schema_that_exists(
        pg_server: PgServer) -> None:
    name = f"MyQueue{uuid.uuid4().hex[:4]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        out = run_jobspool("init", root=with_search_path(pg_server.url, name))
        assert out.code != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        # It said "may not use schema 'MyQueue...'; grant it", to a superuser.
        assert "grant" not in out.stderr and f"schema {name!r} does" in out.stderr, out.stderr
        assert run_jobspool("init", root=with_search_path(pg_server.url, f'"{name}"')).code == 0
    finally:
        drop_schema(pg_server.url, name)


def test_migrate_as_a_role_that_may_not_create_its_books_says_so(
        pg_server: PgServer, pg_url: str, tmp_path: Path) -> None:
    from tests.test_pg_readonly import _role_url

    source = tmp_path / "spool"
    with make_spool(source) as spool:
        spool.enqueue("k", 1)
    for url in _role_url(pg_server, pg_url, ("SELECT, INSERT, UPDATE, DELETE", "USAGE, SELECT")):
        out = run_jobspool("migrate", "--to", url, root=source)
        assert out.code != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "jobspool_migrated" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_an_empty_search_path_says_it_names_no_schema(pg_server: PgServer) -> None:
    # It blamed permissions on public ("may not use schema 'public'; grant it"), to a
    # superuser: an empty path was taken for the default one.
    for empty in ("", '""'):  # `SET search_path = ''` shows as ""
        out = run_jobspool("init", root=with_search_path(pg_server.url, empty))
        assert out.code != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "grant" not in out.stderr and "search_path is empty" in out.stderr, out.stderr
