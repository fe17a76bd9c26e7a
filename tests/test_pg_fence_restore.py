"""The token sequence lost (a dump of the tables restored without it): commands say so in
one line, and `jobspool init` (or any open that may create) recreates it above every token
the jobs hold, so that no token is issued twice and a stale lease stays fenced."""

from __future__ import annotations

import psycopg
import pytest

from tests.cli_harness import run_jobspool
from tests.pgserver import PgServer, drop_schema, new_schema, with_search_path
from tests.spools import make_spool

pytestmark = pytest.mark.slow

GONE = "the token sequence jobspool_fence is missing"


def _drop_sequence(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SEQUENCE jobspool_fence")


def test_a_lost_sequence_is_named_in_one_line_then_init_recreates_it_above_every_token(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue_many("k", range(3))
        leases = spool.claim(limit=3, owner="old")
        held = max(lease.token for lease in leases)
    _drop_sequence(pg_url)

    for args in (("health",), ("run-until-idle", "--app", "tests.apps.ledger:app")):
        out = run_jobspool(*args, root=pg_url)
        assert out.code != 0, args
        assert GONE in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
    out = run_jobspool("fsck", root=pg_url)  # a problem it lists, with the rest it checks
    assert out.code == 2 and "Traceback" not in out.stderr, out.stderr
    assert "jobspool_fence is missing; `jobspool init` makes it again" in out.stdout
    assert run_jobspool("list", root=pg_url).code == 0  # reading the jobs needs no token

    out = run_jobspool("init", root=pg_url)
    assert out.code == 0, out.stderr
    assert "jobspool_fence is missing" in out.stderr and "starts above every token" in out.stderr
    with make_spool(pg_url) as spool:
        assert spool.fence_value() > held
        spool.complete(leases[0], result="held on")  # a live lease is still the job's
        spool.enqueue("k", "after")
        (fresh,) = spool.claim(limit=1, owner="new", kinds=["k"])
        assert fresh.token > held
    assert run_jobspool("health", root=pg_url).code in (0, 1)  # no error: leases expire later
    assert run_jobspool("fsck", root=pg_url).code == 0


def test_a_writing_open_that_may_create_recreates_a_lost_sequence(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", 1)
        (lease,) = spool.claim(limit=1, owner="w")
    _drop_sequence(pg_url)
    with make_spool(pg_url) as spool:  # create=True is the default, as for a file spool
        assert spool.fence_value() > lease.token
        spool.enqueue("k", 2)
        (nxt,) = spool.claim(limit=1, owner="w", kinds=["k"])
        assert nxt.token > lease.token


def test_the_sequence_is_looked_up_in_the_queues_own_schema(pg_server: PgServer) -> None:
    """With `search_path=q1,q2` and a queue in each, q1's sequence dropped was looked up
    by name alone and found in q2: init said all was well, and q1's claims drew q2's
    tokens, below those q1's rows held (a regression probe)."""
    q1, url1 = new_schema(pg_server.url)
    q2, url2 = new_schema(pg_server.url)
    both = with_search_path(pg_server.url, f"{q1},{q2}")
    try:
        for url in (url1, url2):
            make_spool(url).close()
        with psycopg.connect(url1, autocommit=True) as conn:
            conn.execute("SELECT setval('jobspool_fence', 1000)")
        with make_spool(both) as spool:
            spool.enqueue("k", 1)
            (lease,) = spool.claim(limit=1, owner="w")
        assert lease.token == 1001
        _drop_sequence(url1)
        out = run_jobspool("init", root=both)
        assert out.code == 0 and "jobspool_fence is missing" in out.stderr, out.stderr
        with make_spool(both) as spool:
            spool.enqueue("k", 2)
            (fresh,) = spool.claim(limit=1, owner="w", kinds=["k"])
            assert fresh.token > lease.token
        assert run_jobspool("fsck", root=both).code == 0
    finally:
        drop_schema(pg_server.url, q1)
        drop_schema(pg_server.url, q2)
