"""The PostgreSQL store's connection pool (jobspool/pg/pool.py): bounded, LIFO, self-healing.

Against the real server of the test session: a checkout never exceeds the pool's size,
the connection given back last goes out first (its statements are prepared), a broken
one is dropped on return, a waiting thread gets the next one given back, and a wait
past its timeout ends in `PoolExhausted` without leaking a slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobspool.pg.pool import Pool, PoolExhausted
from jobspool.queue.states import JobState


@pytest.fixture
def make_pool(pg_url: str) -> Iterator[Callable[..., Pool]]:
    """Pools on the test's schema (any URL given instead), all closed at teardown."""
    made: list[Pool] = []

    def make(size: int, url: str = pg_url) -> Pool:
        made.append(Pool(url, size))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


def test_the_pool_is_lifo_and_bounded(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(2)
    a = pool.take(1.0)
    b = pool.take(1.0)
    assert a is not b
    with pytest.raises(PoolExhausted, match=r"no free connection within 0\.05s"):
        pool.take(0.05)
    pool.give(a)
    pool.give(b)
    assert pool.take(1.0) is b  # the one given back last: warmest
    assert pool.take(1.0) is a
    pool.give(a)
    pool.give(b)


def test_a_broken_connection_is_dropped_and_its_slot_freed(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(1)
    a = pool.take(1.0)
    a.close()  # what a killed backend or a restarted server leaves
    pool.give(a)
    b = pool.take(1.0)  # the slot came back: a fresh connection, not the dead one
    assert b is not a and not b.closed
    assert b.execute("SELECT 1").fetchone() == (1,)
    pool.give(b)


def test_a_connection_left_in_a_transaction_is_not_reused(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(1)
    a = pool.take(1.0)
    a.execute("BEGIN")
    pool.give(a)
    b = pool.take(1.0)
    assert b is not a and a.closed
    pool.give(b)


def test_a_waiting_thread_gets_the_connection_given_back(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(1)
    held = pool.take(1.0)
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(pool.take(10.0)))
    waiting.start()
    pool.give(held)
    waiting.join(10.0)
    assert got == [held]
    pool.give(held)


def test_a_failed_connect_gives_its_slot_back(
        make_pool: Callable[..., Pool], pg_url: str) -> None:
    bad = pg_url.replace("://postgres@", "://nobody_here@", 1)
    assert bad != pg_url
    pool = make_pool(1, bad)
    for _ in range(3):  # each failure frees its slot: never PoolExhausted
        with pytest.raises(Exception, match="nobody_here") as info:
            pool.take(0.05)
        assert not isinstance(info.value, PoolExhausted)


def test_a_claim_after_many_settles_does_not_revisit_their_leases(pg_url: str) -> None:
    """A claim looks for expired leases through the `leased` partial index. Its entries
    for jobs settled since the last vacuum are dead; planned as a bitmap scan, every claim
    visited their heap pages again (a third of a claim's time after 5,000 jobs). The
    pool's connections plan it as an index scan, which marks each dead entry once."""
    import secrets

    from jobspool import Spool
    from jobspool.pg import sql

    with Spool(pg_url) as spool:
        spool.enqueue_many("k", [{"i": i} for i in range(400)])
        for _ in range(6):
            leases = spool.claim(kinds="k", limit=50, lease_seconds=60)
            spool.complete_many([(lease, None) for lease in leases])
        params = {"now": None, "kind": "k", "kinds": ["k"], "limit": 50, "owner": "t",
                  "max_rescues": spool.max_rescues, "lease": 60.0, "started": None,
                  "proc": secrets.token_hex(8), "exclude": []}

        def plan(conn: Any) -> str:
            conn.execute("BEGIN")
            try:
                rows = conn.execute("EXPLAIN " + sql.claim_sql(["k"], 50), params).fetchall()
            finally:
                conn.execute("ROLLBACK")
            return "\n".join(r[0] for r in rows)

        text = spool.db.run(plan, what="plan")
    assert "jobspool_jobs_leased" in text  # the expired-lease half of the claim, planned
    assert "Bitmap" not in text, text


def test_pooled_connections_plan_each_states_listing_on_that_states_index(pg_url: str) -> None:
    """Pooled connections plan prepared statements generically (`force_generic_plan`), so a
    statement that bound its state as a parameter could use no state's partial index; the
    listing of one state, planned as the pool plans it, scans that state's index."""
    from jobspool import Spool
    from jobspool.pg import admin

    with Spool(pg_url) as spool:
        spool.enqueue_many("k", [{"i": i} for i in range(3000)])
        for _ in range(58):
            leases = spool.claim(kinds="k", limit=50, lease_seconds=60)
            spool.complete_many([(lease, None) for lease in leases])
        spool.claim(kinds="k", limit=40, lease_seconds=60)

        def plan(conn: Any) -> tuple[str, str]:
            mode = conn.execute("SHOW plan_cache_mode").fetchone()[0]
            conn.execute("ANALYZE jobspool_jobs")
            sql = admin._PAGE[JobState.LEASED].replace("%s", "$1", 1).replace(
                "%s", "$2", 1).replace("%s", "$3", 1)
            conn.execute(f"PREPARE leased_page(text, text, text) AS {sql}")
            try:
                rows = conn.execute("EXPLAIN EXECUTE leased_page('', NULL, NULL)").fetchall()
            finally:
                conn.execute("DEALLOCATE leased_page")
            return mode, "\n".join(r[0] for r in rows)

        mode, text = spool.db.run(plan, what="plan")
        assert mode == "force_generic_plan"
        assert "jobspool_jobs_leased" in text, text
        leased = [j.id for j in spool.jobs(state="leased")]
        assert len(leased) == 40 and leased == sorted(leased)
