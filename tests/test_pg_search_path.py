"""The schema a PostgreSQL spool works in is the one that holds its tables."""

from __future__ import annotations

import logging

import psycopg
import pytest

from tests.pgserver import PgServer, drop_schema, new_schema, with_search_path
from tests.spools import make_spool


def test_a_search_path_that_finds_the_tables_past_its_first_schema_names_the_queue(
        pg_server: PgServer, pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Found with the unreadable rows: `search_path=q1,<tables' schema>` used the tables of
    the second schema silently, and named its NOTIFY channel after the first, so its
    wakeups never reached processes whose path names the tables' schema alone."""
    with make_spool(pg_url) as direct:
        job = direct.enqueue("work", {}, job_id="w1")
        channel = direct.channel
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
    assert row is not None
    tables_schema = row[0]
    first, _ = new_schema(pg_server.url)
    try:
        both = with_search_path(pg_server.url, f"{first},{tables_schema}")
        with caplog.at_level(logging.WARNING, logger="jobspool.pg"), make_spool(both) as through:
            assert through.get(job.id).id == "w1"  # the same queue
            assert through.channel == channel
        warned = [r.getMessage() for r in caplog.records if "search_path" in r.getMessage()]
        assert len(warned) == 1
        assert repr(tables_schema) in warned[0] and repr(first) in warned[0]
    finally:
        drop_schema(pg_server.url, first)
